"""`bertforge pretrain` on malformed shards: one line naming the shard, before the first step, whether the
problem is found when the directory is opened, in the start-up sample or by a DataLoader worker."""

from __future__ import annotations

import shutil
from pathlib import Path

import h5py
import pytest
from tests.helpers import one_line

from bertforge.cli import main


def _pretrain(overrides, data, out, **extra) -> int:
    sets = overrides(data, out, **{"train.max_steps": 2, **extra})
    return main(["pretrain", *(x for s in sets for x in ("--set", s))])


def _edit(path, key, fn) -> None:
    with h5py.File(path, "a") as h:
        a = fn(h[key][:])
        del h[key]
        if a is not None:  # None: the dataset is gone
            h.create_dataset(key, data=a)


@pytest.mark.parametrize(
    ("key", "fn", "parts"),
    [
        ("input_mask", lambda a: a[:, :16], ("input_mask is 16 wide but input_ids is 32",)),
        ("masked_lm_ids", lambda a: None, ("has no masked_lm_ids dataset, which nvidia shards need",)),
        ("masked_lm_positions", lambda a: a + 32, ("row 0: masked_lm_positions holds", "32 tokens long")),
        ("input_ids", lambda a: a + 64, ("row 0: input_ids holds", "model.vocab_size")),
    ],
)
def test_malformed_shards_fail_before_the_first_step(shards, overrides, tmp_path, capsys, key, fn, parts):
    _edit(shards / "shard_0.hdf5", key, fn)
    assert _pretrain(overrides, shards, tmp_path / "new" / "run") == 2
    one_line(capsys.readouterr().err, "bertforge pretrain: error: shard", "shard_0.hdf5", *parts)
    assert not (tmp_path / "new").exists()  # a failed start leaves nothing behind, nor the parent it made


def test_a_bad_row_met_by_a_loader_worker_is_one_line(shards, overrides, tmp_path, capsys):
    _edit(shards / "shard_3.hdf5", "masked_lm_positions", lambda a: a + 32)  # past the start-up sample
    assert _pretrain(overrides, shards, tmp_path / "run", **{"data.num_workers": 1, "train.max_steps": 40}) == 2
    one_line(capsys.readouterr().err, "shard", "shard_3.hdf5 row", "masked_lm_positions holds")


def test_bad_eval_shards_fail_before_the_first_step(shards, overrides, tmp_path, capsys):
    held_out = Path(shutil.copytree(shards, tmp_path / "eval"))
    _edit(held_out / "shard_0.hdf5", "input_ids", lambda a: a + 64)
    assert _pretrain(overrides, shards, tmp_path / "run", **{"data.eval_dir": str(held_out)}) == 2
    one_line(capsys.readouterr().err, f"{held_out / 'shard_0.hdf5'} row 0: input_ids holds")
