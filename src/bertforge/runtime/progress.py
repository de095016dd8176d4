"""Progress of a long loop as one line: done/total, items per second and an ETA.

    progress = Progress("data shards", total=16, unit="shards", log=print, every_s=0)
    progress.update(1, note="train_3.hdf5: 5120 instances")
    # data shards: 4/16 shards (25%) | 0.52 shards/s | eta 0m23s | train_3.hdf5: 5120 instances

The rate is the mean since the start (done / elapsed), the ETA the rest at that rate. Items a resumed command
finds already done (`update(n, kept=True)`) count toward done but not toward the rate: they took no time here,
and counted they would make the rate too high and the ETA too short. `every_s` throttles the
lines (the last one, at done == total, is always printed once any line was). `data shards`, `pack`,
`finetune` and the metrics logger's step lines share it, so every command words progress the same way.
"""

from __future__ import annotations

import time
from collections.abc import Callable

EVERY_S = 5.0
"""Default seconds between two progress lines of a loop."""


def format_duration(seconds: float) -> str:
    """`1h02m` from an hour up, else `3m05s`."""
    s = int(max(0, seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def format_rate(per_s: float) -> str:
    """Three significant figures, thousands separated: `0.523`, `52.3`, `1,234`."""
    return f"{per_s:,.0f}" if per_s >= 100 else f"{per_s:.3g}"


class Progress:
    """Counts items done against a total and logs a progress line at most every `every_s` seconds."""

    def __init__(
        self,
        label: str,
        total: float,
        unit: str,
        log: Callable[[str], None] = print,
        every_s: float | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.label, self.total, self.unit, self.log, self.clock = label, total, unit, log, clock
        self.every_s = EVERY_S if every_s is None else every_s
        self.done = 0.0
        self.kept = 0.0  # of done, items found already done (a resumed command's): not work of this run
        self.t0 = clock()
        self._last: float | None = None  # when the last line was printed

    @property
    def elapsed_s(self) -> float:
        return self.clock() - self.t0

    @property
    def rate(self) -> float:
        """Items per second since the start (items found already done left out)."""
        el = self.elapsed_s
        return (self.done - self.kept) / el if el > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the mean rate; 0 when done (however fast, or all found already done); None before the
        first item."""
        left = max(0.0, self.total - self.done)
        if not left:
            return 0.0
        rate = self.rate
        return left / rate if rate > 0 else None

    def line(self, note: str = "") -> str:
        pct = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
        eta = self.eta_s
        parts = [
            f"{self.label}: {self.done:g}/{self.total:g} {self.unit}{pct}",
            f"{format_rate(self.rate)} {self.unit}/s",
            f"eta {format_duration(eta) if eta is not None else '?'}",
        ]
        return " | ".join(parts + ([note] if note else []))

    def update(self, n: float = 1, note: str = "", kept: bool = False) -> None:
        """`n` more items done (`kept`: found already done, as a resumed command finds finished shards); logs a
        line when `every_s` has passed since the last one, or at the end."""
        self.done += n
        if kept:
            self.kept += n
        now = self.clock()
        finished = self.done >= self.total
        due = now - (self._last if self._last is not None else self.t0) >= self.every_s
        if due or (finished and self._last is not None):
            self.log(self.line(note))
            self._last = now
