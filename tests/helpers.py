"""Assertions that several test modules share."""

from __future__ import annotations


def one_line(text: str, *parts: object) -> str:
    """The one line of an error message (stderr's `warning: ` lines aside), with no traceback, holding each of
    `parts`; returns it."""
    lines = [x for x in text.strip().splitlines() if not x.startswith("warning: ")]
    assert len(lines) == 1 and "Traceback" not in text, text
    for p in parts:
        assert str(p) in lines[0], (p, lines[0])
    return lines[0]
