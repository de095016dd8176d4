"""Checkpoints: atomic writes (a kill mid-write leaves the previous one loadable), keep-last-K, numeric order."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from bertforge.errors import UserError
from bertforge.train import checkpoint as ckpt


def _writer(value: float):
    def write(path: Path) -> None:
        path.mkdir(parents=True)
        (path / "config.json").write_text(json.dumps({"value": value}))

    return write


def _save(root, step, keep=3, hook=None):
    return ckpt.save_checkpoint(
        root,
        step,
        _writer(step),
        {"w": torch.full((3,), float(step)), "cursor": step},
        {"note": "x"},
        keep_last=keep,
        _before_rename=hook,
    )


def test_numeric_order_and_keep_last(tmp_path):
    for step in (9, 10, 2, 100):
        _save(tmp_path, step, keep=3)
    names = [c.step for c in ckpt.list_checkpoints(tmp_path)]
    assert names == [9, 10, 100]  # step 2 was the oldest numerically and is gone
    latest = ckpt.latest_checkpoint(tmp_path)
    assert latest.step == 100 and latest.meta()["note"] == "x"
    assert torch.equal(latest.load_state()["w"], torch.full((3,), 100.0))
    assert ckpt.find_checkpoint(tmp_path).step == 100
    assert ckpt.find_checkpoint(latest.path).step == 100


def test_crash_between_write_and_rename(tmp_path):
    _save(tmp_path, 5)

    def crash(tmp: Path) -> None:
        assert (tmp / "meta.json").is_file()  # fully written, not yet renamed
        raise RuntimeError("simulated crash")

    with pytest.raises(RuntimeError):
        _save(tmp_path, 10, hook=crash)
    latest = ckpt.latest_checkpoint(tmp_path)
    assert latest.step == 5 and latest.load_state()["cursor"] == 5
    _save(tmp_path, 15)  # the next save clears the stale temporary directory
    assert not list(tmp_path.glob(".*.tmp-*"))


def test_sigkill_during_write(tmp_path):
    """A process SIGKILLed in the middle of writing checkpoint 10 leaves checkpoint 5 as the newest, loadable."""
    _save(tmp_path, 5)
    script = textwrap.dedent(f"""
        import os, sys, time, torch
        from pathlib import Path
        from bertforge.train import checkpoint as ckpt
        def write(path):
            path.mkdir(parents=True)
            (path / "config.json").write_text("{{}}")
            print("writing", flush=True)
            time.sleep(60)            # killed here, mid-write
        ckpt.save_checkpoint({str(tmp_path)!r}, 10, write, {{"w": torch.ones(1000)}}, {{}})
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    latest = ckpt.latest_checkpoint(tmp_path)
    assert latest.step == 5
    assert torch.equal(latest.load_state()["w"], torch.full((3,), 5.0))
    assert list(tmp_path.glob(".step_*.tmp-*"))  # the half-written one is only a hidden temp dir


def test_truncated_state_is_a_user_error(tmp_path):
    c = _save(tmp_path, 3)
    p = c.path / ckpt.STATE_FILE
    p.write_bytes(p.read_bytes()[:20])
    with pytest.raises(UserError, match="delete"):
        c.load_state()


def test_state_loads_without_code(tmp_path):
    """weights_only=True: a state file holding a pickled object is refused, not executed."""
    c = _save(tmp_path, 3)

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    torch.save({"x": Evil()}, c.path / ckpt.STATE_FILE)
    with pytest.raises(UserError):
        c.load_state()


def test_no_checkpoint(tmp_path):
    with pytest.raises(UserError, match="no complete checkpoint"):
        ckpt.find_checkpoint(tmp_path)
