"""Dropout rates read from and written to Hugging Face's config.json: BERT/RoBERTa's `classifier_dropout` (null:
the hidden rate) and ModernBERT's four rates (embedding_dropout, mlp_dropout, attention_dropout,
classifier_dropout) reach the same sites as in `transformers`, and survive a load and a save.

The site and rate checks run both models in training mode with the deterministic dropout stand-in of
test_attention_audit (x * (1 + 10p)), with every rate distinct, so a rate read from the wrong field changes
the logits."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from tests.model import test_attention_audit as audit

from bertforge.errors import ConfigError, UserError
from bertforge.model import build_model
from bertforge.model.config import BertConfig
from bertforge.model.hf_interop import config_from_hf, config_to_hf, load_pretrained, save_pretrained

scaling_dropout = audit.scaling_dropout  # the fixture, under its name here
HIDDEN, ATTENTION, CLASSIFIER, EMBEDDING = 0.1, 0.2, 0.3, 0.05
MODERN_RATES = dict(mlp_dropout=HIDDEN, attention_dropout=ATTENTION, classifier_dropout=CLASSIFIER)
TASK_CLASS = {"qa": "ForQuestionAnswering", "classification": "ForSequenceClassification"}
TASK_CLASS["token_classification"] = "ForTokenClassification"


def labels(task: str) -> int:
    return 2 if task == "qa" else 3


def hf_model(model_type: str, task: str, **rates):
    """A tiny transformers model of `task` with `rates` (its own dropout fields) in its config."""
    kw = dict(
        vocab_size=audit.V, hidden_size=32, num_attention_heads=4, num_labels=labels(task), attn_implementation="eager"
    )
    if model_type == "modernbert":
        cfg = transformers.ModernBertConfig(
            **kw, intermediate_size=48, num_hidden_layers=3, local_attention=6, max_position_embeddings=64,
            pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2, **rates,
        )  # fmt: skip
        return getattr(transformers, "ModernBert" + TASK_CLASS[task])(cfg)
    kw.update(intermediate_size=64, num_hidden_layers=2, max_position_embeddings=audit.T + 2, **rates)
    if model_type == "roberta":
        cfg = transformers.RobertaConfig(**kw, type_vocab_size=1, pad_token_id=1)
        return getattr(transformers, "Roberta" + TASK_CLASS[task])(cfg)
    return getattr(transformers, "Bert" + TASK_CLASS[task])(transformers.BertConfig(**kw))


def assert_same_training_outputs(ours, theirs, model_type: str, task: str) -> None:
    pad = 1 if model_type == "roberta" else 0
    ids = torch.randint(3, audit.V, (3, audit.T))
    mask = (torch.arange(audit.T)[None] < torch.tensor([audit.T, 7, 1])[:, None]).long()
    ids = ids.masked_fill(mask == 0, pad)
    o, h = ours.train()(ids, mask), theirs.train()(input_ids=ids, attention_mask=mask)
    for mine, hf in audit.OUTPUTS[task]:
        a, b = getattr(o, mine), getattr(h, hf)
        if a.shape[:2] == mask.shape:  # per-token outputs: padding positions carry no defined value
            a, b = a[mask.bool()], b[mask.bool()]
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0, msg=f"{model_type} {task} {mine}")


BERT_CASES = [(m, t) for m in ("bert", "roberta") for t in ("classification", "token_classification")]


@pytest.mark.parametrize("model_type,task", BERT_CASES)
def test_bert_classifier_dropout_is_read_as_transformers_reads_it(tmp_path, scaling_dropout, model_type, task):
    """config.json's classifier_dropout, not the hidden rate, drops the pooled / token vectors (RoBERTa: both
    of its classification head's dropouts); it was ignored."""
    torch.manual_seed(0)
    rates = dict(hidden_dropout_prob=HIDDEN, attention_probs_dropout_prob=ATTENTION, classifier_dropout=CLASSIFIER)
    theirs = hf_model(model_type, task, **rates)
    theirs.save_pretrained(tmp_path)
    ours, config = load_pretrained(tmp_path, task, 3, attention="eager")
    assert config.classifier_dropout == CLASSIFIER
    assert_same_training_outputs(ours, theirs, model_type, task)


