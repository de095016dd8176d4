"""`runtime.io.commit` replaces an existing output in two renames (old away, new in): a process killed between them
leaves only `.NAME.old-PID`, which the next `remove_stale` must put back, not delete."""

from __future__ import annotations

import os
import subprocess
import sys

from bertforge.runtime.io import remove_stale, temp_name


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid  # exited and reaped: no process has it (until the kernel reuses it)


def test_an_old_copy_whose_final_name_is_missing_is_put_back(tmp_path):
    pid = _dead_pid()
    old = tmp_path / f".step_5.old-{pid}"
    old.mkdir()
    (old / "model.safetensors").write_text("weights")
    (tmp_path / f".train_0.old-{pid}.hdf5").write_text("rows")
    assert remove_stale(tmp_path) == 2
    assert (tmp_path / "step_5" / "model.safetensors").read_text() == "weights"
    assert (tmp_path / "train_0.hdf5").read_text() == "rows"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_5", "train_0.hdf5"]


def test_an_old_copy_beside_its_final_name_is_deleted_and_a_live_writers_is_left(tmp_path):
    (tmp_path / "step_5").mkdir()
    stale = tmp_path / f".step_5.old-{_dead_pid()}"
    stale.mkdir()
    live = temp_name(tmp_path / "step_6", "old")  # this process: a writer between its two renames
    live.mkdir()
    assert live.name == f".step_6.old-{os.getpid()}"
    assert remove_stale(tmp_path) == 1
    assert not stale.exists() and live.is_dir() and not (tmp_path / "step_6").exists()
