"""bench.quality: the training clock read off a pre-training metrics.jsonl, and the report."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bertforge.bench import quality
from bertforge.errors import UserError


def test_eval_curve_counts_only_the_training_windows():
    rows = [
        {"step": 10, "window_s": 2.0, "seq_per_s": 1.0},
        {"step": 20, "window_s": 3.0, "seq_per_s": 1.0},
        {"step": 20, "eval_mlm_acc": 0.1, "elapsed_s": 99.0},  # elapsed_s includes set-up and evaluation
        {"step": 30, "window_s": 4.0},
        {"step": 40, "window_s": 1.5},
        {"step": 40, "eval_mlm_acc": 0.2},
    ]
    assert quality.eval_curve(rows) == [
        {"train_s": 5.0, "step": 20, "acc": 0.1},
        {"train_s": 10.5, "step": 40, "acc": 0.2},
    ]


def test_report_names_both_sides_and_the_anchors():
    p = {**quality.DEFAULTS, "budget_s": 60, "eval_dir": "E"}
    r = {"target_acc": 0.2, "ours_time_share": 0.25}
    for k, steps, s, acc, tta in (("ours", 400, 60, 0.3, 15), ("hf", 100, 59, 0.2, 59)):
        r.update({f"{k}_steps": steps, f"{k}_train_s": s, f"{k}_final_acc": acc, f"{k}_seconds_to_target": tta})
    table = {"tasks": {"rte": {"metrics": {"accuracy": 55.0}, "spread": 1.0, "lr": 1e-4, "seeds": [1, 2]}}}
    table.update(average=55.0, avg_no_wnli=55.0, seeds=[1, 2])
    md = quality.report(p, r, {"ours": table, "hf": table})
    assert "| bertforge pretrain | 400 | 60 | 0.3000 | 15 |" in md
    assert "25% of the baseline's time" in md
    assert "BERT-Tiny (L2/H128) 64.2" in md and f"{256_000_000 / (400 * 32):,.0f}x" in md
    assert math.isfinite(r["ours_time_share"])


def test_unknown_parameter_and_side_are_refused(tmp_path):
    with pytest.raises(UserError, match="unknown parameters bogus"):
        quality.quality_budget(str(tmp_path), "d", "e", "v", bogus=1)
    with pytest.raises(UserError, match="sides: both"):
        quality.quality_budget(str(tmp_path), "d", "e", "v", sides=["both"])


def test_budget_without_an_evaluation_is_refused_before_training():
    assert quality.budget_steps(30, 50, 2.0, "ours") == 60
    with pytest.raises(UserError, match="ours: 30 s at 1.5 updates/s is 45 updates, fewer than eval_every 50"):
        quality.budget_steps(30, 50, 1.5, "ours")


def test_update_rate_leaves_out_the_first_window():
    rows = [
        {"step": 10, "window_s": 20.0},  # compilation
        {"step": 10, "eval_mlm_acc": 0.1},
        {"step": 20, "window_s": 2.0},
        {"step": 40, "window_s": 5.0},
        {"step": 50, "window_s": 2.0},
    ]
    assert quality.update_rate(rows) == 5.0  # median of 5, 4, 5 updates/s
    assert quality.start_overhead(rows, 5.0) == 18.0  # 10 updates would take 2 s: the first window's other 18 s
    assert quality.start_overhead(rows[2:], 5.0) == 0.0 and quality.start_overhead([], 5.0) == 0.0


def test_equal_time_checks_common_eval_before_training(tmp_path):
    runs = {"a": {"config": "demo_tiny_mlm_128"}}
    with pytest.raises(UserError, match="common_eval: give dir"):
        quality.equal_time(str(tmp_path), runs, common_eval={"batch": 4})
    with pytest.raises(UserError, match="held-out directory .*nowhere does not exist"):
        quality.equal_time(str(tmp_path), runs, common_eval={"dir": str(tmp_path / "nowhere")})
    assert not (tmp_path / "a").exists()


def test_equal_time_refuses_a_run_without_a_config(tmp_path):
    with pytest.raises(UserError, match="equal_time run 'a': give config"):
        quality.equal_time(str(tmp_path), {"a": {"sets": []}})
    with pytest.raises(UserError, match="equal_time run 'b': give config"):
        quality.equal_time(str(tmp_path), {"b": {"config": "demo_tiny_128", "steps": 3}})


def test_equal_time_trains_bert_and_modernbert_on_one_task(tmp_path, monkeypatch):
    """Two recipes through `bertforge pretrain` children for the same few seconds on the demo's MLM-only data,
    both scored at 15% masking; the report and the curves name both with their parameter counts."""
    from bertforge.cli import main

    data = tmp_path / "data"
    prep = [f"output_dir={data}", "shards.dupe_factor=1", "shards.num_shards=2", "shards.workers=1"]
    assert main(["data", "prepare", "--config", "demo_mlm", *[a for s in prep for a in ("--set", s)]]) == 0
    common = [
        f"data.input_dir={data / 'shards_mlm'}",
        f"data.eval_dir={data / 'eval_mlm'}",
        f"data.vocab={data / 'vocab'}",
        "data.num_workers=0",
        "data.eval_batches=2",
        "data.eval_mlm_probability=0.15",
        "train.global_batch_size=4",
        "train.micro_batch_size=4",
        "train.precision=fp32",
        "train.device=cpu",
    ]
    runs = {
        "bert": {"config": "demo_tiny_mlm_128"},
        "modern": {"config": "modernbert_tiny_1024", "sets": ["model.max_position_embeddings=1024"]},
    }
    monkeypatch.setattr(quality, "update_rate", lambda rows: 3.0)  # 6 updates in the 2 s budget, however loaded
    monkeypatch.setattr(quality, "start_overhead", lambda rows, rate: 0.0)
    same = {"dir": str(data / "eval_mlm"), "batch": 4, "batches": 2}
    r = quality.equal_time(
        str(tmp_path / "out"), runs, budget_s=2, eval_every=2, calib_steps=4, sets=common, common_eval=same
    )
    for name in runs:
        assert 0.0 <= r[f"{name}_final_acc"] <= 1.0 and r[f"{name}_steps"] in (2, 4, 6)
        assert 0.0 <= r[f"{name}_common_acc"] <= 1.0
    assert 1e6 < r["bert_parameters"] < r["modern_parameters"]  # 4 layers of GeGLU against 2 of GELU, one vocab
    report = (tmp_path / "out" / "report.md").read_text()
    assert "| bert | demo_tiny_mlm_128 |" in report and "| modern | modernbert_tiny_1024 |" in report
    assert (tmp_path / "out" / "curves.png").stat().st_size > 0
    # a benchmark measures afresh: a second run over the first one's directories replaces them
    again = quality.equal_time(
        str(tmp_path / "out"), {"bert": runs["bert"]}, budget_s=2, eval_every=2, calib_steps=4, sets=common
    )
    assert again["bert_steps"] in (2, 4, 6)


def test_baseline_side_scores_the_same_held_out_batches_as_ours(tmp_path, monkeypatch):
    """The baseline's held-out accuracy is taken on the first `eval_batches` batches of the eval shard, as
    `bertforge pretrain`'s evaluation is (a regression: it once scored the whole shard from batch 20 on)."""
    from bertforge.bench import baseline
    from bertforge.cli import main

    data = tmp_path / "data"
    prep = [f"output_dir={data}", "shards.dupe_factor=1", "shards.num_shards=2", "shards.workers=1"]
    assert main(["data", "prepare", "--config", "demo", *[a for s in prep for a in ("--set", s)]]) == 0
    seen: list[list[int]] = []
    real = baseline.hf_mlm_accuracy

    def recording(model, batches):
        seen.append([int(b["input_ids"].shape[0]) for b in batches])
        return real(model, batches)

    monkeypatch.setattr(baseline, "hf_mlm_accuracy", recording)
    monkeypatch.setattr(quality, "_hf_rate", lambda *a: 4.0)  # 4 updates in the 1 s budget, however loaded the box
    p = {**quality.DEFAULTS, "data_dir": str(data / "shards"), "eval_dir": str(data / "eval")}
    p.update(vocab=str(data / "vocab"), batch=4, budget_s=1.0, eval_every=2, eval_batches=3, calib_steps=2)
    side = quality.hf_side(p, tmp_path / "hf")
    assert seen and all(s == [4, 4, 4] for s in seen)
    assert side["steps"] == 4 and 0.0 <= side["curve"][-1]["acc"] <= 1.0
    assert (tmp_path / "hf" / "hf_model" / "vocab.txt").is_file()


