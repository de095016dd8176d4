"""The GLUE suite (`bertforge finetune --task glue`): official metrics on hand-checked examples, the table's
aggregation (lr choice, medians, spread, GLUE average), and crash-then-resume on tiny GLUE files."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from tests.helpers import one_line

from bertforge.cli import main
from bertforge.errors import UserError
from bertforge.finetune import glue, suite

WORDS = ["good", "bad", "fine", "awful", "great", "poor", "nice", "dull", "film", "plot", "actor", "scene"]
SETS = [
    "train.global_batch_size=8",
    "train.micro_batch_size=8",
    "train.precision=fp32",
    "train.device=cpu",
    "train.tensorboard=false",
    "train.log_every=100",
    "task.max_seq_len=32",
]


@pytest.fixture(scope="module")
def encoder(tiny_encoder_factory) -> Path:
    """A tiny random pre-trained BERT with a word-level vocab.txt of WORDS."""
    return tiny_encoder_factory(WORDS)


def _sentence(i: int) -> str:
    return f"{WORDS[i % 6]} {WORDS[6 + i % 6]} ."


def _row(task: str, i: int) -> str:
    """One GLUE-format TSV row of `task` (columns as glue_data lays them out)."""
    a, b, y = _sentence(i), _sentence(i + 1), i % 2
    return {
        "cola": f"src\t{y}\t*\t{a}",
        "sst2": f"{a}\t{y}",
        "mrpc": f"{y}\t1\t2\t{a}\t{b}",
        "stsb": f"{i}\tg\tf\ty\t0\ts1\ts2\t{a}\t{b}\t{(i % 6) * 5 / 6:.2f}",
        "rte": f"{i}\t{a}\t{b}\t{('entailment', 'not_entailment')[y]}",
        "wnli": f"{i}\t{a}\t{b}\t{y}",
        "mnli": "\t".join([str(i)] + ["x"] * 7 + [a, b, ("contradiction", "entailment", "neutral")[i % 3]]),
    }[task]


def write_glue(root: Path, tasks=("cola", "sst2", "mrpc", "stsb", "rte", "wnli"), n_train=24, n_dev=8) -> Path:
    """A tiny glue_data directory: train.tsv and dev file(s) per task, with the real files' headers."""
    for task in tasks:
        spec = glue.get_task(task)
        d = root / spec.dir
        d.mkdir(parents=True, exist_ok=True)
        head = ["header"] if spec.header else []
        (d / "train.tsv").write_text("\n".join(head + [_row(task, i) for i in range(n_train)]) + "\n")
        for f in spec.dev_files:
            (d / f).write_text("\n".join(head + [_row(task, i + 3) for i in range(n_dev)]) + "\n")
    return root


# ------------------------------------------------------------------------------------------- metrics
def test_official_metrics_on_hand_checked_examples():
    # 6 binary predictions: tp=2 (rows 0,1) fn=1 (row 2) fp=1 (row 3) tn=2 (rows 4,5)
    y = [1, 1, 1, 0, 0, 0]
    logits = np.array([[0, 1], [0, 1], [1, 0], [0, 1], [1, 0], [1, 0]], dtype=float)
    # accuracy 4/6; F1 = 2tp/(2tp+fp+fn) = 4/6; MCC = (tp tn - fp fn)/sqrt(3*3*3*3) = (4-1)/9 = 1/3
    assert glue.evaluate("sst2", logits, y) == pytest.approx({"accuracy": 4 / 6})
    assert glue.evaluate("mrpc", logits, y) == pytest.approx({"f1": 4 / 6, "accuracy": 4 / 6})
    assert glue.evaluate("cola", logits, y) == pytest.approx({"mcc": 1 / 3})
    assert glue.evaluate("rte", logits, [0, 0, 0, 1, 1, 1])["accuracy"] == pytest.approx(2 / 6)
    # regression: x = 1,2,3,4 vs y = 1,3,2,5. Pearson: centred x -1.5,-.5,.5,1.5 and y -1.75,.25,-.75,2.25;
    # sum xy = 2.625+(-.125)+(-.375)+3.375 = 5.5; sum x^2 = 5; sum y^2 = 3.0625+.0625+.5625+5.0625 = 8.75
    # -> 5.5/sqrt(43.75). Spearman: ranks of y are 1,3,2,4 -> 1 - 6*(0+1+1+0)/(4*15) = 0.8
    scores = glue.evaluate("stsb", np.array([1.0, 2, 3, 4]), [1.0, 3, 2, 5])
    assert scores == pytest.approx({"pearson": 5.5 / math.sqrt(43.75), "spearman": 0.8})
    # ties get average ranks: x = 1,1,2 -> 1.5,1.5,3 against y = 1,2,3: pearson of (1.5,1.5,3),(1,2,3) = sqrt(3)/2
    assert glue.evaluate("stsb", np.array([1.0, 1, 2]), [1.0, 2, 3])["spearman"] == pytest.approx(math.sqrt(3) / 2)


