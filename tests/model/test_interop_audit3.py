"""Interop audit (3): the one owner of ModernBERT's hidden -> embedding dropout rule (`BertConfig.replace`), an
untied masked-LM checkpoint as the start of another head or of an encoder export, and the encoder export of a
checkpoint whose head has another width than its config's label count."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers

from bertforge.config import ModelConfig
from bertforge.errors import UserError
from bertforge.finetune.config import FinetuneModelConfig
from bertforge.model import BertConfig, build_model
from bertforge.model.hf_interop import load_pretrained, save_pretrained
from bertforge.serve.export import export_hf

V, T = 99, 12
SMALL = dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def batch(pad: int):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, V, (2, T), generator=g)
    mask = (torch.arange(T)[None] < torch.tensor([[T], [7]])).long()
    return ids.masked_fill(mask == 0, pad), mask


# ------------------------------------------------------------------ ModernBERT's embedding dropout: one rule
def test_replace_owns_the_hidden_to_embedding_dropout_rule():
    """A ModernBERT config that states its embedding rate (every ModernBERT config.json does) given a new hidden
    rate takes it for the embeddings too, as a preset built with that rate; an embedding rate given beside it
    wins; classifier_dropout and BERT's configs are untouched."""
    file = BertConfig.from_preset("modernbert-tiny", vocab_size=64, embedding_dropout=0.05, classifier_dropout=0.0)
    preset = BertConfig.from_preset("modernbert-tiny", vocab_size=64, hidden_dropout_prob=0.2)
    new = file.replace(hidden_dropout_prob=0.2)
    assert new.embedding_dropout_rate == preset.embedding_dropout_rate == 0.2
    assert new.classifier_dropout_rate == 0.0  # the file's, as documented (a null would follow)
    assert file.replace(hidden_dropout_prob=0.2, embedding_dropout=0.3).embedding_dropout_rate == 0.3
    assert file.replace(attention_probs_dropout_prob=0.1).embedding_dropout_rate == 0.05
    bert = BertConfig.from_preset("tiny", vocab_size=64).replace(hidden_dropout_prob=0.3)
    assert bert.embedding_dropout_rate == 0.3 and bert.classifier_dropout is None
    with pytest.raises(Exception, match="hidden_dropout_prob"):
        file.replace(hidden_dropout_prob=1.5)  # still validated


@pytest.mark.parametrize(
    "overrides",
    [ModelConfig(hidden_dropout=0.2).loaded_overrides(), FinetuneModelConfig(hidden_dropout=0.2).overrides()],
    ids=["pretrain_init_from", "finetune"],
)
def test_a_loaded_modernbert_drops_its_embeddings_at_the_hidden_rate(tmp_path, overrides):
    """Pre-training's model.init_from and fine-tuning's dropout give load_pretrained the hidden rate: the model's
    embedding dropout is that rate (as a preset run's), not the saved file's explicit embedding_dropout."""
    config = BertConfig.from_preset("modernbert-tiny", vocab_size=64, hidden_dropout_prob=0.05)
    save_pretrained(build_model(config, "mlm"), config, tmp_path / "m", "mlm")
    assert json.loads((tmp_path / "m" / "config.json").read_text())["embedding_dropout"] == 0.05
    model, loaded = load_pretrained(tmp_path / "m", "mlm", config_overrides=overrides)
    assert loaded.embedding_dropout_rate == 0.2 == model.bert.embeddings.drop.p
    preset = BertConfig.from_preset("modernbert-tiny", vocab_size=64, hidden_dropout_prob=0.2)
    assert loaded.embedding_dropout_rate == preset.embedding_dropout_rate


# ------------------------------------------------------------------ untied masked-LM checkpoints
FAMILIES = {
    "bert": (transformers.BertConfig, "BertForMaskedLM", {"max_position_embeddings": 40}, 0),
    "roberta": (transformers.RobertaConfig, "RobertaForMaskedLM", dict(max_position_embeddings=40, pad_token_id=1), 1),
    "modernbert": (
        transformers.ModernBertConfig,
        "ModernBertForMaskedLM",
        {"max_position_embeddings": 64, "pad_token_id": 0, "local_attention": 8, "global_attn_every_n_layers": 2},
        0,
    ),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_an_untied_masked_lm_checkpoint_starts_other_heads_and_exports_its_encoder(tmp_path, family):
    """transformers loads an untied (tie_word_embeddings false) masked-LM checkpoint for any other head, ignoring
    its decoder; so do we (the decoder listed as ignored), and `export --task embed` writes its encoder with
    transformers' hidden states. Only a masked-LM head, which bertforge ties, still refuses it."""
    cfg_cls, cls, kw, pad = FAMILIES[family]
    torch.manual_seed(0)
    getattr(transformers, cls)(cfg_cls(**SMALL, **kw, tie_word_embeddings=False)).save_pretrained(tmp_path / "src")
    ids, mask = batch(pad)
    with torch.no_grad():
        want = transformers.AutoModel.from_pretrained(tmp_path / "src").eval()(input_ids=ids, attention_mask=mask)
    model, _ = load_pretrained(tmp_path / "src", "classification", allow_missing_head=True)
    assert any("decoder.weight" in k for k in model.hf_load_info["ignored"])
    with torch.no_grad():
        got = model.eval().bert(ids, mask)
    real = mask.bool()
    torch.testing.assert_close(got[real], want.last_hidden_state[real], atol=1e-5, rtol=0)
    with pytest.raises(UserError, match="untied decoder"):
        load_pretrained(tmp_path / "src", "mlm")
    export_hf(tmp_path / "src", tmp_path / "out", task="embed")
    with torch.no_grad():
        again = transformers.AutoModel.from_pretrained(tmp_path / "out").eval()(input_ids=ids, attention_mask=mask)
    torch.testing.assert_close(again.last_hidden_state[real], want.last_hidden_state[real], atol=1e-5, rtol=0)


# ------------------------------------------------------------------ encoder export of a head of another width
def test_the_encoder_of_a_multiple_choice_checkpoint_exports(tmp_path):
    """A BertForMultipleChoice holds a one-output classifier while its config.json names two labels: the head is
    not exported with --task embed, so its width must not stop the export; the pooler and encoder come back
    exactly, and no classifier is written."""
    torch.manual_seed(0)
    src = transformers.BertForMultipleChoice(transformers.BertConfig(**SMALL, max_position_embeddings=40))
    src.save_pretrained(tmp_path / "src")
    export_hf(tmp_path / "src", tmp_path / "out", task="embed")
    back, info = transformers.AutoModel.from_pretrained(tmp_path / "out", output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    ids, mask = batch(0)
    with torch.no_grad():
        want, got = src.bert.eval()(ids, mask), back.eval()(ids, mask)
    torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, atol=0, rtol=0)
    torch.testing.assert_close(got.pooler_output, want.pooler_output, atol=0, rtol=0)
    assert json.loads((Path(tmp_path / "out") / "config.json").read_text())["architectures"] == ["BertModel"]
