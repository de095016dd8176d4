"""Checkpoints: a Hugging Face-format model directory plus the training state, written atomically.

Layout of `<output_dir>/checkpoints/`:

    step_00000200/
        model/               config.json + model.safetensors (+ vocab): `transformers` Auto classes load it
        training_state.pt    optimizer, scheduler step, scaler, RNG states, data cursor (tensors + plain data)
        meta.json            step, phase, sequences and tokens seen, time, the run config — written last

A checkpoint is complete when its directory has its final name: everything is written into a hidden
temporary directory first and renamed into place (rename is atomic on POSIX), so a run killed mid-write
leaves the previous checkpoint as the newest complete one and a stale `.tmp-*` directory that the next save
removes; keep_last's deletions go the other way (renamed out of sight, then removed). Steps are sorted
numerically (step_10 after step_9). The training state is read with `torch.load(weights_only=True)`: a
checkpoint file from elsewhere can hold tensors and plain data, never code.
Nothing here is specific to pre-training: fine-tuning passes its own `write_model` and state.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bertforge.errors import UserError
from bertforge.model.hf_interop import load_weights_only
from bertforge.runtime.io import atomic_dir, read_json_object, remove_stale, temp_name, writable_dir

STEP_DIR = re.compile(r"^step_(\d+)$")
OLD_STEP_DIR = re.compile(r"^\.step_(\d+)\.old-\d+$")  # runtime.io.commit's copy of a step it replaces
STATE_FILE = "training_state.pt"
META_FILE = "meta.json"
MODEL_DIR = "model"

STATE_KEYS = ("optimizer", "scaler", "rng", "train_state")
"""What `bertforge pretrain` saves in training_state.pt (`loop.save`)."""


@dataclass
class Checkpoint:
    path: Path
    step: int

    @property
    def model_dir(self) -> Path:
        return self.path / MODEL_DIR

    @property
    def resume_fix(self) -> str:
        """What to do when this checkpoint of the run cannot be read: --resume then takes the previous one."""
        return f"delete {self.path} to resume from the previous checkpoint"

    def meta(self) -> dict[str, Any]:
        return read_json_object(self.path / META_FILE, self.resume_fix, label="checkpoint ")

    def load_state(
        self, map_location: str | torch.device = "cpu", fix: str | None = None, require: tuple[str, ...] = ()
    ) -> dict[str, Any]:
        """The training state, read without executing code (weights_only=True); a file that cannot be read, or
        that lacks a key of `require` (another tool's, hand-made: `STATE_KEYS` are what `bertforge pretrain`
        writes), is one line with `fix` (default: `resume_fix`), not a KeyError once the weights are loaded."""
        path, fix = self.path / STATE_FILE, fix or self.resume_fix
        state = load_weights_only(path, fix, map_location)
        if missing := [k for k in require if not isinstance(state, dict) or k not in state]:
            raise UserError(f"{path} is not a training state of `bertforge pretrain` (no {', '.join(missing)}); {fix}")
        return state


def list_checkpoints(root: str | Path) -> list[Checkpoint]:
    """Complete checkpoints under `root`, oldest first (numeric step order). A step saved again whose save was
    killed between `commit`'s two renames is there only as its hidden `.old` copy, complete (`discard` hides
    what it deletes under another name): that copy is the step (read where it is; the next save's
    `remove_stale` puts it back), so a --resume does not start from scratch."""
    root = Path(root)
    if not root.is_dir():
        return []
    found: dict[int, Checkpoint] = {}
    for d in sorted(root.iterdir(), key=lambda d: d.name.startswith(".")):  # the step's own name first
        m = STEP_DIR.match(d.name) or OLD_STEP_DIR.match(d.name)
        if m and d.is_dir() and (d / META_FILE).is_file():
            found.setdefault(int(m.group(1)), Checkpoint(d, int(m.group(1))))
    return sorted(found.values(), key=lambda c: c.step)


def latest_checkpoint(root: str | Path) -> Checkpoint | None:
    ckpts = list_checkpoints(root)
    return ckpts[-1] if ckpts else None


def find_checkpoint(path: str | Path) -> Checkpoint:
    """A checkpoint given as its own directory, or the newest one under a run or checkpoints directory."""
    path = Path(path)
    m = STEP_DIR.match(path.name)
    if m and (path / META_FILE).is_file():
        return Checkpoint(path, int(m.group(1)))
    for root in (path, path / "checkpoints"):
        ckpt = latest_checkpoint(root)
        if ckpt is not None:
            return ckpt
    raise UserError(f"no complete checkpoint in {path} (expected step_N/ directories holding {META_FILE})")


def save_checkpoint(
    root: str | Path,
    step: int,
    write_model: Callable[[Path], None],
    state: dict[str, Any],
    meta: dict[str, Any],
    keep_last: int = 3,
    _before_rename: Callable[[Path], None] | None = None,
) -> Checkpoint:
    """Write checkpoint `step` under `root` atomically and keep the newest `keep_last`.

    `write_model(dir)` writes the model directory; `state` goes to training_state.pt (tensors and plain
    data only); `meta` to meta.json. `_before_rename` is a test hook called between writing and renaming.
    """
    root = Path(root)
    if not root.is_dir():  # created and probed, not a bare mkdir: a `checkpoints` symlink to storage not mounted on
        # this node (dangling) raised FileExistsError's traceback after save_every steps; now one line naming it
        writable_dir(root, "train.output_dir")
    remove_stale(root)  # left by a run killed mid-write
    final = root / f"step_{step:08d}"
    with atomic_dir(final) as tmp:  # the same step saved again (a re-run) replaces it
        write_model(tmp / MODEL_DIR)
        with open(tmp / STATE_FILE, "wb") as f:  # a file object: a full disk is OSError(ENOSPC), not a RuntimeError
            torch.save(state, f)
        meta = {"step": step, "time": time.strftime("%Y-%m-%dT%H:%M:%S"), **meta}
        (tmp / META_FILE).write_text(json.dumps(meta, indent=1, default=str), encoding="utf-8")
        if _before_rename is not None:
            _before_rename(tmp)
    for old_ckpt in list_checkpoints(root)[:-keep_last]:
        discard(old_ckpt)
    return Checkpoint(final, step)


def discard(found: Checkpoint) -> None:
    """Delete a checkpoint: renamed to a hidden name first (one atomic step), then removed. Removed in place, a
    kill half-way left a step directory whose meta.json still said complete without the files it describes; the
    hidden rest is what `remove_stale` clears at the next save. Not `.old`: that is `commit`'s copy of a complete
    checkpoint, which `remove_stale` puts back where the step is missing (this one is half deleted)."""
    hidden = temp_name(found.path, "gone")
    try:
        found.path.rename(hidden)
    except OSError:  # gone already, or not ours to rename: nothing listed changes
        return
    shutil.rmtree(hidden, ignore_errors=True)
