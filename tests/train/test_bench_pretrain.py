"""The pre-training benchmark callables run and return their metrics (tiny model, one step)."""

import math

import pytest

from bertforge.bench import baseline
from bertforge.bench import pretrain as bench
from bertforge.bench import step as bench_step
from bertforge.errors import UserError
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


def test_the_loop_benchmark_runs_bertforge_pretrain_and_its_curves_compare(tmp_path):
    """`bench.pretrain_loop.loop` (the GPU loop spec's entries) runs the real CLI in a child process on the
    synthetic source and summarises it; `compare_curves` reads the copied metrics.jsonl back."""
    from bertforge.bench import pretrain_loop as pl

    curve = tmp_path / "eager_seed1.jsonl"
    m = pl.loop(
        preset="base",
        seq_len=512,  # phase-2 lengths: ~1.9 sequences per packed row
        max_pred=20,
        pack=3,
        micro_batch=8,
        accum=2,  # micro-batches per update, packed too: 16 rows, ~30 sequences
        steps=8,
        warmup_steps=2,
        log_every=2,
        precision="fp32",
        device="cpu",
        curve=str(curve),
        extra=["model.preset=tiny", "data.synthetic_vocab_size=64"],
    )
    assert m["steps_measured"] == 6 and m["seq_per_s"] > m["rows_per_s"] > 0 and 0 < m["mfu"] < 1
    assert m["rows_per_update"] == pytest.approx(16)  # a global batch of 16 sequences would have been 8 rows
    assert m["first_step_s"] > 0 and math.isfinite(m["final_loss"])
    hf = pl.hf_loop(preset="tiny", seq_len=64, max_pred=8, micro_batch=4, steps=3, warmup_steps=1, device="cpu")
    assert hf["seq_per_s"] > 0 and hf["step_ms"] > 0

    # curves with known distances from the reference: the other seed 0.2 away, a fast run 0.1 away
    import json

    def write(name, shift):
        rows = [{"step": s, "loss": 10.0 - s / 100 + shift, "seq_per_s": 1.0} for s in range(10, 110, 10)]
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return str(tmp_path / f"{name}.jsonl")

    ref, noise, fast = write("ref", 0.0), write("seed2", 0.2), write("fast", -0.1)
    out = pl.compare_curves(ref, noise, [fast], png=str(tmp_path / "c.png"), skip_steps=20)
    assert out["band"] == pytest.approx(0.2) and out["fast_over_band"] == pytest.approx(0.5)
    assert open(tmp_path / "c.png", "rb").read(4) == b"\x89PNG"
    with pytest.raises(UserError, match="share no logged step"):
        pl.compare_curves(ref, noise, [str(curve)], skip_steps=20)  # the real run logged steps 2..8 only


def test_the_isolated_step_gets_the_layout_the_product_gives(flash_stand_in, monkeypatch):
    """Where a run's batches would carry segment bounds (compiled or packed on CUDA), the isolated step's do too,
    so it times the product's layout (the per-segment reference stands in for the CUDA flash kernel)."""
    monkeypatch.setattr(bench_step, "wants_segments", lambda *a, **k: True)
    bench_step.train_step(preset="tiny", batch=3, seq=24, masked=4, steps=1)
    assert flash_stand_in and all(indices is None for _, indices, _ in flash_stand_in)
