"""GLUE audit: a classifier fine-tuned on another GLUE task is not taken as this task's head without a word, and
a Hugging Face dataset that is not GLUE's shape is one line, not a traceback or wrong labels."""

from __future__ import annotations

import sys
import types

import pytest
from tests.finetune.test_head_labels import _cfg, _classifier

from bertforge.errors import UserError
from bertforge.finetune import glue
from bertforge.finetune.runner import FinetuneRun, run_finetune


@pytest.mark.parametrize(
    "task, names",
    [
        ("cola", ["negative", "positive"]),  # an SST-2 head (transformers' run_glue names) on CoLA
        ("sst2", ["not_equivalent", "equivalent"]),  # MRPC's on SST-2
        ("qqp", ["unacceptable", "acceptable"]),  # CoLA's on QQP
        ("mrpc", ["not_duplicate", "duplicate"]),  # QQP's on MRPC
    ],
)
def test_another_tasks_label_names_are_not_this_tasks(task, names):
    """The `datasets` names of one binary task used to count as every binary task's 0/1: a run_glue SST-2 model
    scored on CoLA was taken silently, where transformers' run_glue says the labels differ."""
    assert glue.class_ids_of(task, names) is None


def test_each_tasks_own_names_still_map():
    assert glue.class_ids_of("sst2", ["NEGATIVE", "POSITIVE"]) == [0, 1]
    assert glue.class_ids_of("mrpc", ["equivalent", "not_equivalent"]) == [1, 0]
    assert glue.class_ids_of("wnli", ["entailment", "not_entailment"]) == [1, 0]
    assert glue.label_of("cola", "Acceptable") == "1" and glue.label_of("sst2", "acceptable") == "acceptable"


def test_eval_of_another_tasks_head_is_said(tmp_path):
    """--eval-only of a run_glue SST-2 classifier (negative, positive) on CoLA names the mismatch."""
    model = _classifier(tmp_path / "m", ["negative", "positive"], 1)
    rows = [f"src\t{i % 2}\t\ta man sleeps ." for i in range(4)]
    (dev := tmp_path / "dev.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    said: list[str] = []
    run_finetune(FinetuneRun("cola", str(model), None, [str(dev)], eval_only=True), _cfg(tmp_path / "o"), said.append)
    assert f"--model {model}: its id2label (negative, positive) does not name cola's labels" in "\n".join(said)


def _fake_datasets(monkeypatch, rows: list[dict], label_feature) -> None:
    class Rows(list):
        features = {"label": label_feature}

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=lambda *a, **k: Rows(rows)))


def test_hf_split_without_labels_is_refused(monkeypatch):
    """A split whose rows carry label -1 (no gold label, as GLUE's test splits) read as the last class."""
    feature = types.SimpleNamespace(names=["not_equivalent", "equivalent"])
    _fake_datasets(monkeypatch, [{"sentence1": "a", "sentence2": "b", "label": -1}], feature)
    with pytest.raises(UserError, match=r"mrpc/validation row 0 has label -1 \(no gold label"):
        glue.load_hf("mrpc", "validation", "my_glue")


def test_hf_dataset_of_another_shape_is_one_line(monkeypatch):
    feature = types.SimpleNamespace(names=["yes", "no"])
    _fake_datasets(monkeypatch, [{"sentence1": "a", "sentence2": "b", "label": 0}], feature)
    with pytest.raises(UserError, match=r"label names \(yes, no\) are not mrpc's labels"):
        glue.load_hf("mrpc", "validation", "my_glue")
    _fake_datasets(monkeypatch, [{"text": "a", "label": 0}], types.SimpleNamespace(names=["negative", "positive"]))
    with pytest.raises(UserError, match=r"has no field sentence \(fields: text, label\)"):
        glue.load_hf("sst2", "train", "my_glue")
    _fake_datasets(monkeypatch, [{"sentence": "a", "label": 0}], types.SimpleNamespace(dtype="int64"))
    with pytest.raises(UserError, match=r"label is not a ClassLabel with names"):
        glue.load_hf("sst2", "train", "my_glue")