def test_task_metrics_read_the_runners_keys():
    assert suite.task_metrics("mrpc", {"f1": 0.8, "accuracy": 0.7, "main": 0.8, "eval_s": 1.0}) == pytest.approx(
        {"f1": 80.0, "accuracy": 70.0}
    )
    best = {"dev_matched/accuracy": 0.81, "dev_mismatched/accuracy": 0.79, "main": 0.81}
    assert suite.task_metrics("mnli", best) == pytest.approx({"m_accuracy": 81.0, "mm_accuracy": 79.0})


def _rec(task, lr, seed, **metrics):
    return {"task": task, "lr": lr, "seed": seed, "metrics": metrics}


def test_aggregate_picks_lr_by_median_and_averages_like_glue():
    results = [
        # lr 2e-5: scores 50, 60, 90 (median 60); lr 3e-5: 58, 59, 61 (median 59) -> 2e-5 kept despite lower mean
        _rec("cola", 2e-5, 1, mcc=50.0),
        _rec("cola", 2e-5, 2, mcc=60.0),
        _rec("cola", 2e-5, 3, mcc=90.0),
        _rec("cola", 3e-5, 1, mcc=58.0),
        _rec("cola", 3e-5, 2, mcc=59.0),
        _rec("cola", 3e-5, 3, mcc=61.0),
        # two metrics: the task score is their mean; medians per metric
        _rec("mrpc", 2e-5, 1, f1=80.0, accuracy=70.0),
        _rec("mrpc", 2e-5, 2, f1=90.0, accuracy=80.0),
        _rec("mrpc", 2e-5, 3, f1=84.0, accuracy=76.0),
        _rec("wnli", 2e-5, 1, accuracy=40.0),
    ]
    t = suite.aggregate(results)
    cola, mrpc = t["tasks"]["cola"], t["tasks"]["mrpc"]
    assert cola["lr"] == 2e-5 and cola["score"] == 60.0 and cola["spread"] == 40.0
    assert cola["median_score_per_lr"] == {"2e-05": 60.0, "3e-05": 59.0}
    assert mrpc["metrics"] == {"f1": 84.0, "accuracy": 76.0}
    assert mrpc["seed_scores"] == [75.0, 85.0, 80.0] and mrpc["score"] == 80.0 and mrpc["spread"] == 10.0
    assert t["average"] == pytest.approx((60 + 80 + 40) / 3)
    assert t["avg_no_wnli"] == pytest.approx(70.0)
    md = suite.markdown_table(t, "tiny")
    assert "| tiny | 60.0 | 84.0/76.0 | 40.0 | 60.0 | 70.0 |" in md
    assert list(t["tasks"]) == ["cola", "mrpc", "wnli"]  # the papers' order


