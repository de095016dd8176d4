"""`bertforge export`: HF directories that transformers loads, ONNX graphs with dynamic axes that match PyTorch."""

from __future__ import annotations

import json
import os
import socket

import numpy as np
import pytest
import torch
from tests.helpers import one_line

from bertforge.cli import main
from bertforge.errors import UserError
from bertforge.serve import export


def test_hf_export_loads_in_transformers_and_matches(head_models):
    transformers = pytest.importorskip("transformers")
    d = head_models["qa"]
    assert {"config.json", "model.safetensors", "tokenizer.json", "vocab.txt"} <= {p.name for p in d.iterdir()}
    assert json.loads((d / "config.json").read_text())["architectures"] == ["BertForQuestionAnswering"]
    ours, config = export.load(d, "qa")
    theirs = transformers.AutoModelForQuestionAnswering.from_pretrained(d).eval()
    x = export.sample_inputs(config, "qa")
    with torch.inference_mode():
        a, b = ours(**x), theirs(**x)
    real = x["attention_mask"].bool()
    torch.testing.assert_close(a.start_logits[real], b.start_logits[real], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(a.end_logits[real], b.end_logits[real], atol=1e-4, rtol=1e-4)


def test_hf_export_detects_head_and_refuses_missing_head(head_models, encoder_dir, tmp_path):
    out = export.export_hf(head_models["classify"], tmp_path / "again")  # head from config.json architectures
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertForSequenceClassification"]
    assert len(json.loads((out / "config.json").read_text())["id2label"]) == 3
    with pytest.raises(UserError, match="missing"):
        export.export_hf(encoder_dir, tmp_path / "nohead", "qa")  # no --init-head: the encoder has no QA head
    assert not (tmp_path / "nohead").exists()
    (tmp_path / "headless").mkdir()
    raw = json.loads((encoder_dir / "config.json").read_text())
    (tmp_path / "headless" / "config.json").write_text(json.dumps({**raw, "architectures": []}))
    with pytest.raises(UserError, match="architectures"):
        export.export_hf(tmp_path / "headless", tmp_path / "x")  # names no architecture at all
    (tmp_path / "pretraining").mkdir()
    (tmp_path / "pretraining" / "config.json").write_text(json.dumps({**raw, "architectures": ["BertForPreTraining"]}))
    with pytest.raises(UserError, match="pre-training model .*--task fill-mask .*--task embed"):
        export.export_onnx(tmp_path / "pretraining", tmp_path / "y")  # MLM + NSP: which part to take is said
    assert not (tmp_path / "y").exists()


def test_hf_export_keeps_the_label_names(head_models, tmp_path):
    """A fine-tuned classifier's id2label (e.g. RTE's entailment / not_entailment) survives the export, so the
    served model answers with the names rather than LABEL_0."""
    import shutil

    src = tmp_path / "named"
    shutil.copytree(head_models["classify"], src)
    raw = json.loads((src / "config.json").read_text())
    names = ["negative", "neutral", "positive"]
    raw.update(id2label=dict(enumerate(names)), label2id={n: i for i, n in enumerate(names)})
    (src / "config.json").write_text(json.dumps(raw))
    exported = json.loads((export.export_hf(src, tmp_path / "out") / "config.json").read_text())
    assert exported["id2label"] == {"0": "negative", "1": "neutral", "2": "positive"}
    assert exported["label2id"] == {"negative": 0, "neutral": 1, "positive": 2}


# classify: test_export_cli; fill-mask is slow on a loaded 2-core machine (-m slow)
@pytest.mark.parametrize("task", ["qa", pytest.param("fill-mask", marks=pytest.mark.slow)])
def test_onnx_export_dynamic_axes_and_parity(head_models, tmp_path, task):
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    res = export.export_onnx(head_models[task], tmp_path / "onnx")
    assert res["max_abs_diff"] <= 1e-4
    graph = onnx.load(res["path"]).graph
    dims = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.input}
    assert dims["input_ids"] == ["batch", "sequence"]
    if task == "fill-mask":
        assert dims["masked_positions"] == ["batch", "masks"]
    # a shape never traced (batch 5, 61 tokens) against PyTorch, independently of the exporter's own check
    model, config = export.load(head_models[task], export.SERVE_HEADS[task])
    x = export.sample_inputs(config, export.SERVE_HEADS[task], batch=5, seq=61, seed=7)
    sess = ort.InferenceSession(res["path"], providers=["CPUExecutionProvider"])
    got = sess.run(None, {k: v.numpy() for k, v in x.items()})
    with torch.inference_mode():
        want = export._OnnxWrapper(model, export.SERVE_HEADS[task]).eval()(**x)
    for g, w in zip(got, want):
        assert g.shape == tuple(w.shape)
        np.testing.assert_allclose(g, w.numpy(), atol=1e-4, rtol=0)
    assert (tmp_path / "onnx" / "tokenizer.json").is_file()