def test_a_call_that_trains_no_side_compares_the_earlier_calls_and_runs_glue_on_both(tmp_path, monkeypatch):
    """The GPU plan: ours in one call, hf in the next, GLUE in a third (`sides: []`) from the sides' records."""
    import json

    out = tmp_path / "q"
    for k, accs in {"ours": [0.10, 0.20], "hf": [0.05, 0.12]}.items():
        curve = [{"train_s": 10.0 * (i + 1), "step": 5 * (i + 1), "acc": a} for i, a in enumerate(accs)]
        (out / k).mkdir(parents=True)
        (out / k / "side.json").write_text(json.dumps({"curve": curve, "steps": 10, "model_dir": f"/models/{k}"}))
    glued = []
    table = {"tasks": {"mrpc": {"metrics": {"f1": 80.0}, "spread": 1.0, "lr": 1e-4, "seeds": [1, 2, 3], "score": 80.0}}}

    def fake_glue(p, model_dir, where, cache):
        glued.append(model_dir)
        return {**table, "average": 80.0, "avg_no_wnli": 80.0, "seeds": [1, 2, 3]}

    monkeypatch.setattr(quality, "_glue", fake_glue)
    r = quality.quality_budget(str(out), "d", "e", "v", budget_s=20, sides=[], glue_dir="glue")
    assert glued == ["/models/ours", "/models/hf"]
    assert r["target_acc"] == 0.12 and r["ours_seconds_to_target"] == 20.0 and r["ours_glue_avg"] == 80.0
    assert "GLUE dev, HF baseline" in (out / "report.md").read_text()


