"""Fine-tuning fixtures: a tiny random BERT with a word-level vocab, and the argv of a quick SST-2 run on it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

WORDS = ["good", "bad", "fine", "awful", "great", "poor", "nice", "dull", "film", "plot", "actor", "scene"]


@pytest.fixture(scope="session")
def encoder(tiny_encoder_factory) -> Path:
    """A tiny random pre-trained BERT (our own writer) with a word-level vocab.txt of WORDS."""
    return tiny_encoder_factory(WORDS)


def _sst2(path: Path, n: int) -> Path:
    rows = ["sentence\tlabel"] + [f"{WORDS[i % 6]} {WORDS[6 + i % 6]} .\t{i % 2}" for i in range(n)]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def _argv(encoder: Path, tmp_path: Path, out: Path, task: str = "sst2", *extra: str) -> list[str]:
    train, dev = _sst2(tmp_path / "train.tsv", 32), _sst2(tmp_path / "dev.tsv", 8)
    sets = ["train.global_batch_size=8", "train.micro_batch_size=8", "train.precision=fp32", "train.device=cpu"]
    sets += ["train.plot=false", "train.tensorboard=false", "train.log_every=1", "task.max_seq_len=64", *extra]
    argv = ["finetune", "--task", task, "--model", str(encoder), "--train-file", str(train), "--dev-file", str(dev)]
    return [*argv, "--output-dir", str(out), *(x for s in sets for x in ("--set", s))]


@pytest.fixture(scope="session")
def finetune_argv() -> Callable[..., list[str]]:
    """`finetune_argv(encoder, tmp_path, out, task="sst2", *sets)`: a CPU fp32 SST-2 run (32 rows, batch 8,
    sequences up to the encoder's 64 positions)."""
    return _argv