@pytest.mark.parametrize("task", ["qa", "classification", "token_classification"])
def test_modernbert_classifier_dropout_is_read_as_transformers_reads_it(tmp_path, scaling_dropout, task):
    """ModernBERT's heads drop at classifier_dropout, the layers at mlp_dropout / attention_dropout; the heads
    used mlp_dropout."""
    torch.manual_seed(0)
    theirs = hf_model("modernbert", task, embedding_dropout=HIDDEN, **MODERN_RATES)
    theirs.save_pretrained(tmp_path)
    ours, config = load_pretrained(tmp_path, task, labels(task), attention="eager")
    assert (config.hidden_dropout_prob, config.attention_probs_dropout_prob) == (HIDDEN, ATTENTION)
    assert config.classifier_dropout == CLASSIFIER
    assert_same_training_outputs(ours, theirs, "modernbert", task)


def test_modernbert_embedding_dropout_is_read_as_transformers_reads_it(tmp_path, scaling_dropout):
    torch.manual_seed(0)
    theirs = hf_model("modernbert", "classification", embedding_dropout=EMBEDDING, **MODERN_RATES)
    theirs.save_pretrained(tmp_path)
    ours, config = load_pretrained(tmp_path, "classification", 3, attention="eager")
    assert config.embedding_dropout_rate == EMBEDDING
    assert_same_training_outputs(ours, theirs, "modernbert", "classification")


def hf_rates(config) -> dict[str, float | None]:
    names = ("embedding_dropout", "mlp_dropout", "attention_dropout", "classifier_dropout")
    if config.model_type != "modernbert":
        names = ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout")
    return {k: getattr(config, k) for k in names}


@pytest.mark.parametrize(
    "model_type,rates",
    [
        ("bert", dict(hidden_dropout_prob=HIDDEN, attention_probs_dropout_prob=ATTENTION)),  # classifier null
        ("bert", dict(hidden_dropout_prob=HIDDEN, attention_probs_dropout_prob=ATTENTION, classifier_dropout=0.0)),
        ("roberta", dict(hidden_dropout_prob=HIDDEN, attention_probs_dropout_prob=ATTENTION, classifier_dropout=0.3)),
        ("modernbert", dict(embedding_dropout=EMBEDDING, **MODERN_RATES)),
        ("modernbert", {}),  # transformers' defaults (all 0) left out of the file
    ],
)
def test_rates_round_trip_through_a_load_and_a_save(tmp_path, model_type, rates):
    """transformers' config.json -> bertforge -> bertforge's save -> transformers: the same rates. A save wrote
    the hidden rate to ModernBERT's embedding_dropout and classifier_dropout, and dropped BERT's
    classifier_dropout (a 0.0 came back as the hidden rate)."""
    torch.manual_seed(0)
    theirs = hf_model(model_type, "classification", **rates)
    theirs.save_pretrained(tmp_path / "hf")
    ours, config = load_pretrained(tmp_path / "hf", "classification", 3)
    save_pretrained(ours, config, tmp_path / "ours", "classification")
    back = transformers.AutoConfig.from_pretrained(tmp_path / "ours")
    assert hf_rates(back) == hf_rates(theirs.config)


def test_a_modernbert_config_json_without_embedding_or_classifier_rate_reads_as_transformers_reads_it():
    """Left out, they are transformers' 0.0, not the mlp_dropout they follow in a bertforge preset."""
    raw = {"model_type": "modernbert", "mlp_dropout": HIDDEN}
    ours, hf = config_from_hf(raw), transformers.ModernBertConfig.from_dict(raw)
    assert (ours.embedding_dropout_rate, ours.classifier_dropout_rate) == (hf.embedding_dropout, hf.classifier_dropout)