def test_export_cli(head_models, tmp_path, capsys):
    assert (
        main(["export", "--model", str(head_models["classify"]), "--format", "onnx", "--out", str(tmp_path / "o")]) == 0
    )
    assert "max |diff|" in capsys.readouterr().out
    assert main(["export", "--model", str(tmp_path / "missing"), "--format", "hf", "--out", str(tmp_path / "h")]) == 2
    assert "config.json" in capsys.readouterr().err


def _export(model, out, *extra):
    return main(["export", "--model", str(model), "--format", "hf", "--out", str(out), *extra])


def test_export_never_replaces_what_is_not_ours(head_models, tmp_path, capsys, monkeypatch):
    model = head_models["classify"]
    # a directory of the user's, and a regular file: refused, untouched
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    afile = tmp_path / "afile"
    afile.write_text("keep me too")
    for out in (mine, afile):
        assert _export(model, out) == 2
        err = capsys.readouterr().err
        assert str(out) in err and "--force" in err and len(err.strip().splitlines()) == 1
    assert (mine / "notes.txt").read_text() == "keep me" and afile.read_text() == "keep me too"
    # the current directory, the model directory and its parents: refused even with --force, no traceback
    monkeypatch.chdir(tmp_path)
    for out, extra in ((".", ()), (".", ("--force",)), (model, ("--force",)), (model.parent, ("--force",))):
        assert _export(model, out, *extra) == 2
        err = capsys.readouterr().err
        assert "error:" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert (model / "config.json").is_file() and (tmp_path / "mine").is_dir()
    # an empty directory, an earlier export of ours (also into another format), and --force are accepted
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _export(model, empty) == 0
    marker = json.loads((empty / export.MARKER).read_text())
    assert marker["format"] == "hf" and marker["task"] == "classification"
    assert _export(model, empty) == 0
    # files of the user's put into an earlier export since: they were deleted by the next export without a word
    (empty / "RESULTS.md").write_text("my results")
    assert _export(model, empty) == 2
    err = capsys.readouterr().err
    assert "also holds RESULTS.md" in err and len(err.strip().splitlines()) == 1
    assert (empty / "RESULTS.md").read_text() == "my results"
    assert _export(model, empty, "--force") == 0 and not (empty / "RESULTS.md").exists()
    assert _export(model, mine, "--force") == 0 and not (mine / "notes.txt").exists()
    assert _export(model, afile, "--force") == 0 and (afile / "config.json").is_file()


