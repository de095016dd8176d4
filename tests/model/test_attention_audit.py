"""Training mode against `transformers` on the same weights: every dropout of every head sits where Hugging Face
puts it, at the same rate.

Dropout is random, so it is replaced on both sides by a deterministic stand-in that scales its input by 1 + 10p:
with distinct hidden and attention rates, a missing, extra or misplaced dropout, or one at the wrong rate,
changes the output far beyond fp32 noise (the eval-mode parity tests cannot see any of these)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import transformers

from bertforge.model import dropout as bf_dropout
from bertforge.model.hf_interop import load_pretrained

V, T = 97, 12
HIDDEN_P, ATTENTION_P = 0.1, 0.2
HF_CLASSES = {
    "pretraining": "ForPreTraining",
    "mlm": "ForMaskedLM",
    "qa": "ForQuestionAnswering",
    "classification": "ForSequenceClassification",
    "regression": "ForSequenceClassification",
    "token_classification": "ForTokenClassification",
}
CASES = [
    *(("bert", t) for t in ("pretraining", "qa", "classification", "token_classification")),
    *(("roberta", t) for t in ("mlm", "qa", "classification", "token_classification")),
    *(("modernbert", t) for t in ("mlm", "qa", "classification", "token_classification")),
]
OUTPUTS = {  # ours, theirs
    "pretraining": [("mlm_logits", "prediction_logits"), ("nsp_logits", "seq_relationship_logits")],
    "mlm": [("mlm_logits", "logits")],
    "qa": [("start_logits", "start_logits"), ("end_logits", "end_logits")],
    "classification": [("logits", "logits")],
    "regression": [("logits", "logits")],
    "token_classification": [("logits", "logits")],
}


def hf_model(model_type: str, task: str):
    labels = {"regression": 1, "classification": 3, "token_classification": 3}.get(task, 2)
    kw = dict(vocab_size=V, hidden_size=32, num_attention_heads=4, num_labels=labels, attn_implementation="eager")
    if model_type == "modernbert":
        cfg = transformers.ModernBertConfig(
            **kw, intermediate_size=48, num_hidden_layers=3, local_attention=6, max_position_embeddings=64,
            embedding_dropout=HIDDEN_P, mlp_dropout=HIDDEN_P, classifier_dropout=HIDDEN_P,
            attention_dropout=ATTENTION_P, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1,
            sep_token_id=2,
        )  # fmt: skip
        return getattr(transformers, "ModernBert" + HF_CLASSES[task])(cfg)
    kw.update(intermediate_size=64, num_hidden_layers=2, max_position_embeddings=T + 2)
    kw.update(hidden_dropout_prob=HIDDEN_P, attention_probs_dropout_prob=ATTENTION_P)
    if model_type == "roberta":
        cfg = transformers.RobertaConfig(**kw, type_vocab_size=1, pad_token_id=1)
        return getattr(transformers, "Roberta" + HF_CLASSES[task])(cfg)
    return getattr(transformers, "Bert" + HF_CLASSES[task])(transformers.BertConfig(**kw))


@pytest.fixture
def scaling_dropout(monkeypatch):
    """F.dropout (which nn.Dropout, HF's and our eager attention call) as x * (1 + 10p) while training; our
    cheap CPU mask off, so our Dropout modules take F.dropout too."""

    def scale(x, p=0.5, training=True, inplace=False):
        return x * (1 + 10 * p) if training and p > 0 else x

    monkeypatch.setattr(F, "dropout", scale)
    monkeypatch.setattr(bf_dropout, "fast_dropout_usable", lambda x: False)


@pytest.mark.parametrize("model_type,task", CASES)
def test_dropout_sites_and_rates_match_transformers(tmp_path, scaling_dropout, model_type, task):
    torch.manual_seed(0)
    theirs = hf_model(model_type, task)
    theirs.save_pretrained(tmp_path)
    ours, config = load_pretrained(tmp_path, task, theirs.config.num_labels, attention="eager")
    assert (config.hidden_dropout_prob, config.attention_probs_dropout_prob) == (HIDDEN_P, ATTENTION_P)
    pad = 1 if model_type == "roberta" else 0
    ids = torch.randint(3, V, (3, T))
    mask = (torch.arange(T)[None] < torch.tensor([T, 7, 1])[:, None]).long()
    ids = ids.masked_fill(mask == 0, pad)
    o = ours.train()(ids, mask)
    h = theirs.train()(input_ids=ids, attention_mask=mask)
    with torch.no_grad():
        o_eval = ours.eval()(ids, mask)
    for mine, hf in OUTPUTS[task]:
        a, b = getattr(o, mine), getattr(h, hf)
        if a.shape[:2] == mask.shape:  # per-token outputs: padding positions carry no defined value
            a, b, a_eval = a[mask.bool()], b[mask.bool()], getattr(o_eval, mine)[mask.bool()]
        else:
            a_eval = getattr(o_eval, mine)
        assert (a - a_eval).abs().max() > 1e-3, "the stand-in dropout had no effect"  # the control
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0, msg=f"{model_type} {task} {mine}")
