"""The step and time-to-accuracy benchmarks on MLM-only shards (`data shards --objective mlm`): both sides train the
MLM head alone, the HF baseline as `BertForMaskedLM` (as run_mlm.py would), ours as train.objective mlm's model."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("impl", ["ours", "hf"])
def test_train_step_on_mlm_only_shards(demo_mlm, impl, monkeypatch):
    from bertforge.bench import step

    tasks: list[str] = []
    real_flops = step.flops_per_sequence
    monkeypatch.setattr(step, "flops_per_sequence", lambda *a, **k: tasks.append(k["task"]) or real_flops(*a, **k))
    data = str(demo_mlm / "shards_mlm")
    out = step.train_step(impl, "tiny", "fp32", batch=2, steps=1, device="cpu", data_dir=data)
    assert out["loss"] > 0 and out["seq_per_s"] > 0
    assert tasks == ["mlm"]  # MFU credits no NSP head's work: the shards train none
    runner = next(v for k, v in step._CACHE.items.items() if k[0] == impl and data in k)[2]  # what _build made
    if impl == "hf":
        assert type(runner[0]).__name__ == "BertForMaskedLM"
    else:
        assert runner.model.task == "mlm" and not hasattr(runner.model.cls, "seq_relationship")


@pytest.mark.parametrize("impl", ["ours", "hf"])
def test_time_to_accuracy_on_mlm_only_shards(demo_mlm, impl, tmp_path):
    import json

    from bertforge.bench.pretrain import time_to_accuracy

    curve = tmp_path / "c.jsonl"
    out = time_to_accuracy(
        impl,
        "tiny",
        str(demo_mlm / "shards_mlm"),
        str(demo_mlm / "eval_mlm"),
        target=0.0,  # reached at the first evaluation: one update
        batch=2,
        eval_every=1,
        eval_batches=1,
        curve=str(curve),
    )
    assert out["steps"] == 1 and 0 <= out["final_eval_mlm_acc"] <= 1 and out["seconds_to_target"] < 60
    assert json.loads(curve.read_text())["impl"] == impl