def test_present_tasks_skips_tasks_without_training_file(tmp_path):
    root = write_glue(tmp_path / "glue", tasks=("sst2", "rte"))
    (root / "QNLI").mkdir()
    (root / "QNLI" / "dev.tsv").write_text("header\n")
    said = []
    assert suite.present_tasks(root, (), said.append) == ["sst2", "rte"]
    assert any("qnli" in s and "train.tsv" in s for s in said)
    with pytest.raises(UserError, match="not GLUE tasks"):
        suite.present_tasks(root, ["sst"])
    # a task asked for by name that lacks a file: an error, not a skip after the others ran
    with pytest.raises(UserError, match="--tasks qnli: .*QNLI lacks train.tsv"):
        suite.present_tasks(root, ["qnli", "rte"])
    # a folder of another name (Hugging Face's lower-case sst2/) is said, not silently left out
    (root / "sst2").mkdir()
    said.clear()
    assert suite.present_tasks(root, (), said.append) == ["sst2", "rte"]
    assert any("ignoring sst2/" in s for s in said)


# ------------------------------------------------------------------------------------------- end to end
def _argv(encoder, glue_dir, out, *extra):
    argv = ["finetune", "--task", "glue", "--glue-dir", str(glue_dir), "--model", str(encoder)]
    argv += ["--output-dir", str(out), "--epochs", "1", *extra]
    return argv + [x for s in SETS for x in ("--set", s)]


def test_suite_crash_then_resume(encoder, tmp_path, monkeypatch, capsys):
    """A crash in the second task: the re-run skips the first task's finished runs and continues."""
    from bertforge.finetune import runner

    glue_dir = write_glue(tmp_path / "glue", tasks=("sst2", "stsb", "mnli"))
    out = tmp_path / "out"
    calls = []
    real = runner.run_finetune

    def crashing(run, cfg, log=print):
        calls.append((run.task, cfg.optim.lr, cfg.train.seed))
        if run.task == "stsb":
            raise RuntimeError("injected crash")
        return real(run, cfg, log)

    monkeypatch.setattr(runner, "run_finetune", crashing)
    argv = _argv(encoder, glue_dir, out, "--seeds", "1,2", "--max-train-examples", "16")
    with pytest.raises(RuntimeError, match="injected"):
        main(argv)
    assert calls == [("sst2", 2e-5, 1), ("sst2", 2e-5, 2), ("stsb", 2e-5, 1)]
    assert sorted(p.name for p in (out / "results" / "sst2").iterdir()) == ["lr2e-05_seed1.json", "lr2e-05_seed2.json"]
    assert not (out / "results" / "stsb").exists()
    assert not (out / "runs" / "sst2" / "lr2e-05_seed1" / "best").exists()  # models are not kept by default

    calls.clear()
    monkeypatch.setattr(
        runner, "run_finetune", lambda run, cfg, log=print: calls.append(run.task) or real(run, cfg, log)
    )
    assert main(argv) == 0
    assert calls == ["stsb", "stsb", "mnli", "mnli"]  # sst2 not redone
    table = json.loads((out / "glue_results.json").read_text())
    assert list(table["tasks"]) == ["sst2", "stsb", "mnli"]
    assert set(table["tasks"]["mnli"]["metrics"]) == {"m_accuracy", "mm_accuracy"}
    assert table["runs"][0]["train_rows"] == 16
    md = (out / "glue_results.md").read_text()
    assert "MNLI (m/mm acc)" in md and "STS-B (P/S corr)" in md
    assert (out / "glue_results.png").read_bytes()[:4] == b"\x89PNG"
    # a re-run of one task rewrites the table: it keeps the other tasks' results of the same recipe and grid
    calls.clear()
    capsys.readouterr()
    assert main([*argv, "--tasks", "stsb"]) == 0
    assert calls == []
    assert list(json.loads((out / "glue_results.json").read_text())["tasks"]) == ["sst2", "stsb", "mnli"]
    assert "the table keeps mnli from the earlier runs" in capsys.readouterr().out
    # ... as the grid asked for now: the other tasks' medians are over the seeds this command names
    assert main([*argv, "--tasks", "stsb", "--seeds", "1"]) == 0 and calls == []
    assert json.loads((out / "glue_results.json").read_text())["tasks"]["sst2"]["seeds"] == [1]
    capsys.readouterr()
    assert main([*argv, "--tasks", "stsb", "--seeds", "1,3"]) == 0 and calls == ["stsb"]
    assert list(json.loads((out / "glue_results.json").read_text())["tasks"]) == ["stsb"]
    assert "the table leaves sst2 out: 1 of its 2 runs of this grid" in capsys.readouterr().out


