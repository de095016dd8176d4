"""Audit of the GLUE suite's lr grid (one diverging run must not block the suite) and of the quality-budget
benchmark's baseline (MLM-only shards) and result.json (no Infinity)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from tests.finetune.test_suite import SETS as SUITE_SETS
from tests.finetune.test_suite_audit import hf_side_params
from tests.helpers import one_line, write_rte

from bertforge.cli import main
from bertforge.errors import UserError
from bertforge.finetune import suite

SETS = [*SUITE_SETS, "train.plot=false", "train.max_nonfinite_steps=1"]  # the suite tests' tiny recipe


def _argv(encoder: Path, glue_dir: Path, out: Path, *extra: str) -> list[str]:
    argv = ["finetune", "--task", "glue", "--glue-dir", str(glue_dir), "--model", str(encoder)]
    argv += ["--output-dir", str(out), "--epochs", "1", "--seeds", "1", "--lrs", "2e-5,5e-5", *extra]
    return argv + [x for s in SETS for x in ("--set", s)]


def _diverging_at(monkeypatch, lrs: set[float]) -> list[float]:
    """Every update of a run at one of `lrs` is non-finite (the real runner then stops on
    train.max_nonfinite_steps); returns the list of the runs' lrs as they start."""
    from bertforge.finetune import runner

    real_step, real_run, started = runner.train_step, runner.run_finetune, []

    def step(*args, **kwargs):
        result = real_step(*args, **kwargs)
        return dataclasses.replace(result, finite=False) if started[-1] in lrs else result

    monkeypatch.setattr(runner, "train_step", step)
    monkeypatch.setattr(
        runner, "run_finetune", lambda r, c, log=print: started.append(c.optim.lr) or real_run(r, c, log)
    )
    return started


def test_a_diverging_run_is_recorded_and_the_grid_goes_on(encoder, tmp_path, monkeypatch, capsys):
    """A run that stopped on non-finite steps raised the runner's UserError out of the suite (exit 2, no table),
    and every re-run hit the same run again. Now it is recorded as diverged, the grid goes on, the lr choice leaves
    it out, the table and JSON name it, and a re-run of the same recipe does not retry it."""
    glue_dir, out = write_rte(tmp_path / "glue"), tmp_path / "out"
    started = _diverging_at(monkeypatch, {5e-5})
    assert main(_argv(encoder, glue_dir, out)) == 0
    assert started == [2e-5, 5e-5]
    rec = json.loads((out / "results" / "rte" / "lr5e-05_seed1.json").read_text())
    assert rec["diverged"].startswith("1 non-finite gradient steps in a row") and rec["metrics"] == {}
    table = json.loads((out / "glue_results.json").read_text())
    assert table["tasks"]["rte"]["lr"] == 2e-5 and table["tasks"]["rte"]["seeds"] == [1]
    assert table["tasks"]["rte"]["median_score_per_lr"]["5e-05"] is None
    assert table["diverged"] == [{"task": "rte", "lr": 5e-5, "seed": 1}]
    assert math.isfinite(table["average"])
    md = (out / "glue_results.md").read_text()
    assert (
        "Diverged (stopped on non-finite steps; left out of the medians and the lr choice): rte lr 5e-05 seed 1" in md
    )
    assert "rte lr 5e-05 seed 1 diverged (1 non-finite gradient steps in a row" in capsys.readouterr().out
    assert not (out / "runs" / "rte" / "lr5e-05_seed1" / "best").exists()

    started.clear()
    assert main(_argv(encoder, glue_dir, out)) == 0  # the same recipe: nothing is run again
    assert started == []
    assert "rte lr 5e-05 seed 1: done earlier (diverged)" in capsys.readouterr().out
    # other settings are another recipe (refused as for any result); with --overwrite the run goes again
    assert main(_argv(encoder, glue_dir, out, "--set", "optim.warmup=0.2")) == 2
    assert "another model or recipe" in capsys.readouterr().err
    monkeypatch.undo()
    started = _diverging_at(monkeypatch, set())
    assert main(_argv(encoder, glue_dir, out, "--set", "optim.warmup=0.2", "--overwrite", "--lrs", "5e-5")) == 0
    assert started == [5e-5]
    assert json.loads((out / "glue_results.json").read_text())["diverged"] == []


def test_any_other_user_error_still_stops_the_suite(encoder, tmp_path, monkeypatch, capsys):
    """Only the runner's non-finite stop is caught: a bad file's UserError (even one worded like it) stops the
    suite in one line, with nothing recorded."""
    from bertforge.finetune import runner

    glue_dir, out = write_rte(tmp_path / "glue"), tmp_path / "out"

    def bad(run, cfg, log=print):
        raise UserError("20 non-finite gradient steps in a row: no, a bad file (train.tsv line 3)")

    monkeypatch.setattr(runner, "run_finetune", bad)
    assert main(_argv(encoder, glue_dir, out)) == 2
    one_line(capsys.readouterr().err, "a bad file (train.tsv line 3)")
    assert not (out / "results").exists()


def _rec(task: str, lr: float, seed: int, diverged: bool = False, **metrics: float) -> dict:
    rec = {"task": task, "lr": lr, "seed": seed, "metrics": {} if diverged else metrics}
    return {**rec, "diverged": "1 non-finite gradient steps in a row at update 1 (fp32)"} if diverged else rec


