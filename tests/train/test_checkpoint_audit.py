"""Checkpoint lifecycle foot-guns found in an audit (train/checkpoint.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from bertforge.errors import UserError
from bertforge.train import checkpoint as ckpt


def _write(path: Path) -> None:
    path.mkdir()


def test_a_checkpoints_link_to_storage_not_mounted_is_one_line(tmp_path):
    """`checkpoints` a symlink to a volume this node has not mounted: the first save raised FileExistsError's
    traceback (mkdir of a dangling link), after save_every steps of training; it is one line naming the path."""
    root = tmp_path / "run" / "checkpoints"
    root.parent.mkdir()
    os.symlink(tmp_path / "scratch-not-mounted", root)
    with pytest.raises(UserError, match=f"{root} is not writable.*train.output_dir"):
        ckpt.save_checkpoint(root, 2, _write, {"w": torch.ones(2)}, {})
    assert not (tmp_path / "scratch-not-mounted").exists() and os.listdir(root.parent) == ["checkpoints"]


@pytest.mark.parametrize("state", [[1, 2], {"optimizer": {}, "scaler": {}}])
def test_a_training_state_of_another_shape_is_one_line(tmp_path, state):
    """A training_state.pt that loads safely but is not what `bertforge pretrain` writes (a list, a dict without
    the rng and train_state) was a KeyError or TypeError traceback once the weights were loaded."""
    path = ckpt.save_checkpoint(tmp_path / "checkpoints", 2, _write, {"w": torch.ones(2)}, {}).path
    torch.save(state, path / ckpt.STATE_FILE)
    with pytest.raises(UserError, match=f"is not a training state of `bertforge pretrain`.*delete {path}"):
        ckpt.latest_checkpoint(tmp_path / "checkpoints").load_state(require=ckpt.STATE_KEYS)