@pytest.mark.parametrize("preset", ["tiny", "modernbert-tiny"])
def test_presets_drop_at_the_hidden_rate_everywhere_as_before(tmp_path, preset):
    """A preset (no classifier or embedding rate: they follow the hidden one) keeps its rates, and its save
    reloads with the same ones."""
    config = BertConfig.from_preset(preset, vocab_size=audit.V, hidden_dropout_prob=0.15)
    assert config.classifier_dropout_rate == config.embedding_dropout_rate == 0.15
    model = build_model(config, "classification", num_labels=3)
    assert model.classifier.dropout.p == 0.15
    save_pretrained(model, config, tmp_path, "classification")
    again = load_pretrained(tmp_path, "classification", 3)[1]
    assert (again.classifier_dropout_rate, again.embedding_dropout_rate) == (0.15, 0.15)
    raw = json.loads((tmp_path / "config.json").read_text())
    if config.modern:  # transformers' ModernBERT has no null rate: the rates in use are written
        assert (raw["embedding_dropout"], raw["mlp_dropout"], raw["classifier_dropout"]) == (0.15, 0.15, 0.15)
    else:  # as transformers writes a BERT config.json: null, the hidden rate
        assert raw["classifier_dropout"] is None and "embedding_dropout" not in raw


@pytest.mark.parametrize("file_rate", [None, 0.0])
def test_a_hidden_override_leaves_a_bert_classifier_rate_as_transformers_does(tmp_path, file_rate):
    """Fine-tuning's model.hidden_dropout (config_overrides) replaces hidden_dropout_prob; the classifier follows
    it when config.json's classifier_dropout is null and keeps the file's rate otherwise, as
    transformers' from_pretrained(..., hidden_dropout_prob=p) does."""
    torch.manual_seed(0)
    hf_model("bert", "classification", classifier_dropout=file_rate).save_pretrained(tmp_path)
    ours, config = load_pretrained(tmp_path, "classification", 3, config_overrides={"hidden_dropout_prob": 0.25})
    theirs = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path, hidden_dropout_prob=0.25)
    assert ours.classifier.dropout.p == theirs.dropout.p == (0.25 if file_rate is None else file_rate)


def test_a_hidden_override_sets_a_modernbert_embedding_rate_too(tmp_path):
    """On a ModernBERT, model.hidden_dropout ("embeddings and sub-layer outputs") sets embedding_dropout with
    mlp_dropout; the classifier keeps config.json's classifier_dropout."""
    torch.manual_seed(0)
    hf_model("modernbert", "classification", embedding_dropout=EMBEDDING, **MODERN_RATES).save_pretrained(tmp_path)
    ours, config = load_pretrained(tmp_path, "classification", 3, config_overrides={"hidden_dropout_prob": 0.25})
    assert (config.hidden_dropout_prob, config.embedding_dropout_rate) == (0.25, 0.25)
    assert config.attention_probs_dropout_prob == ATTENTION
    assert config.classifier_dropout_rate == ours.classifier.dropout.p == CLASSIFIER
    raw = config_to_hf(config, "classification", 3)
    assert (raw["embedding_dropout"], raw["mlp_dropout"], raw["classifier_dropout"]) == (0.25, 0.25, CLASSIFIER)


@pytest.mark.parametrize("field", ["classifier_dropout", "embedding_dropout", "hidden_dropout_prob"])
@pytest.mark.parametrize("value", [1.0, -0.1, "0.1", True])
def test_a_rate_outside_0_1_or_not_a_number_is_one_line(field, value):
    with pytest.raises(ConfigError, match=f"{field} must be (a number )?in"):
        BertConfig(**{field: value})
    with pytest.raises(UserError, match=f"^x/config.json: {field} must be (a number|in)"):
        config_from_hf(
            {"model_type": "modernbert" if field == "embedding_dropout" else "bert", field: value}, "x/config.json"
        )