def test_a_task_whose_every_run_diverged_shows_it_not_a_number(tmp_path):
    """Every lr of CoLA diverged: the table says so in its cell, the averages that count CoLA are None / "-"
    (not the other tasks' mean, nor NaN), and the seeds of a kept lr that diverged are counted beside it."""
    results = [
        _rec("cola", 2e-5, 1, diverged=True),
        _rec("cola", 5e-5, 1, diverged=True),
        _rec("rte", 2e-5, 1, accuracy=60.0),
        _rec("rte", 2e-5, 2, diverged=True),
        _rec("rte", 5e-5, 1, accuracy=55.0),
        _rec("rte", 5e-5, 2, accuracy=57.0),
    ]
    t = suite.aggregate(results)
    cola, rte = t["tasks"]["cola"], t["tasks"]["rte"]
    assert cola["score"] is None and cola["metrics"] is None and cola["lr"] is None
    assert cola["median_score_per_lr"] == {"2e-05": None, "5e-05": None}
    assert rte["lr"] == 2e-5 and rte["score"] == 60.0 and rte["seeds"] == [1]  # 60 (one seed) > median 56
    assert t["average"] is None and t["avg_no_wnli"] is None
    assert [d["task"] for d in t["diverged"]] == ["cola", "cola", "rte"]
    json.dumps(t, allow_nan=False)  # strict JSON
    md = suite.markdown_table(t, "tiny")
    assert "| tiny | diverged | 60.0 | - | - |" in md
    assert "| seeds | 0 (+2 diverged) | 1 (+1 diverged) |  |  |" in md
    assert "Every run of cola diverged" in md
    assert suite.plot_table(results, t, tmp_path / "g.png").read_bytes()[:4] == b"\x89PNG"
    # WNLI alone without a score: Avg is "-", Avg w/o WNLI still the other tasks'
    t = suite.aggregate([_rec("rte", 2e-5, 1, accuracy=60.0), _rec("wnli", 2e-5, 1, diverged=True)])
    assert t["average"] is None and t["avg_no_wnli"] == 60.0


def test_a_hand_edited_result_without_metrics_is_run_again(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"lr": 2e-5, "seed": 1, "metrics": {}, "fingerprint": {}}))
    assert suite.read_result(path, {}, overwrite=False) is None
    path.write_text(json.dumps({"lr": 2e-5, "seed": 1, "metrics": {}, "diverged": "x", "fingerprint": {}}))
    assert suite.read_result(path, {}, overwrite=False) is not None


def test_the_hf_baseline_trains_on_mlm_only_shards(tmp_path, monkeypatch):
    """On MLM-only shards (`data shards --objective mlm`: no NSP labels) BertForPreTraining returned loss None and
    the baseline's first step failed with AttributeError ('NoneType' object has no attribute 'backward'). The
    baseline is now run_mlm.py's BertForMaskedLM there, trained and scored on the same batches; a
    BertForPreTraining given such a batch says what to do in one line."""
    import torch

    from bertforge.bench import baseline, quality
    from bertforge.model.hf_interop import load_pretrained

    p = hf_side_params(tmp_path, monkeypatch, "shards.objective=mlm", "train.objective=mlm", 1, 1)
    side = quality.hf_side(p, tmp_path / "hf")
    assert side["steps"] == 2 and 0.0 <= side["curve"][-1]["acc"] <= 1.0
    # the saved model is one the GLUE side fine-tunes (encoder weights found, a fresh pooler and classifier)
    model, _ = load_pretrained(side["model_dir"], "classification", num_labels=2, allow_missing_head=True)
    assert isinstance(model, torch.nn.Module)

    loader, _ = quality.ours_data(p)
    batch = next(loader.iterate())
    assert "nsp_labels" not in batch
    config = quality.same_model(p, 600)
    pre, opt = baseline.hf_pretraining(config, torch.device("cpu"))  # BertForPreTraining, as before
    with pytest.raises(UserError, match="needs NSP labels, and these batches are MLM-only .*objective='mlm'"):
        baseline.hf_step(pre, opt, batch, torch.device("cpu"), "fp32")


def test_quality_result_json_is_strict_when_ours_never_reaches_the_target(tmp_path, monkeypatch):
    """Ours below the baseline's final accuracy all along: result.json held `ours_seconds_to_target: Infinity`
    (and the time share), which strict JSON parsers reject, and report.md said "inf" and "inf%". Now null and
    "not reached"; the bench harness (floats only) still gets inf, and a GLUE average that does not exist (every
    run of a task diverged) is null in result.json and left out of what the harness records."""
    from bertforge.bench import quality

    out = tmp_path / "q"
    for k, accs in {"ours": [0.01, 0.02], "hf": [0.05, 0.12]}.items():
        curve = [{"train_s": 10.0 * (i + 1), "step": 5 * (i + 1), "acc": a} for i, a in enumerate(accs)]
        (out / k).mkdir(parents=True)
        (out / k / "side.json").write_text(json.dumps({"curve": curve, "steps": 10, "model_dir": f"/models/{k}"}))
    table = {"tasks": {"rte": {"metrics": None, "spread": None, "lr": None, "seeds": [], "score": None}}}
    monkeypatch.setattr(
        quality, "_glue", lambda p, m, w, c: {**table, "average": None, "avg_no_wnli": None, "seeds": [1]}
    )
    r = quality.quality_budget(str(out), "d", "e", "v", budget_s=20, sides=[], glue_dir="glue")
    assert r["ours_seconds_to_target"] == math.inf and "ours_glue_avg" not in r

    def strict(name: str):
        raise ValueError(f"{name} is not JSON")

    saved = json.loads((out / "result.json").read_text(), parse_constant=strict)["result"]
    assert saved["ours_seconds_to_target"] is None and saved["ours_time_share"] is None
    assert saved["hf_seconds_to_target"] == 20.0 and saved["ours_glue_avg"] is None
    md = (out / "report.md").read_text()
    assert "| 0.0200 | not reached |" in md and "Target 0.1200; ours did not reach it." in md
    assert "inf" not in md