def test_features_are_tokenized_once_per_task(encoder, tmp_path, monkeypatch):
    from bertforge.finetune import runner

    glue_dir = write_glue(tmp_path / "glue", tasks=("rte",))
    built = []
    real = runner.glue_task_data
    monkeypatch.setattr(runner, "glue_task_data", lambda *a: built.append(1) or real(*a))
    opts = suite.SuiteOptions(
        str(glue_dir), str(encoder), str(tmp_path / "out"), seeds=[1, 2], lrs=[1e-4, 3e-4], epochs=1, overrides=SETS
    )
    table = suite.run_suite(opts, log=lambda s: None)
    assert len(built) == 1 and len(table["tasks"]["rte"]["median_score_per_lr"]) == 2
    # another model in the same output dir: its results are refused, not mixed in (a copy of the same files is
    # the same model: see the fingerprint test)
    from safetensors.torch import load_file, save_file

    other = tmp_path / "other_model"
    shutil.copytree(encoder, other)
    weights = load_file(other / "model.safetensors")
    save_file({k: v + 1 if k == next(iter(weights)) else v for k, v in weights.items()}, other / "model.safetensors")
    with pytest.raises(UserError, match="another model or recipe"):
        suite.run_suite(suite.SuiteOptions(**{**opts.__dict__, "model": str(other)}), log=lambda s: None)


def test_suite_flags_are_refused_for_one_task(encoder, tmp_path, capsys):
    assert main(["finetune", "--task", "rte", "--model", str(encoder), "--seeds", "1,2", "--glue-dir", str(tmp_path)])
    assert "--seeds belong to --task glue" in capsys.readouterr().err
    assert main(["finetune", "--task", "glue", "--model", str(encoder)])
    assert "needs --glue-dir" in capsys.readouterr().err


def test_the_suite_under_torchrun_is_refused(encoder, tmp_path, capsys, monkeypatch):
    """Every rank ran the whole grid, wrote the same results and printed the table."""
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    argv = ["finetune", "--task", "glue", "--glue-dir", str(tmp_path), "--model", str(encoder)]
    assert main(argv) == 2
    assert "runs its grid in one process" in capsys.readouterr().err


def _fails_before_any_run(argv: list[str], out: Path, capsys, monkeypatch) -> str:
    """rc 2, one line, no run started and no result written."""
    from bertforge.finetune import runner

    started = []
    monkeypatch.setattr(runner, "run_finetune", lambda *a, **k: started.append(a))
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert not started and not (out / "results").exists()
    return err


def test_every_input_is_checked_before_the_first_run(encoder, tmp_path, capsys, monkeypatch):
    """A bad last task's dev file, a bad lr or seed of the grid, a result file of another recipe, --epochs 0:
    refused before CoLA trains, not hours into the grid."""
    glue_dir = write_glue(tmp_path / "glue", tasks=("cola", "wnli"))
    out = tmp_path / "out"
    bad = glue_dir / "WNLI" / "dev.tsv"
    good = bad.read_text()
    bad.write_text(good.replace("\t0\n", "\tmaybe\n", 1))
    err = _fails_before_any_run(_argv(encoder, glue_dir, out), out, capsys, monkeypatch)
    assert f"{bad}:" in err and "label 'maybe' is not one of 0, 1" in err
    bad.write_text(good)
    err = _fails_before_any_run(_argv(encoder, glue_dir, out, "--lrs", "2e-5,-1"), out, capsys, monkeypatch)
    assert "--task glue, lr -1, seed 42: optim.lr must be a finite number > 0, got -1.0" in err
    err = _fails_before_any_run(_argv(encoder, glue_dir, out, "--seeds", "1,-1"), out, capsys, monkeypatch)
    assert "--task glue, lr 2e-05, seed -1: train.seed must be >= 0, got -1" in err
    argv = [*_argv(encoder, glue_dir, out), "--epochs", "0"]  # the last --epochs counts
    assert "train.epochs must be a finite number > 0, got 0.0" in _fails_before_any_run(argv, out, capsys, monkeypatch)
    other = suite.result_path(out, "wnli", 2e-5, 42)
    other.parent.mkdir(parents=True)
    record = {"fingerprint": {"model": "another"}, "metrics": {"accuracy": 50}, "lr": 2e-5, "seed": 42}
    other.write_text(json.dumps(record))
    started = []
    monkeypatch.setattr("bertforge.finetune.runner.run_finetune", lambda *a, **k: started.append(a))
    assert main(_argv(encoder, glue_dir, out)) == 2
    err = capsys.readouterr().err
    assert "is the result of another model or recipe (model, " in err and not started
    other.write_text(json.dumps([1, 2]))  # hand-edited into something else: run again, not a traceback
    assert suite.read_result(other, {}, overwrite=False) is None