@pytest.mark.parametrize(
    "content, words",
    [(b"{bad", "is not valid JSON"), (b"[1, 2]", "does not hold a JSON object"), (b"\xff\xfe{", "is not valid JSON")],
    ids=["not json", "a list", "not utf-8"],
)
def test_every_reader_of_config_json_refuses_an_invalid_one_in_one_line(head_models, tmp_path, capsys, content, words):
    """detect_head, num_labels_of, export_hf's source read and serve's label read each gave a JSONDecodeError or
    AttributeError traceback; only the QA path (load_pretrained's own check) gave one line."""
    import shutil

    from bertforge.serve.tasks import Predictor

    bad = tmp_path / "bad"
    shutil.copytree(head_models["classify"], bad)
    (bad / "config.json").write_bytes(content)
    calls = {
        "detect_head": lambda: export.detect_head(bad),
        "num_labels_of": lambda: export.num_labels_of(bad),
        "export_hf": lambda: export.export_hf(bad, tmp_path / "hf"),
        "export_hf classify": lambda: export.export_hf(bad, tmp_path / "hf", "classify"),
        "export_onnx qa": lambda: export.export_onnx(bad, tmp_path / "onnx", "qa"),
        **{f"serve {t}": (lambda t=t: Predictor.from_dir(t, bad)) for t in ("classify", "qa", "fill-mask", "embed")},
    }
    for what, call in calls.items():
        with pytest.raises(UserError) as e:
            call()
        assert "\n" not in str(e.value) and f"{bad / 'config.json'} {words}" in str(e.value), (what, str(e.value))
    assert not (tmp_path / "hf").exists() and not (tmp_path / "onnx").exists()
    assert main(["export", "--model", str(bad), "--format", "hf", "--out", str(tmp_path / "cli")]) == 2
    one_line(capsys.readouterr().err, bad / "config.json", words)


@pytest.mark.parametrize("opset", [6, 10, 21, 99, -1])
def test_onnx_opset_outside_the_supported_range_is_one_line(head_models, tmp_path, capsys, opset):
    """Outside 11-20 the exporter failed with a traceback (7: arange; 9, 10: a graph onnxruntime refuses; 24: torch
    refuses) or warned that it does not support it (21-23)."""
    out = tmp_path / "o"
    args = ["export", "--model", str(head_models["qa"]), "--format", "onnx", "--out", str(out), "--opset", str(opset)]
    assert main(args) == 2
    one_line(capsys.readouterr().err, f"--opset {opset} is not supported", "11 to 20")
    assert not out.exists()


@pytest.mark.parametrize("n", [0, -1])
def test_num_labels_below_one_is_refused_at_start(encoder_dir, tmp_path, capsys, n):
    """-1 was a traceback; 0 wrote a model that serve then refused."""
    out = tmp_path / "o"
    args = ["export", "--model", str(encoder_dir), "--format", "hf", "--out", str(out), "--task", "classify"]
    assert main([*args, "--init-head", "--num-labels", str(n)]) == 2
    one_line(capsys.readouterr().err, f"--num-labels must be at least 1, not {n}")
    assert not out.exists()


def _fifo(p):
    os.mkfifo(p)


def _socket(p):
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(p))
    return s  # kept open by the caller: a bound socket file


def _symlink(p):
    target = p.parent / "target"
    target.mkdir()
    (target / "keep.txt").write_text("keep")
    p.symlink_to(target)


@pytest.mark.parametrize("make, kind", [(_fifo, "FIFO"), (_socket, "socket"), (_symlink, "symbolic link")])
def test_force_replaces_only_regular_files_and_directories(encoder_dir, tmp_path, capsys, make, kind):
    """--force replaced whatever was at --out, a FIFO or a socket included (a device too: not made here)."""
    out = tmp_path / "o"
    held = make(out)
    try:
        before = out.lstat()
        for extra in ((), ("--force",)):
            assert _export(encoder_dir, out, "--task", "embed", *extra) == 2
            one_line(capsys.readouterr().err, f"--out {out}", kind, "never replaces")
        after = out.lstat()
        assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)  # the same node, untouched
    finally:
        if held is not None:
            held.close()


