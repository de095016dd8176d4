"""Malformed shards are one line naming the shard before the first step: a missing dataset or rows of
disagreeing width when the directory is opened, ids beyond the model's vocab or positions outside the row in
the start-up sample (`check_model`) and, past the sample, where the loader reads the row."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from tests.helpers import one_line

from bertforge.data.loader import PretrainLoader, eval_batches
from bertforge.data.shards import write_shard
from bertforge.data.shardset import SAMPLE_ROWS, ShardSet
from bertforge.errors import UserError


def _nvidia(n: int = 8, S: int = 16, P: int = 4) -> dict[str, np.ndarray]:
    return {
        "input_ids": np.arange(n * S, dtype=np.int32).reshape(n, S) % 50 + 1,
        "input_mask": np.ones((n, S), np.int8),
        "segment_ids": np.zeros((n, S), np.int8),
        "masked_lm_positions": np.tile(np.arange(1, P + 1, dtype=np.int32), (n, 1)),
        "masked_lm_ids": np.ones((n, P), np.int32),
        "next_sentence_labels": np.zeros(n, np.int8),
    }


def _dir(tmp_path, arrays: dict[str, np.ndarray], bad: dict[str, np.ndarray] | None = None, shards: int = 2):
    """`shards` shards of `arrays`; the last one of `bad` instead when given."""
    d = tmp_path / "shards"
    for i in range(shards):
        write_shard(d / f"train_{i}.hdf5", bad if bad is not None and i == shards - 1 else arrays)
    return d


@pytest.mark.parametrize(
    ("change", "parts"),
    [
        ({"input_mask": np.ones((8, 12), np.int8)}, ("input_mask is 12 wide but input_ids is 16",)),
        ({"masked_lm_ids": None}, ("has no masked_lm_ids dataset, which nvidia shards need",)),
        ({"masked_lm_ids": np.ones((8, 3), np.int32)}, ("masked_lm_ids is 3 wide but masked_lm_positions is 4",)),
        ({"input_ids": np.ones(8, np.int32)}, ("input_ids has shape (8,), expected [rows, width]",)),
    ],
)
def test_a_malformed_schema_is_one_line_naming_shard_and_dataset(tmp_path, change, parts):
    bad = {k: v for k, v in {**_nvidia(), **change}.items() if v is not None}
    with pytest.raises(UserError) as e:
        ShardSet.open(_dir(tmp_path, _nvidia(), bad)).check_datasets()  # widths: when opened; datasets: here
    one_line(str(e.value), "train_1.hdf5", *parts, "re-create it")


def test_dynamic_shards_need_no_masked_lm_datasets(tmp_path):
    dyn = _nvidia()
    del dyn["masked_lm_positions"], dyn["masked_lm_ids"]
    shards = ShardSet.open(_dir(tmp_path, dyn))
    shards.check_datasets()  # word_starts is optional too
    assert shards.kind == "dynamic"


def test_start_up_sample_catches_bad_positions_and_ids(tmp_path):
    bad_pos = _nvidia()
    bad_pos["masked_lm_positions"][5, 2] = 16  # rows are 16 tokens: positions 0..15
    with pytest.raises(UserError) as e:
        ShardSet.open(_dir(tmp_path / "pos", bad_pos, shards=1)).check_model(64, 16)
    one_line(str(e.value), "train_0.hdf5 row 5: masked_lm_positions holds 16", "rows are 16 tokens long")
    big = _nvidia()
    big["input_ids"][3, 7] = 64  # no manifest records the vocab: only the ids tell
    with pytest.raises(UserError) as e:
        ShardSet.open(_dir(tmp_path / "ids", big, shards=1)).check_model(64, 16)
    one_line(str(e.value), "train_0.hdf5 row 3: input_ids holds 64", "vocab has 64 tokens", "model.vocab_size")
    ShardSet.open(_dir(tmp_path / "ids", big, shards=1)).check_model(65, 16)  # a larger model takes it


def test_start_up_reads_a_bounded_sample(tmp_path):
    late = _nvidia(n=SAMPLE_ROWS + 8)
    late["masked_lm_ids"][SAMPLE_ROWS + 2, 0] = 99  # past the sample: start-up does not read that far
    ShardSet.open(_dir(tmp_path, late, shards=1)).check_model(64, 16)


def test_the_loader_names_the_shard_and_row_of_a_bad_row(tmp_path):
    bad = _nvidia()
    bad["masked_lm_positions"][6, 0] = 40
    d = _dir(tmp_path, _nvidia(), bad)  # the second shard: not in the start-up sample
    ShardSet.open(d).check_model(64, 16)
    batches = PretrainLoader.from_dir(d, 4, 4, 0, 1, seed=0, num_workers=0, vocab_size=64).iterate(0)
    with pytest.raises(UserError) as e:
        list(itertools.islice(batches, 8))  # 4 batches an epoch: every row is read
    one_line(str(e.value), "train_1.hdf5 row 6: masked_lm_positions holds 40")
    with pytest.raises(UserError, match="train_1.hdf5 row 6"):
        list(eval_batches(d, 4, vocab_size=64))
