"""`bertforge export --format onnx` against transformers' own model of the same directory: every head of tiny BERT,
RoBERTa and ModernBERT models, run by onnxruntime at shapes other than the traced one (batch 1, the model's longest
sequence, padded rows), and models of fewer positions than the export's sample batches."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from bertforge.serve import export

V = 40  # vocabulary of the tiny models; ids 5.. are ordinary tokens
HF_HEADS = {"qa": "ForQuestionAnswering", "classify": "ForSequenceClassification", "fill-mask": "ForMaskedLM"}
HF_HEADS["embed"] = "Model"
PREFIX = {"bert": "Bert", "roberta": "Roberta", "modernbert": "ModernBert"}


def _tiny(tmp_path, kind: str, task: str, positions: int, **extra):
    """A tiny transformers model of `kind` with `task`'s head, saved as save_pretrained writes it."""
    transformers = pytest.importorskip("transformers")
    size = dict(vocab_size=V, hidden_size=16, num_attention_heads=2, intermediate_size=32, **extra)
    if kind == "bert":
        cfg = transformers.BertConfig(num_hidden_layers=1, max_position_embeddings=positions, **size)
    elif kind == "roberta":  # positions start after the padding index: `positions` rows hold positions - 2 tokens
        cfg = transformers.RobertaConfig(
            num_hidden_layers=1, max_position_embeddings=positions, pad_token_id=1, type_vocab_size=1, **size
        )
    else:  # three layers, a window of 8 tokens: local and global attention both run past the window
        cfg = transformers.ModernBertConfig(
            num_hidden_layers=3, max_position_embeddings=positions, local_attention=8, global_attn_every_n_layers=2,
            pad_token_id=0, bos_token_id=2, eos_token_id=3, cls_token_id=2, sep_token_id=3, **size,
        )  # fmt: skip
    torch.manual_seed(0)
    model = getattr(transformers, PREFIX[kind] + HF_HEADS[task])(cfg).eval()
    d = tmp_path / f"{kind}-{task}"
    model.save_pretrained(d)
    return model, d


def _compare(model, kind: str, task: str, onnx_path, batch: int, length: int) -> float:
    """Largest |onnxruntime - transformers| on a batch of `length` tokens whose rows after the first are padded;
    token outputs compared at real tokens only (what a padded position holds is nobody's answer)."""
    ort = pytest.importorskip("onnxruntime")
    g = torch.Generator().manual_seed(batch * 1000 + length)
    ids = torch.randint(5, V, (batch, length), generator=g)
    am = torch.ones(batch, length, dtype=torch.long)
    for i in range(1, batch):
        am[i, max(2, length - 4 * i) :] = 0
    ids = torch.where(am.bool(), ids, torch.full_like(ids, model.config.pad_token_id))
    tt = torch.zeros_like(ids)
    if kind == "bert":
        tt[:, length // 2 :] = 1
        tt *= am
    feed = {"input_ids": ids, "attention_mask": am, "token_type_ids": tt}
    hf = {k: v for k, v in feed.items() if kind != "modernbert" or k != "token_type_ids"}
    masks = torch.tensor([[1, 0]] * batch)
    if task == "fill-mask":
        feed["masked_positions"] = masks
    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    # as documented: token_type_ids for BERT and RoBERTa, none for ModernBERT; masked_positions for fill-mask
    want_names = ["input_ids", "attention_mask"] + ["token_type_ids"] * (kind != "modernbert")
    assert names == want_names + ["masked_positions"] * (task == "fill-mask")
    got = sess.run(None, {k: v.numpy() for k, v in feed.items() if k in names})
    with torch.inference_mode():
        out = model(**hf)
    want = {
        "qa": lambda: [out.start_logits, out.end_logits],
        "classify": lambda: [out.logits],
        "fill-mask": lambda: [out.logits[torch.arange(batch)[:, None], masks]],
        "embed": lambda: [out.last_hidden_state],
    }[task]()
    diff = 0.0
    for o, w in zip(got, want, strict=True):
        assert o.shape == tuple(w.shape) and o.dtype == np.float32
        keep = am.bool().numpy() if task in ("qa", "embed") else np.ones(o.shape[:1], bool)
        diff = max(diff, float(np.abs(o - w.numpy())[keep].max()))
    return diff


@pytest.mark.parametrize("kind", ["bert", "roberta", "modernbert"])
@pytest.mark.parametrize("task", ["qa", "classify", "fill-mask", "embed"])
def test_every_head_matches_transformers_at_other_shapes(tmp_path, kind, task):
    """Traced at one shape, the graph runs at batch 1, at the model's longest sequence and on padded rows, with the
    inputs the documentation names, and gives transformers' numbers."""
    pytest.importorskip("onnxruntime")
    extra = {"num_labels": 3, "problem_type": "multi_label_classification"} if task == "classify" else {}
    model, src = _tiny(tmp_path, kind, task, positions=34 if kind == "roberta" else 32, **extra)
    res = export.export_onnx(src, tmp_path / "onnx")
    assert res["max_abs_diff"] <= 1e-4
    longest = 32
    for batch, length in ((1, 3), (1, longest), (3, longest), (2, 11)):
        assert _compare(model, kind, task, res["path"], batch, length) < 1e-5, (batch, length)


@pytest.mark.parametrize("kind,positions,longest", [("bert", 16, 16), ("roberta", 22, 20), ("modernbert", 12, 12)])
def test_a_model_of_few_positions_exports(tmp_path, kind, positions, longest):
    """The export traced a 17-token batch and checked a 29-token one: a model of 16 positions (RoBERTa: 22 rows, 20
    tokens) failed with an IndexError traceback from its position table (onnxruntime's Gather error for RoBERTa).
    The sample batches are cut to the model's positions now, and the graph runs at the longest one."""
    pytest.importorskip("onnxruntime")
    model, src = _tiny(tmp_path, kind, "fill-mask", positions=positions)
    res = export.export_onnx(src, tmp_path / "onnx")
    assert res["max_abs_diff"] <= 1e-4
    for batch, length in ((1, longest), (3, longest), (2, 5)):
        assert _compare(model, kind, "fill-mask", res["path"], batch, length) < 1e-5, (batch, length)


@pytest.mark.parametrize("missing", ["onnx", "onnxruntime"])
def test_without_the_export_extra_it_is_one_line_before_any_work(tmp_path, capsys, monkeypatch, missing):
    """Without onnx the exporter's OnnxExporterError, without onnxruntime a ModuleNotFoundError after the whole model
    had been traced: tracebacks. Now one line naming the package and the extra, before the model loads."""
    from tests.helpers import one_line

    from bertforge.cli import main

    _, src = _tiny(tmp_path, "bert", "qa", positions=32)
    capsys.readouterr()  # transformers' progress bar while saving it
    monkeypatch.setitem(sys.modules, missing, None)  # `import missing` raises ImportError
    out = tmp_path / "onnx"
    assert main(["export", "--model", str(src), "--format", "onnx", "--out", str(out)]) == 2
    one_line(capsys.readouterr().err, missing, "pip install", "[export]")
    assert not out.exists()
