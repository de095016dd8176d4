"""Our model vs `transformers` on the same weights (tiny random configs, fp32, eval): every head, BERT and
RoBERTa, in both directions (load theirs into ours; save ours for their Auto classes)."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from bertforge.errors import UserError
from bertforge.model import BertConfig, build_model
from bertforge.model.hf_interop import load_pretrained, save_pretrained

ATOL = 1e-5
V, T, B = 97, 12, 3

HF_CLASSES = {
    ("bert", "pretraining"): "BertForPreTraining",
    ("bert", "mlm"): "BertForMaskedLM",
    ("bert", "qa"): "BertForQuestionAnswering",
    ("bert", "classification"): "BertForSequenceClassification",
    ("bert", "regression"): "BertForSequenceClassification",
    ("bert", "token_classification"): "BertForTokenClassification",
    ("roberta", "mlm"): "RobertaForMaskedLM",
    ("roberta", "qa"): "RobertaForQuestionAnswering",
    ("roberta", "classification"): "RobertaForSequenceClassification",
    ("roberta", "regression"): "RobertaForSequenceClassification",
    ("roberta", "token_classification"): "RobertaForTokenClassification",
}
AUTO = {
    "pretraining": "AutoModelForPreTraining",
    "mlm": "AutoModelForMaskedLM",
    "qa": "AutoModelForQuestionAnswering",
    "classification": "AutoModelForSequenceClassification",
    "regression": "AutoModelForSequenceClassification",
    "token_classification": "AutoModelForTokenClassification",
}


def hf_config(model_type: str, task: str):
    kw = dict(
        vocab_size=V,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=40,
        attn_implementation="sdpa",
    )
    if task == "regression":
        kw["num_labels"] = 1
    elif task in ("classification", "token_classification"):
        kw["num_labels"] = 3
    if model_type == "roberta":
        return transformers.RobertaConfig(type_vocab_size=1, pad_token_id=1, **kw)
    return transformers.BertConfig(**kw)


def batch(model_type: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    pad = 1 if model_type == "roberta" else 0
    ids = torch.randint(3, V, (B, T), generator=g)
    lengths = torch.tensor([T, T - 3, 5])
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    ids = ids.masked_fill(mask == 0, pad)
    types = torch.zeros_like(ids) if model_type == "roberta" else (torch.arange(T)[None] >= 4).long() * mask
    return ids, mask, types


def compare(ours, theirs, task, model_type):
    ids, mask, types = batch(model_type)
    with torch.no_grad():
        o = ours(ids, attention_mask=mask, token_type_ids=types)
        h = theirs(input_ids=ids, attention_mask=mask, token_type_ids=types)
    if task == "pretraining":
        torch.testing.assert_close(o.mlm_logits, h.prediction_logits, atol=ATOL, rtol=0)
        torch.testing.assert_close(o.nsp_logits, h.seq_relationship_logits, atol=ATOL, rtol=0)
    elif task == "mlm":
        torch.testing.assert_close(o.mlm_logits, h.logits, atol=ATOL, rtol=0)
    elif task == "qa":
        torch.testing.assert_close(o.start_logits, h.start_logits, atol=ATOL, rtol=0)
        torch.testing.assert_close(o.end_logits, h.end_logits, atol=ATOL, rtol=0)
    else:
        torch.testing.assert_close(o.logits, h.logits, atol=ATOL, rtol=0)


@pytest.mark.parametrize("model_type,task", sorted(HF_CLASSES))
def test_load_theirs_into_ours(tmp_path, model_type, task):
    torch.manual_seed(0)
    theirs = getattr(transformers, HF_CLASSES[model_type, task])(hf_config(model_type, task)).eval()
    theirs.save_pretrained(tmp_path / "hf")
    ours, config = load_pretrained(tmp_path / "hf", task, num_labels=3, attention="sdpa")
    assert config.model_type == model_type
    compare(ours.eval(), theirs, task, model_type)


@pytest.mark.parametrize("model_type,task", sorted(HF_CLASSES))
def test_save_ours_for_theirs(tmp_path, model_type, task):
    torch.manual_seed(1)
    raw = hf_config(model_type, task).to_dict()
    from bertforge.model.hf_interop import config_from_hf

    config = config_from_hf(raw)
    ours = build_model(config, task, num_labels=3).eval()
    with torch.no_grad():  # make biases and LayerNorms nonzero so a misplaced one cannot pass
        for p in ours.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    out = save_pretrained(ours, config, tmp_path / "ours", task)
    assert json.loads((out / "config.json").read_text())["architectures"] == [HF_CLASSES[model_type, task]]
    theirs = getattr(transformers, AUTO[task]).from_pretrained(out, attn_implementation="sdpa").eval()
    assert type(theirs).__name__ == HF_CLASSES[model_type, task]
    compare(ours, theirs, task, model_type)
    # and back: our own load of our save is exact
    again, _ = load_pretrained(out, task, num_labels=3)
    for (k, a), (_, b) in zip(ours.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), k


def test_pretraining_losses_match_hf(tmp_path):
    torch.manual_seed(0)
    theirs = transformers.BertForPreTraining(hf_config("bert", "pretraining")).eval()
    theirs.save_pretrained(tmp_path / "hf")
    ours, _ = load_pretrained(tmp_path / "hf", "pretraining")
    ids, mask, types = batch("bert")
    positions = torch.tensor([[1, 3, 7, 0], [2, 5, 0, 0], [4, 0, 0, 0]])
    labels_at = torch.randint(0, V, positions.shape)
    dense = torch.full_like(ids, -100)
    for b in range(B):
        for p, lab in zip(positions[b], labels_at[b]):
            if p:
                dense[b, p] = lab
    nsp = torch.tensor([0, 1, 1])
    with torch.no_grad():
        o = ours.eval()(ids, mask, types, masked_positions=positions, masked_labels=labels_at, nsp_labels=nsp)
        h = theirs(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=dense, next_sentence_label=nsp)
    torch.testing.assert_close(o.loss, h.loss, atol=ATOL, rtol=0)
    assert int(o.mlm_count) == 6 and int(o.nsp_count) == 3


def test_missing_head_needs_opt_in(tmp_path):
    theirs = transformers.BertModel(hf_config("bert", "classification"))
    theirs.save_pretrained(tmp_path / "enc")
    with pytest.raises(UserError, match="allow_missing_head"):
        load_pretrained(tmp_path / "enc", "classification")
    model, _ = load_pretrained(tmp_path / "enc", "classification", allow_missing_head=True)
    assert "classifier.weight" in model.hf_load_info["initialised"]
    assert not any(k.startswith("bert.") for k in model.hf_load_info["initialised"])  # pooler came from the file


def test_missing_encoder_key_is_an_error(tmp_path):
    from safetensors.torch import load_file, save_file

    theirs = transformers.BertForMaskedLM(hf_config("bert", "mlm"))
    theirs.save_pretrained(tmp_path / "m")
    sd = load_file(tmp_path / "m" / "model.safetensors")
    del sd["bert.encoder.layer.1.output.dense.weight"]
    save_file(sd, tmp_path / "m" / "model.safetensors")
    with pytest.raises(UserError, match=r"bert\.encoder\.layer\.1\.output\.dense\.weight"):
        load_pretrained(tmp_path / "m", "mlm", allow_missing_head=True)


def test_unmapped_key_and_bad_shape_are_errors(tmp_path):
    from safetensors.torch import load_file, save_file

    theirs = transformers.BertForQuestionAnswering(hf_config("bert", "qa"))
    theirs.save_pretrained(tmp_path / "m")
    f = tmp_path / "m" / "model.safetensors"
    sd = load_file(f)
    save_file({**sd, "bert.mystery.weight": torch.zeros(2)}, f)
    with pytest.raises(UserError, match="bert.mystery.weight"):
        load_pretrained(tmp_path / "m", "qa")
    save_file({**sd, "qa_outputs.weight": torch.zeros(3, 32)}, f)
    with pytest.raises(UserError, match=r"qa_outputs\.weight has shape \(3, 32\).*num_labels"):
        load_pretrained(tmp_path / "m", "qa")
    # fewer positions than the model wants (a phase 2 at a longer sequence from a short phase 1): say which key
    pos = "bert.embeddings.position_embeddings.weight"
    n = sd[pos].shape[0] - 4
    save_file({**sd, pos: sd[pos][:n].clone()}, f)
    with pytest.raises(UserError, match=rf"has {n} positions: set model\.max_position_embeddings to {n}"):
        load_pretrained(tmp_path / "m", "qa")


@pytest.mark.parametrize(
    "prefix,config_name,tf_names", [("module.", "config.json", False), ("model.", "bert_config.json", True)]
)
def test_nvidia_style_checkpoint(tmp_path, prefix, config_name, tf_names):
    """NVIDIA DeepLearningExamples / Habana: {"model": sd} in a .pt, `module.`/`model.` prefixes, TF-era
    LayerNorm gamma/beta names, bert_config.json, the vocab padded to a multiple of 8."""
    torch.manual_seed(0)
    cfg = hf_config("bert", "pretraining")
    cfg.vocab_size = 104  # 97 padded up to a multiple of 8
    theirs = transformers.BertForPreTraining(cfg).eval()
    sd = {}
    for k, v in theirs.state_dict().items():
        if tf_names:
            k = k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")
        sd[prefix + k] = v
    d = tmp_path / "nv"
    d.mkdir()
    torch.save({"model": sd, "optimizer": {}}, d / "ckpt_8601.pt")
    raw = {k: v for k, v in cfg.to_dict().items() if k != "model_type"}
    (d / config_name).write_text(json.dumps({**raw, "vocab_size": 97}))
    ours, config = load_pretrained(d, "pretraining")
    assert config.vocab_size == 104
    compare(ours.eval(), theirs, "pretraining", "bert")
    # the same weights fine-tune: QA from a pre-training checkpoint ignores the NSP/MLM heads
    qa, _ = load_pretrained(d, "qa", allow_missing_head=True)
    assert "cls.seq_relationship.weight" in qa.hf_load_info["ignored"]
    assert qa.hf_load_info["initialised"] == ["qa_outputs.weight", "qa_outputs.bias"]


def test_save_unwraps_compiled_model(tmp_path):
    config = BertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64)
    model = build_model(config, "qa")
    out = save_pretrained(torch.compile(model), config, tmp_path / "c")
    again, _ = load_pretrained(out, "qa")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))


def test_roberta_pretraining_save_is_refused(tmp_path):
    config = BertConfig(
        vocab_size=V,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=64,
        model_type="roberta",
        pad_token_id=1,
        type_vocab_size=1,
    )
    with pytest.raises(UserError, match="no NSP head"):
        save_pretrained(build_model(config, "pretraining"), config, tmp_path / "x")


def test_pytorch_model_bin_and_losses_of_fine_tuning_heads(tmp_path):
    """pytorch_model.bin (read with weights_only) loads too; classification/regression/QA losses equal HF's."""
    ids, mask, types = batch("bert")
    for task, labels in (
        ("classification", {"labels": torch.tensor([0, 2, 1])}),
        ("regression", {"labels": torch.tensor([0.5, -1.0, 2.0])}),
        ("qa", {"start_positions": torch.tensor([1, 3, 40]), "end_positions": torch.tensor([2, 5, 4])}),
    ):
        torch.manual_seed(0)
        theirs = getattr(transformers, HF_CLASSES["bert", task])(hf_config("bert", task)).eval()
        theirs.save_pretrained(tmp_path / task)
        # transformers 5 writes only safetensors: write the legacy pickle ourselves
        (tmp_path / task / "model.safetensors").unlink()
        torch.save(theirs.state_dict(), tmp_path / task / "pytorch_model.bin")
        ours, _ = load_pretrained(tmp_path / task, task, num_labels=3)
        with torch.no_grad():
            o = ours.eval()(ids, mask, types, **labels)
            h = theirs(input_ids=ids, attention_mask=mask, token_type_ids=types, **labels)
        torch.testing.assert_close(o.loss, h.loss, atol=ATOL, rtol=0)
