"""The pre-training benchmark callables run and return their metrics (tiny model, one step)."""

import math

import pytest

from bertforge.bench import baseline
from bertforge.bench import pretrain as bench
from bertforge.bench import step as bench_step
from bertforge.runtime import step as product
from bertforge.train import loop


@pytest.mark.parametrize("impl", ["ours", "hf"])
def test_train_step(shards, impl):
    pytest.importorskip("transformers")
    m = bench_step.train_step(impl, "tiny", "fp32", batch=4, steps=1, data_dir=str(shards), vocab=64)
    assert m["seq_per_s"] > 0 and 0 < m["mfu"] < 1


def test_loop_and_benchmarks_call_the_one_step(shards, tmp_path, monkeypatch, overrides):
    """`bertforge pretrain`'s loop and every bench entry that times "our step" run `runtime.step.train_step`: the
    same function object, and each really calls it (counted through a spy put in its place)."""
    users = {loop: "train_step", bench_step: "product_step", bench: "product_step"}
    assert all(getattr(m, name) is product.train_step for m, name in users.items())
    calls: list[int] = []

    def spy(*a, **k):
        calls.append(1)
        return product.train_step(*a, **k)

    for m, name in users.items():
        monkeypatch.setattr(m, name, spy)
    from bertforge import config as C

    loop.run_pretrain(C.load_config("pretrain", "demo_tiny_128", overrides(shards, tmp_path / "run")))
    assert len(calls) == 6  # train.max_steps
    bench_step.train_step("ours", "tiny", "fp32", batch=4, steps=2, data_dir=str(shards), vocab=64)
    bench.time_to_accuracy("ours", "tiny", str(shards), str(shards), target=0.0, batch=4, eval_every=1, eval_batches=1)
    assert len(calls) == 6 + 2 + 1


def test_hf_labels_match_masked_slots(shards):
    from bertforge.data.loader import PretrainLoader

    b = next(PretrainLoader.from_dir(shards, 4, 4, 0, 1, seed=0, num_workers=0).iterate())
    dense = baseline.dense_labels(b)
    assert int((dense != -100).sum()) == int((b["masked_positions"] > 0).sum())
    r, c = (dense != -100).nonzero()[0].tolist()
    assert dense[r, c] == b["masked_labels"][r][(b["masked_positions"][r] == c).nonzero()[0, 0]]


@pytest.mark.parametrize("impl", ["ours", "hf"])
def test_time_to_accuracy(shards, impl):
    pytest.importorskip("transformers")
    m = bench.time_to_accuracy(
        impl, "tiny", str(shards), str(shards), target=0.0, batch=4, eval_every=1, eval_batches=1
    )
    assert m["steps"] == 1 and math.isfinite(m["seconds_to_target"])
    m = bench.time_to_accuracy(
        impl, "tiny", str(shards), str(shards), target=1.1, batch=4, eval_every=1, eval_batches=1, max_seconds=0.01
    )
    assert m["seconds_to_target"] == math.inf
