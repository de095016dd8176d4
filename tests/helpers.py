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


def write_rte(root, n_train: int = 8, n_dev: int = 4):
    """A tiny glue_data under `root` with RTE only (train.tsv and dev.tsv with the real files' header)."""
    from pathlib import Path

    d = Path(root) / "RTE"
    d.mkdir(parents=True)
    rows = ["index\tsentence1\tsentence2\tlabel"]
    rows += [f"{i}\tgood film .\tbad plot .\t{('entailment', 'not_entailment')[i % 2]}" for i in range(n_train)]
    (d / "train.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    (d / "dev.tsv").write_text("\n".join(rows[: n_dev + 1]) + "\n", encoding="utf-8")
    return Path(root)