def test_a_signal_stops_the_suite_in_one_line_and_a_rerun_goes_on(encoder, tmp_path, capsys, monkeypatch):
    """SIGTERM in the second run: its interrupted/ saved, one line, exit 143; the re-run keeps the first run's
    result and runs the second again."""
    import os
    import signal

    from bertforge.finetune import runner

    glue_dir = write_glue(tmp_path / "glue", tasks=("rte",))
    out = tmp_path / "out"
    argv = _argv(encoder, glue_dir, out, "--seeds", "1,2")
    real_step, real_run = runner.train_step, runner.run_finetune
    runs = []

    def signalled(step_fn, *args, **kwargs):
        if runs[-1] == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # the loop finishes this update, then stops
        return real_step(step_fn, *args, **kwargs)

    monkeypatch.setattr(runner, "train_step", signalled)
    monkeypatch.setattr(
        runner, "run_finetune", lambda r, c, log=print: runs.append(c.train.seed) or real_run(r, c, log)
    )
    assert main(argv) == 143
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("bertforge finetune: received SIGTERM: saved the model after update 1 as ")
    assert err[-1].endswith(f"the finished runs are in {out / 'results'}: run the same command again to go on")
    assert (out / "runs" / "rte" / "lr2e-05_seed2" / "interrupted" / "config.json").is_file()
    assert [p.name for p in (out / "results" / "rte").iterdir()] == ["lr2e-05_seed1.json"]
    monkeypatch.setattr(runner, "train_step", real_step)
    runs.clear()
    assert main(argv) == 0
    assert runs == [2]  # seed 1 was done
    assert len(json.loads((out / "glue_results.json").read_text())["runs"]) == 2


def test_a_signal_during_a_runs_final_evaluation_still_stops_the_suite(encoder, tmp_path, capsys, monkeypatch):
    """SIGTERM while the first run evaluated after its last update: no step boundary was left to act on it, so
    it was dropped, the suite ran the next run and exited 0. Now the finished run is written and the suite
    stops with 143."""
    import os
    import signal

    from bertforge.finetune import runner

    glue_dir = write_glue(tmp_path / "glue", tasks=("rte",))
    out = tmp_path / "out"
    real_eval, real_run = runner.evaluate, runner.run_finetune
    runs: list[int] = []

    def signalled(s, *args, **kwargs):
        result = real_eval(s, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)
        return result

    monkeypatch.setattr(runner, "evaluate", signalled)
    monkeypatch.setattr(
        runner, "run_finetune", lambda r, c, log=print: runs.append(c.train.seed) or real_run(r, c, log)
    )
    assert main(_argv(encoder, glue_dir, out, "--seeds", "1,2")) == 143
    assert runs == [1]
    assert "after the last step" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--seeds", "1,1"], "--seeds '1,1' names 1 more than once"),
        (["--lrs", "2e-05,0.00002"], "names 2e-05 more than once"),
        (["--set", "train.output_dir=elsewhere"], "use --output-dir instead"),
        (["--set", "train.seed=7"], "use --seeds instead"),
        (["--lrs", "3e-5", "--set", "optim.lr=1e-3"], "use --lrs instead"),
    ],
)
def test_suite_refuses_a_repeated_seed_or_lr_and_the_keys_it_sets_itself(tmp_path, capsys, extra, message):
    """A repeated seed ran twice and counted twice in the median; --set train.output_dir / train.seed / optim.lr
    (with --lrs) were replaced by the suite's own without a word."""
    glue_dir = write_glue(tmp_path / "glue", tasks=("rte",))
    assert main(_argv(tmp_path / "no-model", glue_dir, tmp_path / "out", *extra)) == 2
    one_line(capsys.readouterr().err, message)
    assert not (tmp_path / "out").exists()


