"""Held-out evaluation during pre-training (data.eval_dir): where its numbers are recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.train.conftest import make_shards
from tests.train.conftest import tiny_config as _cfg

from bertforge.train.loop import run_pretrain


def _eval_rows(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "eval_loss" in r]


def test_the_evaluation_at_a_stop_between_evaluations_is_logged(tmp_path):
    """train.stop_after_steps between two evaluations: the run evaluates at its stop step for summary.json, and
    that evaluation is a metrics.jsonl row too (it was in summary.json alone: no point in metrics.jsonl or
    TensorBoard). A resumed finished run, which runs no step, evaluates again without a second row."""
    shards = make_shards(tmp_path / "shards", n_shards=2, rows=16)
    held_out = make_shards(tmp_path / "held_out", n_shards=1, rows=8, seed=5)
    out = tmp_path / "run"
    extra = {"data.eval_dir": str(held_out), "train.eval_every": 4, "train.max_steps": 4, "train.save_every": 4}
    first = run_pretrain(_cfg(shards, out, **extra, **{"train.stop_after_steps": 3}))
    rows = _eval_rows(out)
    assert [r["step"] for r in rows] == [3]
    assert rows[0]["eval_loss"] == first["final_eval_loss"] and rows[0]["eval_mlm_acc"] == first["final_eval_mlm_acc"]
    final = run_pretrain(_cfg(shards, out, **extra), resume=True)
    again = run_pretrain(_cfg(shards, out, **extra), resume=True)  # finished: no step, the same evaluation
    rows = _eval_rows(out)
    assert [r["step"] for r in rows] == [3, 4]
    assert rows[1]["eval_loss"] == final["final_eval_loss"] == again["final_eval_loss"]


def test_eval_shards_longer_than_a_synthetic_runs_model_are_refused_at_start(tmp_path):
    """A synthetic run has no training shards for the eval shards to be compared with: their seq_len is checked
    against the model's positions before the first step (it was an IndexError at the first evaluation)."""
    from bertforge.errors import UserError

    held_out = make_shards(tmp_path / "held_out", n_shards=1, rows=8, seq_len=128)
    synthetic = {"data.synthetic_seq_len": 32, "data.synthetic_vocab_size": 64, "data.synthetic_max_pred": 5}
    cfg = _cfg("synthetic", tmp_path / "run", **synthetic, **{"data.eval_dir": str(held_out), "train.max_steps": 2})
    with pytest.raises(UserError, match="seq_len 128 but the model has max_position_embeddings"):
        run_pretrain(cfg)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
