"""The pre-training benchmark callables run and return their metrics (tiny model, one step)."""

import math

import pytest

from bertforge.bench import pretrain as bench


@pytest.mark.parametrize("impl", ["ours", "hf"])
def test_train_step(shards, impl):
    pytest.importorskip("transformers")
    m = bench.train_step(impl, "tiny", "fp32", batch=4, steps=1, data_dir=str(shards), vocab=64)
    assert m["seq_per_s"] > 0 and 0 < m["mfu"] < 1


def test_hf_labels_match_masked_slots(shards):
    from bertforge.data.loader import PretrainLoader

    b = next(PretrainLoader.from_dir(shards, 4, 4, 0, 1, seed=0, num_workers=0).iterate())
    dense = bench._dense_labels(b)
    assert int((dense != -100).sum()) == int((b["masked_positions"] > 0).sum())
    r, c = (dense != -100).nonzero()[0].tolist()
    assert dense[r, c] == b["masked_labels"][r][(b["masked_positions"][r] == c).nonzero()[0, 0]]


@pytest.mark.parametrize("impl", ["ours", "hf"])
def test_time_to_accuracy(shards, impl):
    pytest.importorskip("transformers")
    m = bench.time_to_accuracy(impl, "tiny", str(shards), str(shards), target=0.0, batch=4, eval_every=1,
                               eval_batches=1)
    assert m["steps"] == 1 and math.isfinite(m["seconds_to_target"])
    m = bench.time_to_accuracy(impl, "tiny", str(shards), str(shards), target=1.1, batch=4, eval_every=1,
                               eval_batches=1, max_seconds=0.01)
    assert m["seconds_to_target"] == math.inf