def test_a_result_is_another_recipe_when_its_files_change_not_when_another_task_arrives(tmp_path):
    """The fingerprint held names only: an edited dev.tsv, new weights at the same --model path or an edited
    config file reused the old results. Then it held paths and mtimes: the same glue_data re-deployed (new
    times) or the same model copied elsewhere refused every result. A reordered --set, another task's files, or
    the same bytes elsewhere change nothing."""
    import os
    import shutil

    glue_dir = write_glue(tmp_path / "glue", tasks=("rte", "wnli"))
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights")
    opts = suite.SuiteOptions(str(glue_dir), str(model), str(tmp_path / "out"), overrides=["a=1", "b=2"])
    fp = suite.fingerprint(opts, "rte")
    assert suite.fingerprint(dataclasses.replace(opts, overrides=["b=2", "a=1"]), "rte") == fp
    (glue_dir / "WNLI" / "dev.tsv").write_text((glue_dir / "WNLI" / "dev.tsv").read_text() + "\n")
    assert suite.fingerprint(opts, "rte") == fp
    os.utime(glue_dir / "RTE" / "dev.tsv", ns=(1, 1))
    copied = dataclasses.replace(
        opts,
        glue_dir=str(shutil.copytree(glue_dir, tmp_path / "g2")),
        model=str(shutil.copytree(model, tmp_path / "m2")),
    )
    assert suite.fingerprint(copied, "rte") == fp
    for changed, key in ((glue_dir / "RTE" / "dev.tsv", "data"), (model / "model.safetensors", "model")):
        changed.write_bytes(changed.read_bytes() + b"x")
        now = suite.fingerprint(opts, "rte")
        assert [k for k in fp if fp[k] != now[k]] == [key]
        fp = now


def test_a_cell_holds_the_median_runs_metrics_not_per_metric_medians():
    """MRPC seeds (F1, acc) (100, 40), (60, 90), (80, 80): per-metric medians gave 80.0/80.0, a pair no run
    scored, averaging 80 where the median score is 75. The cell is now the median run's: 60.0/90.0."""
    runs = [_rec("mrpc", 2e-5, 1, f1=100.0, accuracy=40.0), _rec("mrpc", 2e-5, 2, f1=60.0, accuracy=90.0)]
    runs.append(_rec("mrpc", 2e-5, 3, f1=80.0, accuracy=80.0))
    t = suite.aggregate(runs)["tasks"]["mrpc"]
    assert t["metrics"] == {"f1": 60.0, "accuracy": 90.0} and t["score"] == 75.0
    # an even count: the two middle runs' mean, which averages to the median score
    t = suite.aggregate([*runs, _rec("mrpc", 2e-5, 4, f1=100.0, accuracy=100.0)])["tasks"]["mrpc"]
    assert t["metrics"] == {"f1": 70.0, "accuracy": 85.0} and t["score"] == 77.5


def test_a_table_of_wnli_alone_is_valid_json():
    """avg_no_wnli was NaN, which json.dumps writes and JSON parsers refuse."""
    results = [{"task": "wnli", "lr": 2e-5, "seed": s, "metrics": {"accuracy": 50.0}} for s in (1, 2)]
    table = suite.aggregate(results)
    assert json.loads(json.dumps(table, allow_nan=False))["avg_no_wnli"] is None
    assert "| 50.0 | 50.0 | - |" in suite.markdown_table(table)
