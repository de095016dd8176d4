"""`bertforge finetune` keeps what an earlier run left: best/ of another task or model is refused unless
--overwrite, replacing the same run's best/ is said, and SIGTERM saves interrupted/ and exits 143."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import bertforge
from bertforge.cli import main

WORDS = ["good", "bad", "fine", "awful", "great", "poor", "nice", "dull", "film", "plot", "actor", "scene"]


@pytest.fixture(scope="module")
def encoder(tiny_encoder_factory) -> Path:
    """A tiny random pre-trained BERT with a word-level vocab.txt of WORDS."""
    return tiny_encoder_factory(WORDS)


def _sst2(path: Path, n: int) -> Path:
    rows = ["sentence\tlabel"] + [f"{WORDS[i % 6]} {WORDS[6 + i % 6]} .\t{i % 2}" for i in range(n)]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def _argv(encoder: Path, tmp_path: Path, out: Path, task: str = "sst2", *extra: str) -> list[str]:
    train, dev = _sst2(tmp_path / "train.tsv", 32), _sst2(tmp_path / "dev.tsv", 8)
    sets = ["train.global_batch_size=8", "train.micro_batch_size=8", "train.precision=fp32", "train.device=cpu"]
    sets += ["train.plot=false", "train.tensorboard=false", "train.log_every=1", *extra]
    argv = ["finetune", "--task", task, "--model", str(encoder), "--train-file", str(train), "--dev-file", str(dev)]
    return [*argv, "--output-dir", str(out), *(x for s in sets for x in ("--set", s))]


def test_an_earlier_best_is_refused_unless_same_run_or_overwrite(encoder, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(_argv(encoder, tmp_path, out, "sst2", "train.epochs=1")) == 0
    origin = json.loads((out / "best" / "bertforge_finetune.json").read_text())
    assert origin == {"task": "sst2", "model": str(encoder.resolve())}
    capsys.readouterr()
    # the same task and model again: allowed, and said
    assert main(_argv(encoder, tmp_path, out, "sst2", "train.epochs=1")) == 0
    assert f"replacing the earlier run's {out / 'best'}" in capsys.readouterr().out
    # another task into the same directory: refused, best/ untouched
    before = (out / "best" / "model.safetensors").read_bytes()
    assert main(_argv(encoder, tmp_path, out, "cola", "train.epochs=1")) == 2
    err = capsys.readouterr().err
    assert "earlier run's best/ (task sst2" in err and "--overwrite" in err and len(err.strip().splitlines()) == 1
    assert (out / "best" / "model.safetensors").read_bytes() == before
    # --overwrite deletes it and starts afresh
    assert main([*_argv(encoder, tmp_path, out, "sst2", "train.epochs=1"), "--overwrite"]) == 0
    assert f"deleted the earlier run's best/ in {out}" in capsys.readouterr().out


def test_sigterm_saves_interrupted_and_exits(encoder, tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(Path(bertforge.__file__).parents[1])}
    argv = _argv(encoder, tmp_path, out, "sst2", "train.epochs=500", "train.eval_every=0")
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
