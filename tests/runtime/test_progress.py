"""The shared progress line (runtime/progress.py) and the commands that print it: `data shards` and `pack`."""

from __future__ import annotations

import re

from bertforge.cli import main
from bertforge.runtime.progress import Progress, format_duration


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_rate_eta_and_throttling():
    clock, lines = Clock(), []
    p = Progress("job", 100, "rows", lines.append, every_s=5, clock=clock)
    clock.t += 2
    p.update(10)  # 2 s: not yet due
    assert lines == [] and p.rate == 5.0 and p.eta_s == 18.0
    clock.t += 3
    p.update(15, note="extra")  # 5 s, 25 rows: 5 rows/s, 75 left
    assert lines == ["job: 25/100 rows (25%) | 5 rows/s | eta 0m15s | extra"]
    clock.t += 1
    p.update(25)  # 1 s after the last line: quiet
    clock.t += 1
    p.update(50)  # done: the last line always comes
    assert len(lines) == 2 and lines[-1] == "job: 100/100 rows (100%) | 14.3 rows/s | eta 0m00s"
    q = Progress("quick", 3, "shards", lines.append, every_s=5, clock=clock)
    q.update(3)  # finished before any line was due: nothing printed for a loop this short
    assert len(lines) == 2
    assert format_duration(3725) == "1h02m" and format_duration(185) == "3m05s"


def test_data_shards_and_pack_show_rate_and_eta(tiny_corpus, tmp_path, capsys):
    d = str(tmp_path)
    assert main(["data", "docs", "--source", str(tiny_corpus), "--out", f"{d}/docs", "--shards", "1"]) == 0
    assert main(["data", "vocab", "--docs", f"{d}/docs", "--out", f"{d}/vocab", "--vocab-size", "200"]) == 0
    shards = ["--seq-len", "32", "--max-pred", "5", "--shards", "3", "--workers", "1", "--dupe-factor", "1"]
    capsys.readouterr()
    assert main(["data", "shards", "--docs", f"{d}/docs", "--vocab", f"{d}/vocab", "--out", f"{d}/s", *shards]) == 0
    text = capsys.readouterr().out
    eta = r"[\d.,]+ shards/s \| eta \dm\d\ds"
    for i in (1, 2, 3):
        pct = f"{100 * i / 3:.0f}"
        assert re.search(rf"data shards: {i}/3 shards \({pct}%\) \| {eta} \| train_\d\.hdf5: \d+ instances", text)
    assert main(["pack", "--in", f"{d}/s", "--out", f"{d}/p", "--shards", "2"]) == 0
    text = capsys.readouterr().out
    assert re.search(rf"pack: 1/2 shards \(50%\) \| {eta} \| wrote packed_\w+\.hdf5 \(\d+ packs\)", text), text
    assert re.search(rf"pack: 2/2 shards \(100%\) \| {eta}", text), text
