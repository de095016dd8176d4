"""The model's vocab rows padded to a multiple of 8 (model.pad_vocab_multiple, NVIDIA's 30522 -> 30528): new runs
pad, runs started from a checkpoint keep its rows, and the padded rows are never served as a prediction."""

from __future__ import annotations

import json

import pytest
import torch
from tests.train.conftest import tiny_config as _cfg

from bertforge.errors import ConfigError
from bertforge.train import checkpoint as ckpt
from bertforge.train.loop import run_pretrain

SYNTHETIC = {
    "data.input_dir": "synthetic",
    "data.synthetic_seq_len": 32,
    "data.synthetic_max_pred": 5,
    "data.synthetic_vocab_size": 100,  # not a multiple of 8
    "model.vocab_size": "null",  # the data's size decides
    "train.max_steps": 2,
    "train.save_every": 1,
    "data.eval_dir": "null",
}


def _rows(run) -> int:
    model_dir = ckpt.latest_checkpoint(run / "checkpoints").model_dir
    return json.loads((model_dir / "config.json").read_text())["vocab_size"]


def test_a_new_run_pads_the_vocab_and_one_means_none(shards, tmp_path):
    run_pretrain(_cfg(shards, tmp_path / "a", **SYNTHETIC))
    assert _rows(tmp_path / "a") == 104
    run_pretrain(_cfg(shards, tmp_path / "b", **SYNTHETIC, **{"model.pad_vocab_multiple": 1}))
    assert _rows(tmp_path / "b") == 100
    run_pretrain(_cfg(shards, tmp_path / "c", **SYNTHETIC, **{"model.pad_vocab_multiple": 64}))
    assert _rows(tmp_path / "c") == 128
    with pytest.raises(ConfigError, match="model.pad_vocab_multiple must be >= 1"):
        _cfg(shards, tmp_path / "d", **SYNTHETIC, **{"model.pad_vocab_multiple": 0})


def test_runs_started_from_a_checkpoint_keep_its_rows(shards, tmp_path):
    """A checkpoint written unpadded (or before padding existed) resumes, and starts phase 2, with its 100 rows
    (the default would build 104 and fail on the weights' shape)."""
    unpadded = {**SYNTHETIC, "model.pad_vocab_multiple": 1}
    run_pretrain(_cfg(shards, tmp_path / "p1", **{**unpadded, "train.stop_after_steps": 1}))
    assert run_pretrain(_cfg(shards, tmp_path / "p1", **SYNTHETIC), resume=True)["step"] == 2
    assert _rows(tmp_path / "p1") == 100
    phase2 = {**SYNTHETIC, "train.init_checkpoint": str(tmp_path / "p1")}
    run_pretrain(_cfg(shards, tmp_path / "p2", **phase2))
    assert _rows(tmp_path / "p2") == 100


def test_fill_mask_never_predicts_a_padding_row(tmp_path):
    """Rows past the tokenizer's last id are no token: even when their logits are the largest, the served top-k
    holds real tokens only."""
    from bertforge.data.vocab import train_wordpiece
    from bertforge.model import BertConfig, build_model
    from bertforge.serve.tasks import Limits, Predictor

    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(["the cat sat on the mat. the dog ran to the park."] * 50))
    tok = train_wordpiece([corpus], tmp_path / "wp", vocab_size=60, lowercase=True, unused_tokens=0)
    n = tok.get_vocab_size()
    config = BertConfig.from_preset("tiny", vocab_size=-(-n // 8) * 8 + 8, max_position_embeddings=64)
    model = build_model(config, "mlm").eval()
    head = next(m for name, m in model.named_modules() if name.endswith("predictions"))
    with torch.no_grad():
        head.bias[n:] = 1e4  # the padding rows would win every slot
    p = Predictor("fill-mask", model, tok, Limits(max_seq_len=64, top_k=5))
    out = p({"text": ["the cat [MASK] on the mat."]})
    assert out["token_ids"].max() < n and all(t for t in out["tokens"].ravel())
    assert out["scores"][0, 0].sum() <= 1.0 + 1e-5  # a distribution over the real tokens


def test_a_vocab_with_a_repeated_line_sizes_the_model_by_its_highest_id(shards, tmp_path):
    """A repeated vocab.txt line leaves fewer tokens than ids (`foo` keeps id 8 of 8 unique tokens): the model
    needs 9 rows, or that id has no embedding (an IndexError, a device assert on a GPU)."""
    from bertforge.data.vocab import load_tokenizer
    from bertforge.train.loop import resolve_vocab

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\nhello\nfoo\n")
    tok = load_tokenizer(vocab)
    assert tok.get_vocab_size() == 8 and max(tok.encode("foo hello", add_special_tokens=False).ids) == 8
    cfg = _cfg(shards, tmp_path / "r", **{**SYNTHETIC, "data.vocab": str(vocab), "data.synthetic_vocab_size": 16})
    assert resolve_vocab(cfg, None) == (9, 9, vocab)


def test_resume_with_other_lanes_on_as_many_processes_names_the_rows_per_update(shards, tmp_path):
    """Lanes that change on the same process count (another micro-batch, as modernbert_large_8192's 8 -> 7, or the
    packed shards' sequences per row) were blamed on the process count: "run on 1 to keep them"."""
    from bertforge.errors import UserError

    run_pretrain(_cfg(shards, tmp_path / "r", **{**SYNTHETIC, "train.stop_after_steps": 1}))
    with pytest.raises(UserError, match=r"data lanes 2 -> 4 \(rows per update: train.micro_batch_size") as e:
        run_pretrain(_cfg(shards, tmp_path / "r", **{**SYNTHETIC, "train.micro_batch_size": 2}), resume=True)
    assert "processes: run on" not in str(e.value)
