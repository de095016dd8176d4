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


def test_a_checkpoint_killed_while_being_discarded_is_not_put_back(tmp_path, monkeypatch):
    """`discard` hides a pruned checkpoint before deleting it: killed half-way, what is left is not a complete
    checkpoint, so it must not come back as one (it hides under `.gone`, which remove_stale deletes)."""
    from bertforge.train import checkpoint as ckpt

    step = tmp_path / "step_00000003"
    (step / "model").mkdir(parents=True)
    (step / ckpt.META_FILE).write_text("{}")
    monkeypatch.setattr(ckpt.shutil, "rmtree", lambda *a, **k: None)  # killed before the delete
    ckpt.discard(ckpt.Checkpoint(step, 3))
    assert ckpt.list_checkpoints(tmp_path) == []
    monkeypatch.undo()  # the next save's clean-up deletes again
    assert remove_stale(tmp_path) == 1
    assert list(tmp_path.iterdir()) == []


def test_resume_finds_a_step_left_only_as_commits_old_copy(tmp_path):
    """A save of a step that exists (a re-save at the same step) killed between `commit`'s two renames: the step is
    only `.step_N.old-PID`, complete. --resume must find it (before, it found nothing and started from scratch, and
    the fresh run's first save then put the old step back over it)."""
    from bertforge.train import checkpoint as ckpt

    (tmp_path / "step_00000002").mkdir()
    (tmp_path / "step_00000002" / ckpt.META_FILE).write_text("{}")
    old = tmp_path / f".step_00000004.old-{_dead_pid()}"
    old.mkdir()
    (old / ckpt.META_FILE).write_text("{}")
    assert [(c.step, c.path) for c in ckpt.list_checkpoints(tmp_path)] == [(2, tmp_path / "step_00000002"), (4, old)]
    assert ckpt.latest_checkpoint(tmp_path).path == old
    (tmp_path / "step_00000004").mkdir()  # the step's own name wins over a copy
    (tmp_path / "step_00000004" / ckpt.META_FILE).write_text("{}")
    assert ckpt.latest_checkpoint(tmp_path).path == tmp_path / "step_00000004"
