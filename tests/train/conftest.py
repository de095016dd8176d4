"""Fixtures of the training tests: small synthetic shards in the NVIDIA schema, written with h5py."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

VOCAB = 64  # ids 0..4: [PAD] [UNK] [CLS] [SEP] [MASK]


def make_shards(
    out: Path, n_shards: int = 4, rows: int = 64, seq_len: int = 32, max_pred: int = 5, seed: int = 0
) -> Path:
    """Rows `[CLS] a a+1 a+2 ... [SEP]` (mod the vocab), variable length, some tokens masked: learnable."""
    rng = np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)
    for s in range(n_shards):
        ids = np.zeros((rows, seq_len), np.int32)
        mask = np.zeros((rows, seq_len), np.int8)
        seg = np.zeros((rows, seq_len), np.int8)
        pos = np.zeros((rows, max_pred), np.int32)
        lab = np.zeros((rows, max_pred), np.int32)
        nsp = rng.integers(0, 2, rows).astype(np.int8)
        for r in range(rows):
            n = int(rng.integers(seq_len // 2, seq_len + 1))
            start = int(rng.integers(5, VOCAB))
            body = [5 + (start - 5 + i) % (VOCAB - 5) for i in range(n - 2)]
            ids[r, :n] = [2, *body, 3]
            mask[r, :n] = 1
            seg[r, n // 2 : n] = 1
            p = np.sort(rng.choice(np.arange(1, n - 1), size=max_pred, replace=False))
            lab[r] = ids[r, p]
            pos[r] = p
            ids[r, p] = 4
        with h5py.File(out / f"shard_{s}.hdf5", "w") as h:
            for k, v in (
                ("input_ids", ids),
                ("input_mask", mask),
                ("segment_ids", seg),
                ("masked_lm_positions", pos),
                ("masked_lm_ids", lab),
                ("next_sentence_labels", nsp),
            ):
                h.create_dataset(k, data=v, compression="gzip")
    return out


@pytest.fixture
def shards(tmp_path) -> Path:
    return make_shards(tmp_path / "shards")


def tiny_overrides(data: Path, out: Path, **extra) -> list[str]:
    """--set overrides of a tiny, fast, deterministic run (no dropout, fp32, in-process loading)."""
    base = {
        "model.preset": "tiny",
        "model.vocab_size": VOCAB,
        "model.max_position_embeddings": 64,
        "model.hidden_dropout": 0.0,
        "model.attention_dropout": 0.0,
        "data.input_dir": str(data),
        "data.num_workers": 0,
        "data.vocab": "null",
        "data.eval_dir": "null",
        "train.output_dir": str(out),
        "train.max_steps": 6,
        "train.global_batch_size": 8,
        "train.micro_batch_size": 4,
        "train.precision": "fp32",
        "train.device": "cpu",
        "train.log_every": 1,
        "train.save_every": 3,
        "train.eval_every": 3,
        "train.tensorboard": False,
        "train.plot": False,
        "optim.lr": 1e-3,
        "optim.warmup": 0.2,
    }
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


@pytest.fixture
def overrides():
    """The `tiny_overrides` function (importlib mode: tests cannot import conftest by name)."""
    return tiny_overrides


def tiny_config(data: Path, out: Path, **extra):
    """The pretrain config of `tiny_overrides`, loaded and validated."""
    from bertforge.config import load_config

    return load_config("pretrain", None, tiny_overrides(data, out, **extra))


def saved_weights(run: Path) -> dict[str, torch.Tensor]:
    """The weights of a run's newest checkpoint."""
    from safetensors.torch import load_file

    from bertforge.train import checkpoint as ckpt

    return load_file(str(ckpt.latest_checkpoint(run / "checkpoints").model_dir / "model.safetensors"))


def logged_losses(run: Path) -> dict[int, float]:
    """step -> training loss, from a run's metrics.jsonl."""
    import json

    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}
