"""bench.quality: the training clock read off a pre-training metrics.jsonl, and the report."""

from __future__ import annotations

import math

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
    p = {**quality.DEFAULTS, "budget_s": 30, "eval_every": 50}
    assert quality.budget_steps(p, 2.0, "ours") == 60
    with pytest.raises(UserError, match="ours: 30 s at 1.5 updates/s is 45 updates, fewer than eval_every 50"):
        quality.budget_steps(p, 1.5, "ours")