def test_a_call_with_one_sides_record_runs_glue_on_that_side_alone(tmp_path, monkeypatch):
    """The 15-minute GPU plan: each side's model is fine-tuned in the session that trained it, before the other
    side exists; a call with no record at all says where it looked."""
    import json

    out = tmp_path / "q"
    (out / "hf").mkdir(parents=True)
    curve = [{"train_s": 10.0, "step": 5, "acc": 0.07}, {"train_s": 20.0, "step": 10, "acc": 0.11}]
    (out / "hf" / "side.json").write_text(json.dumps({"curve": curve, "steps": 10, "model_dir": "/models/hf"}))
    glued = []

    def fake_glue(p, model_dir, where, cache):
        glued.append((model_dir, where.name))
        return {"average": 61.5}

    monkeypatch.setattr(quality, "_glue", fake_glue)
    r = quality.quality_budget(str(out), "d", "e", "v", budget_s=20, sides=[], glue_dir="glue")
    assert glued == [("/models/hf", "glue_hf")]
    assert r == {"hf_final_acc": 0.11, "hf_steps": 10.0, "hf_glue_avg": 61.5}
    assert not (out / "report.md").exists()  # no comparison without the other side
    with pytest.raises(UserError, match="no side.json under"):
        quality.quality_budget(str(tmp_path / "empty"), "d", "e", "v", budget_s=20, sides=[], glue_dir="glue")


def test_glue_fine_tunes_on_glue_device_when_given(monkeypatch):
    """GPU-trained sides fine-tuned on the CPU: the report keeps the training device, GLUE runs on glue_device."""
    from bertforge.finetune import suite

    seen = []
    monkeypatch.setattr(suite, "run_suite", lambda opts, log, cache: seen.append(opts.overrides[0]) or {})
    p = {**quality.DEFAULTS, "glue_dir": "glue", "device": "cuda"}
    quality._glue(p, "m", Path("o"), None)
    quality._glue({**p, "glue_device": "cpu"}, "m", Path("o"), None)
    assert seen == ["train.device=cuda", "train.device=cpu"]


def test_the_baseline_trains_ours_padded_vocab_rows(tmp_path):
    """The same model on both sides: ours pads its vocab rows to a multiple of 8 (model.pad_vocab_multiple), so the
    baseline's BertConfig has those rows too, not the vocab's line count."""
    from bertforge.bench.quality import same_model

    p = {
        "config": "demo_tiny_128", "data_dir": "synthetic", "vocab": "null", "eval_dir": "null", "eval_batches": 1,
        "batch": 8, "preset": "mini", "max_position_embeddings": 128, "precision": "fp32", "device": "cpu", "seed": 1,
    }  # fmt: skip
    assert same_model(p, 7962).vocab_size == 7968
    assert same_model({**p, "ours_overrides": ["model.pad_vocab_multiple=1"]}, 7962).vocab_size == 7962
