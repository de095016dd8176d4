"""Continued pre-training from a Hugging Face checkpoint (`model.init_from`): what is loaded must be what
transformers runs, and the run's first loss must be transformers' loss on the same batch."""

from __future__ import annotations

import json

import h5py
import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file
from tests.train.conftest import logged_losses, make_shards
from tests.train.conftest import tiny_config as _cfg

from bertforge.model.hf_interop import load_pretrained
from bertforge.train import checkpoint as ckpt
from bertforge.train.loop import run_pretrain

_SHAPE = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)


def _hf_logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids))
    return out.logits if hasattr(out, "logits") else out.prediction_logits


@pytest.mark.parametrize("model_type", ["bert", "roberta"])
def test_the_decoders_own_bias_is_the_one_loaded(tmp_path, model_type):
    """A file holding the decoder's bias beside a different `cls.predictions.bias` (`lm_head.bias`): transformers
    does not tie them and adds the decoder's; the other was loaded, every logit off by the difference."""
    torch.manual_seed(0)
    if model_type == "bert":
        hf_cfg = transformers.BertConfig(vocab_size=96, max_position_embeddings=32, **_SHAPE)
        cls, head = transformers.BertForMaskedLM, "cls.predictions."
    else:
        hf_cfg = transformers.RobertaConfig(vocab_size=96, max_position_embeddings=34, type_vocab_size=1, **_SHAPE)
        cls, head = transformers.RobertaForMaskedLM, "lm_head."
    cls(hf_cfg).save_pretrained(tmp_path)
    sd = load_file(str(tmp_path / "model.safetensors"))
    sd[head + "decoder.bias"] = sd[head + "bias"] + torch.linspace(-1, 1, 96)
    save_file(sd, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    ours, _ = load_pretrained(tmp_path, "mlm", attention="sdpa")
    ids = torch.randint(5, 96, (2, 12))
    with torch.no_grad():
        got = ours.eval()(ids, torch.ones_like(ids)).mlm_logits
    want = _hf_logits(cls.from_pretrained(tmp_path).eval(), ids)
    torch.testing.assert_close(got, want)


def test_the_first_loss_is_transformers_loss_and_the_save_loads_back(tmp_path):
    """A published BertForPreTraining (30522 rows: kept, not padded to 30528) continued with model.init_from: the
    first logged loss is BertForPreTraining's on the same batch (dropout 0, no update yet), and the checkpoint
    written loads in transformers with the same weights (the decoder tied to the word embeddings)."""
    torch.manual_seed(0)
    no_dropout = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    hf_cfg = transformers.BertConfig(vocab_size=30522, max_position_embeddings=64, **no_dropout, **_SHAPE)
    src = tmp_path / "hf"
    transformers.BertForPreTraining(hf_cfg).save_pretrained(src)
    data = make_shards(tmp_path / "shards", n_shards=1, rows=8, seq_len=32)
    run = tmp_path / "run"
    extra = {"model.init_from": str(src), "model.vocab_size": "null", "train.max_steps": 1}
    extra |= {"train.global_batch_size": 8, "train.micro_batch_size": 8, "train.save_every": 1}
    run_pretrain(_cfg(data, run, **extra))
    with h5py.File(data / "shard_0.hdf5") as h:
        batch = {k: torch.tensor(h[k][:], dtype=torch.long) for k in h}
    labels = torch.full_like(batch["input_ids"], -100).scatter_(1, batch["masked_lm_positions"], batch["masked_lm_ids"])
    kw = dict(input_ids=batch["input_ids"], attention_mask=batch["input_mask"], token_type_ids=batch["segment_ids"])
    hf = transformers.BertForPreTraining.from_pretrained(src).eval()
    with torch.no_grad():
        want = hf(**kw, labels=labels, next_sentence_label=batch["next_sentence_labels"]).loss.item()
    assert logged_losses(run)[1] == pytest.approx(want, rel=1e-5)
    saved = ckpt.latest_checkpoint(run / "checkpoints").model_dir
    assert json.loads((saved / "config.json").read_text())["vocab_size"] == 30522
    back = transformers.BertForPreTraining.from_pretrained(saved).eval()
    assert back.cls.predictions.decoder.weight.data_ptr() == back.bert.embeddings.word_embeddings.weight.data_ptr()
    with torch.no_grad():
        got = back(**kw).prediction_logits
        ref = hf(**kw).prediction_logits
    torch.testing.assert_close(got, ref, atol=1e-3, rtol=0)  # one step of warmup's first (zero) learning rate


def test_a_roberta_config_json_without_eps_or_vocab_reads_as_transformers_reads_it(tmp_path):
    """A hand-written RoBERTa config.json without layer_norm_eps or vocab_size: transformers takes RobertaConfig's
    defaults (1e-12, 50265 rows). We took eps 1e-5 (other logits, silently) and 30522 (refused its weights)."""
    torch.manual_seed(0)
    hf_cfg = transformers.RobertaConfig(max_position_embeddings=34, type_vocab_size=1, **_SHAPE)
    transformers.RobertaForMaskedLM(hf_cfg).save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    for key in ("layer_norm_eps", "vocab_size"):
        del raw[key]
    (tmp_path / "config.json").write_text(json.dumps(raw))
    theirs = transformers.RobertaForMaskedLM.from_pretrained(tmp_path).eval()
    ours, config = load_pretrained(tmp_path, "mlm", attention="sdpa")
    assert (config.layer_norm_eps, config.vocab_size) == (theirs.config.layer_norm_eps, 50265)
    ids = torch.randint(5, 500, (2, 12))
    with torch.no_grad():
        got = ours.eval()(ids, torch.ones_like(ids)).mlm_logits
    torch.testing.assert_close(got, _hf_logits(theirs, ids))


def test_a_masked_lm_checkpoint_continues_with_nsp_and_resumes_without_its_directory(tmp_path, capsys):
    """model.init_from a BertForMaskedLM (no pooler, no NSP head) with the default mlm_nsp objective stopped with
    "head weight(s) missing ... fine-tune one (bertforge finetune)": its missing heads now start fresh, said in one
    line. A --resume then reads the run's own checkpoint, not init_from (moved away here), and a model.vocab_size
    the checkpoint overrides is named as not used."""
    import shutil

    torch.manual_seed(0)
    src = tmp_path / "hf"
    transformers.BertForMaskedLM(
        transformers.BertConfig(vocab_size=64, max_position_embeddings=64, **_SHAPE)
    ).save_pretrained(src)
    data = make_shards(tmp_path / "shards", n_shards=1, rows=16, seq_len=32)
    run = tmp_path / "run"
    extra = {"model.init_from": str(src), "model.vocab_size": 72, "train.max_steps": 2, "train.save_every": 1}
    extra |= {"train.global_batch_size": 8, "train.micro_batch_size": 8}
    run_pretrain(_cfg(data, run, **extra, **{"train.stop_after_steps": 1}))
    out = capsys.readouterr().out
    assert f"model.init_from {src} lacks 4 weight(s), which start fresh: bert.pooler.dense.weight" in out
    assert "vocab_size 72 not used" in out
    shutil.move(src, tmp_path / "moved")
    assert run_pretrain(_cfg(data, run, **extra), resume=True)["step"] == 2


@pytest.mark.parametrize(
    ("model_type", "refusal"),
    [
        ("roberta", "is a roberta model, which has no next-sentence head: set train.objective=mlm"),
        ("bert", "has one token type .*: set train.objective=mlm"),
    ],
)
def test_a_checkpoint_with_one_token_type_is_refused_for_sentence_pairs(tmp_path, model_type, refusal):
    """A RoBERTa (no NSP head), or a BERT with type_vocab_size 1: the pairs' segment 1 has no row (an IndexError
    at the first step, a device assert on a GPU) once a checkpoint's missing NSP head may start fresh; one line
    naming the objective to set."""
    from bertforge.errors import UserError

    src = tmp_path / "hf"
    if model_type == "roberta":
        cfg = transformers.RobertaConfig(vocab_size=64, max_position_embeddings=66, type_vocab_size=1, **_SHAPE)
        transformers.RobertaForMaskedLM(cfg).save_pretrained(src)
    else:
        cfg = transformers.BertConfig(vocab_size=64, max_position_embeddings=64, type_vocab_size=1, **_SHAPE)
        transformers.BertForMaskedLM(cfg).save_pretrained(src)
    data = make_shards(tmp_path / "shards", n_shards=1, rows=8, seq_len=32)
    with pytest.raises(UserError, match=refusal):
        run_pretrain(_cfg(data, tmp_path / "run", **{"model.init_from": str(src), "model.vocab_size": "null"}))