def test_onnx_export_writes_the_config_of_the_exported_head(head_models, tmp_path):
    """A QA model exported as classify with --init-head: the ONNX directory's config.json said
    BertForQuestionAnswering (the source's, copied); it is now what --format hf writes for that head."""
    pytest.importorskip("onnxruntime")
    qa = head_models["qa"]
    export.export_onnx(qa, tmp_path / "onnx", "classify", init_head=True)
    export.export_hf(qa, tmp_path / "hf", "classify", init_head=True)
    onnx_cfg = json.loads((tmp_path / "onnx" / "config.json").read_text())
    assert onnx_cfg["architectures"] == ["BertForSequenceClassification"]
    assert onnx_cfg == json.loads((tmp_path / "hf" / "config.json").read_text())


# (source problem_type, labels, a batch of labels of its kind): what the exported config.json must say for each
_PROBLEMS = {
    "multi-label": ("multi_label_classification", 3, [[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]]),
    "regression": ("regression", 1, [0.7, -1.2]),
    "absent": (None, 3, [2, 0]),  # no problem_type: transformers infers single-label from class-id labels
}


def _hf_classifier(tmp_path, problem_type, num_labels, arch="BertForSequenceClassification"):
    """A tiny transformers `arch` (a classifier, or BertModel: no head) saved as its save_pretrained writes it."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        num_labels=num_labels, problem_type=problem_type,
    )  # fmt: skip
    model = getattr(transformers, arch)(cfg).eval()
    model.save_pretrained(tmp_path / "src")
    return model, tmp_path / "src"


@pytest.mark.parametrize("case", list(_PROBLEMS))
def test_hf_export_keeps_the_problem_type_and_the_loss(tmp_path, case):
    """config_to_hf wrote single_label_classification whatever the source said: a multi-label model came back
    single-label (softmax pipeline, cross-entropy loss, which refused its multi-hot labels), and both formats'
    config.json said so. The source's problem_type is kept; absent, it is what transformers infers."""
    transformers = pytest.importorskip("transformers")
    given, num_labels, labels = _PROBLEMS[case]
    source, src = _hf_classifier(tmp_path, given, num_labels)
    want = given or "single_label_classification"
    out = export.export_hf(src, tmp_path / "hf")
    assert json.loads((out / "config.json").read_text())["problem_type"] == want
    exported = transformers.AutoModelForSequenceClassification.from_pretrained(out).eval()
    x, y = torch.tensor([[2, 5, 7, 3], [2, 9, 3, 0]]), torch.tensor(labels)
    with torch.inference_mode():
        a = source(x, attention_mask=(x > 0).long(), labels=y)
        b = exported(x, attention_mask=(x > 0).long(), labels=y)
    assert exported.config.problem_type == source.config.problem_type == want  # the source's inferred on its call
    torch.testing.assert_close(b.logits, a.logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(b.loss, a.loss, atol=1e-5, rtol=0)
    pytest.importorskip("onnxruntime")  # the ONNX directory's config.json is the same file; the graph gives logits
    export.export_onnx(src, tmp_path / "onnx")
    assert json.loads((tmp_path / "onnx" / "config.json").read_text()) == json.loads((out / "config.json").read_text())


def test_a_head_of_another_label_count_gets_the_default_problem_type(tmp_path):
    """A fresh head (--init-head) of the source's label count keeps its problem_type; one of another count
    (--num-labels) gets the default for that count (one label: regression, which transformers loads; it refuses
    single_label_classification with one label). An unknown problem_type is one line naming the file."""
    transformers = pytest.importorskip("transformers")
    _, src = _hf_classifier(tmp_path, "multi_label_classification", 3, "BertModel")  # a config without a head
    for n, want in ((None, "multi_label_classification"), (5, "single_label_classification"), (1, "regression")):
        out = export.export_hf(src, tmp_path / f"n{n}", "classify", init_head=True, num_labels=n)
        assert json.loads((out / "config.json").read_text())["problem_type"] == want, n
    assert transformers.AutoConfig.from_pretrained(tmp_path / "n1").problem_type == "regression"
    raw = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**raw, "problem_type": "multi_label"}))
    with pytest.raises(UserError, match="config.json: problem_type 'multi_label' is not one of"):
        export.export_hf(src, tmp_path / "bad", "classify", init_head=True)
