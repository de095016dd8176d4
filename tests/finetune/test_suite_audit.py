"""Audit of the GLUE suite and the quality-budget benchmark: regressions found by reading and running them."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from tests.helpers import write_rte

from bertforge.bench import quality
from bertforge.finetune import suite


def _fake_model(where: Path, weights: bytes) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    (where / "model.safetensors").write_bytes(weights)
    (where / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n", encoding="utf-8")
    return where


def hf_side_params(tmp_path, monkeypatch, shards_set: str, ours_set: str, num_shards: int, eval_batches: int):
    """quality_budget's params over `data prepare --config demo` shards (600-token vocab, `shards_set`) in
    tmp_path/data, for `hf_side` with two updates and no speed calibration."""
    from bertforge.cli import main

    data = tmp_path / "data"
    prep = [f"output_dir={data}", "shards.dupe_factor=1", f"shards.num_shards={num_shards}", "shards.workers=1"]
    prep += ["docs.num_shards=1", "vocab.vocab_size=600", shards_set]
    assert main(["data", "prepare", "--config", "demo", *[a for s in prep for a in ("--set", s)]]) == 0
    monkeypatch.setattr(quality, "_hf_rate", lambda *a: 2.0)
    p = {**quality.DEFAULTS, "data_dir": str(data / "shards"), "eval_dir": str(data / "eval"), "batch": 4}
    p.update(vocab=str(data / "vocab"), budget_s=1.0, eval_every=2, eval_batches=eval_batches, calib_steps=1)
    p.update(max_position_embeddings=128, ours_overrides=[ours_set])
    return p


def test_quality_glue_reruns_for_a_new_model_and_reuses_results_of_the_same_one(tmp_path, monkeypatch):
    """quality_budget pre-trains afresh on each call (`_pretrain --overwrite`), then fine-tuned GLUE into the same
    OUT/glue_<side>/: a second call's new weights made the suite refuse the first call's results ("another model
    or recipe ... pass --overwrite"), a UserError after the whole pre-training budget. Results of the same model
    (the GPU plan's later call) are still reused."""
    glue_dir = write_rte(tmp_path / "glue")
    model = _fake_model(tmp_path / "model", b"weights-1")
    # the grid's checks and the run itself are the suite's own (tested there); here only which runs are done
    monkeypatch.setattr(suite, "preflight", lambda opts, log: (["rte"], [1e-4], SimpleNamespace(task=None)))
    monkeypatch.setattr(suite.FeatureCache, "get", lambda self, opts, task, cfg: None)
    ran: list[int] = []

    def fake_run(opts, task, lr, seed, data, log):
        ran.append(seed)
        fp = suite.fingerprint(opts, task)
        return {"task": task, "lr": lr, "seed": seed, "metrics": {"accuracy": 50.0}, "fingerprint": fp}

    monkeypatch.setattr(suite, "run_one", fake_run)
    monkeypatch.setattr(suite, "plot_table", lambda *a: None)
    p = {**quality.DEFAULTS, "glue_dir": str(glue_dir), "glue_seeds": [1, 2], "glue_lrs": [1e-4]}
    out = tmp_path / "q" / "glue_ours"
    assert quality._glue(p, str(model), out, None)["average"] == 50.0
    assert ran == [1, 2]
    ran.clear()
    quality._glue(p, str(model), out, None)  # the same model: nothing runs again
    assert ran == []
    _fake_model(model, b"weights-2")  # the next call's pre-training: new weights at the same path
    quality._glue(p, str(model), out, None)
    assert ran == [1, 2]
    assert (
        json.loads((out / "glue_results.json").read_text())["runs"][0]["fingerprint"]["model"]
        == (suite.fingerprint(suite.SuiteOptions(str(glue_dir), str(model), str(out)), "rte")["model"])
    )


def test_the_baseline_trains_and_is_scored_on_ours_masks(tmp_path, monkeypatch):
    """On shards the loader masks (dynamic masking), ours trains and evaluates at its data.mlm_probability with
    random words below the data's vocab, and evaluates with train.seed. The baseline took the loader's defaults:
    random words below 30,522 (an IndexError at its first step with a smaller vocab) and held-out masks at the
    shards' 15% with seed 0, so its accuracy was another held-out task than ours'."""
    import torch

    from bertforge.bench import baseline
    from bertforge.data.loader import eval_batches

    seen: list[list[dict[str, torch.Tensor]]] = []
    real = baseline.hf_mlm_accuracy
    monkeypatch.setattr(baseline, "hf_mlm_accuracy", lambda model, b: seen.append(b) or real(model, b))
    p = hf_side_params(tmp_path, monkeypatch, "shards.dynamic_masking=true", "data.mlm_probability=0.3", 2, 2)
    data = tmp_path / "data"
    side = quality.hf_side(p, tmp_path / "hf")
    assert side["steps"] == 2 and 0.0 <= side["curve"][-1]["acc"] <= 1.0
    rows = len((data / "vocab" / "vocab.txt").read_text(encoding="utf-8").splitlines())
    # ours' evaluation (train.loop.evaluate_run): its micro-batch, eval_batches, vocab, train.seed and rate
    ours = list(eval_batches(data / "eval", 4, 0, 1, 2, rows, 12345, mlm_probability=0.3, mask_split=(0.8, 0.1)))
    assert seen and len(seen[-1]) == len(ours) == 2
    for got, want in zip(seen[-1], ours, strict=True):
        assert got.keys() == want.keys()
        assert all(torch.equal(got[k].cpu(), want[k]) for k in want)


def test_one_sides_final_accuracy_is_the_last_one_within_the_budget(tmp_path):
    """A call with one side's record reported the accuracy of its last evaluation even past 1.02 x the budget (a
    calibration that over-estimated the step rate), where the two-side comparison counts only those within it."""
    out = tmp_path / "q"
    (out / "ours").mkdir(parents=True)
    curve = [{"train_s": 10.0, "step": 5, "acc": 0.07}, {"train_s": 20.0, "step": 10, "acc": 0.11}]
    curve.append({"train_s": 30.0, "step": 15, "acc": 0.15})  # past the budget: not counted
    (out / "ours" / "side.json").write_text(json.dumps({"curve": curve, "steps": 15, "model_dir": "/m"}))
    r = quality.quality_budget(str(out), "d", "e", "v", budget_s=20, sides=[])
    assert r["ours_final_acc"] == 0.11
