"""`bertforge finetune` keeps what an earlier run left: an output dir holding another run's records (best/ of
another task or model, a training run's logs for --eval-only, a pre-training run) is refused unless --overwrite,
which deletes only once every start-up check has passed; replacing the same run's best/ is said; SIGTERM saves
interrupted/ and exits 143."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import bertforge
from bertforge.cli import main
from bertforge.finetune import runner


def test_an_earlier_best_is_refused_unless_same_run_or_overwrite(encoder, finetune_argv, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(finetune_argv(encoder, tmp_path, out, "sst2", "train.epochs=1")) == 0
    origin = json.loads((out / "best" / "bertforge_finetune.json").read_text())
    assert origin == {"task": "sst2", "model": str(encoder.resolve())}
    capsys.readouterr()
    # the same task and model again over a finished run: refused, its records kept (a re-run emptied its
    # metrics.jsonl and replaced best/, even when that was the better model)
    log = (out / "metrics.jsonl").read_bytes()
    assert main(finetune_argv(encoder, tmp_path, out, "sst2", "train.epochs=1")) == 2
    err = capsys.readouterr().err
    assert "holds a finished run of this fine-tune (best/, metrics.jsonl, summary.json); pass --overwrite" in err
    assert (out / "metrics.jsonl").read_bytes() == log
    # ... over one that did not finish (a crash, a stop: no summary.json): it runs again, and says so
    (out / "summary.json").unlink()
    assert main(finetune_argv(encoder, tmp_path, out, "sst2", "train.epochs=1")) == 0
    assert f"replacing the earlier run's {out / 'best'}" in capsys.readouterr().out
    # another task into the same directory: refused, best/ untouched
    before = (out / "best" / "model.safetensors").read_bytes()
    assert main(finetune_argv(encoder, tmp_path, out, "cola", "train.epochs=1")) == 2
    err = capsys.readouterr().err
    held = f"best/, metrics.jsonl, summary.json (fine-tuning: task sst2, model {encoder.resolve()})"
    assert f"holds an earlier run's {held}; pass --overwrite" in err and len(err.strip().splitlines()) == 1
    assert (out / "best" / "model.safetensors").read_bytes() == before
    # --overwrite deletes it and starts afresh
    assert main([*finetune_argv(encoder, tmp_path, out, "sst2", "train.epochs=1"), "--overwrite"]) == 0
    assert f"deleted the earlier run's best/, metrics.jsonl, summary.json in {out}" in capsys.readouterr().out


def test_sigterm_saves_interrupted_and_exits(encoder, finetune_argv, tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(Path(bertforge.__file__).parents[1])}
    argv = finetune_argv(encoder, tmp_path, out, "sst2", "train.epochs=500", "train.eval_every=0")
    child = subprocess.Popen(
        [sys.executable, "-m", "bertforge", *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    metrics = out / "metrics.jsonl"
    while not (metrics.is_file() and '"loss"' in metrics.read_text()) and child.poll() is None:
        assert time.monotonic() < deadline, "the child logged no step"
        time.sleep(0.05)
    child.send_signal(signal.SIGTERM)
    stdout, err = child.communicate(timeout=120)
    assert child.returncode == 143, (stdout, err)
    assert "received SIGTERM: saved the model after update" in err and f"as {out / 'interrupted'}" in err
    assert "does not resume" in err
    assert (out / "interrupted" / "config.json").is_file() and (out / "interrupted" / "vocab.txt").is_file()


def _records(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()} | {
        "best": (out / "best" / "model.safetensors").read_bytes()
    }


@pytest.fixture
def earlier_run(encoder, finetune_argv, tmp_path) -> Path:
    """An output dir holding a finished SST-2 fine-tune (best/, metrics.jsonl, summary.json)."""
    out = tmp_path / "out"
    assert main(finetune_argv(encoder, tmp_path, out, "sst2", "train.epochs=1")) == 0
    return out


def _fails_in_one_line(argv: list[str], capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_overwrite_deletes_only_after_every_start_check(
    encoder, finetune_argv, tmp_path, capsys, monkeypatch, earlier_run
):
    """--overwrite with an input that fails at start-up (the optimizer's settings, a negative seed, a sequence
    longer than the model's positions) leaves the earlier run as it was."""
    before = _records(earlier_run)
    argv = [*finetune_argv(encoder, tmp_path, earlier_run, "sst2", "train.epochs=1"), "--overwrite"]

    def refuses(*args, **kwargs):
        raise ValueError("Invalid learning rate (simulated)")  # what torch's optimizers raise for a bad setting

    with monkeypatch.context() as m:
        m.setattr(runner, "optimizer_for", refuses)
        with pytest.raises(ValueError, match="simulated"):
            main(argv)
    assert _records(earlier_run) == before
    assert "train.seed must be >= 0, got -1" in _fails_in_one_line([*argv, "--set", "train.seed=-1"], capsys)
    assert "task.max_seq_len 65 is longer" in _fails_in_one_line([*argv, "--set", "task.max_seq_len=65"], capsys)
    assert _records(earlier_run) == before


def test_eval_only_into_a_training_runs_dir_is_refused(encoder, finetune_argv, tmp_path, capsys, earlier_run):
    """--eval-only would replace metrics.jsonl and summary.json of the run there: refused unless --overwrite;
    an evaluation into its own earlier evaluation's dir goes ahead."""
    model = shutil.copytree(earlier_run / "best", tmp_path / "tuned")
    before = _records(earlier_run)
    argv = finetune_argv(model, tmp_path, earlier_run)
    train = argv.index("--train-file")
    argv = [*argv[:train], *argv[train + 2 :], "--eval-only"]
    err = _fails_in_one_line(argv, capsys)
    assert "holds an earlier run's best/, metrics.jsonl, summary.json (fine-tuning: task sst2" in err
    assert "pass --overwrite to delete it" in err
    assert _records(earlier_run) == before
    assert main([*argv, "--overwrite"]) == 0
    assert not (earlier_run / "best").exists() and json.loads((earlier_run / "summary.json").read_text())["best"]
    assert main(argv) == 0  # the same evaluation again
    # its --model inside what --overwrite deletes: refused, whatever else
    assert main(finetune_argv(encoder, tmp_path, tmp_path / "b", "sst2", "train.epochs=1")) == 0
    inside = [*finetune_argv(tmp_path / "b" / "best", tmp_path, tmp_path / "b"), "--overwrite"]
    assert "is inside train.output_dir" in _fails_in_one_line(inside, capsys)
    assert (tmp_path / "b" / "best" / "model.safetensors").is_file()


def test_a_pretraining_runs_dir_is_refused(encoder, finetune_argv, tmp_path, capsys):
    out = tmp_path / "pre"
    step = out / "checkpoints" / "step_00000002"
    shutil.copytree(encoder, step / "model")
    (step / "meta.json").write_text("{}")
    (out / "metrics.jsonl").write_text('{"step": 2, "loss": 9.5}\n')
    argv = finetune_argv(encoder, tmp_path, out, "sst2", "train.epochs=1")
    err = _fails_in_one_line(argv, capsys)
    assert f"train.output_dir {out} holds an earlier run's checkpoints/, metrics.jsonl (pre-training)" in err
    assert (out / "metrics.jsonl").read_text() == '{"step": 2, "loss": 9.5}\n'
    assert main([*argv, "--overwrite"]) == 0
    assert "deleted the earlier run's checkpoints/, metrics.jsonl" in capsys.readouterr().out
    assert not (out / "checkpoints").exists() and (out / "best").is_dir()
