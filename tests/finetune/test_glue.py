"""GLUE table and TSV readers: columns per task, BOM, no quoting, labels; the shared glue_data files."""

from __future__ import annotations

import numpy as np
import pytest

from bertforge.errors import UserError
from bertforge.finetune import glue


def test_table_is_complete():
    assert set(glue.GLUE_TASKS) == {"mrpc", "cola", "sst2", "stsb", "qqp", "mnli", "qnli", "rte", "wnli"}
    assert glue.GLUE_TASKS["stsb"].is_regression and glue.GLUE_TASKS["stsb"].num_labels == 1
    assert glue.GLUE_TASKS["mnli"].num_labels == 3 and len(glue.GLUE_TASKS["mnli"].dev_files) == 2
    for spec in glue.GLUE_TASKS.values():
        assert len(spec.text_cols) == len(spec.hf_keys)
        assert len(spec.dev_files) == len(spec.hf_dev_splits)


def test_mrpc_bom_and_quotes(tmp_path):
    f = tmp_path / "dev.tsv"
    f.write_text(
        '\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\tHe said " hi .\tShe said " bye .\n0\t3\t4\tA\tB\n',
        encoding="utf-8",
    )
    ex = glue.read_tsv(f, glue.GLUE_TASKS["mrpc"])
    assert ex.texts == [('He said " hi .', 'She said " bye .'), ("A", "B")]
    assert ex.labels == [1, 0]


def test_cola_no_header_and_bad_label(tmp_path):
    f = tmp_path / "train.tsv"
    f.write_text("gj04\t1\t\tGood sentence.\ngj04\t0\t*\tBad sentence .\n", encoding="utf-8")
    ex = glue.read_tsv(f, glue.GLUE_TASKS["cola"])
    assert ex.texts == [("Good sentence.",), ("Bad sentence .",)] and ex.labels == [1, 0]
    f.write_text("gj04\tx\t\tGood sentence.\n", encoding="utf-8")
    with pytest.raises(UserError, match="train.tsv:1"):
        glue.read_tsv(f, glue.GLUE_TASKS["cola"])


def test_evaluate():
    logits = np.array([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]])
    out = glue.evaluate("mrpc", logits, [1, 0, 0])
    assert out["accuracy"] == pytest.approx(2 / 3) and out["f1"] == pytest.approx(2 / 3)
    out = glue.evaluate("stsb", np.array([[1.0], [2.0], [3.5]]), [1.0, 2.5, 3.0])
    assert out["spearman"] == pytest.approx(1.0)


# published example counts of the GLUE dev/train files (GLUE paper, Table 1; download_glue_data.py layout)
COUNTS = {
    ("mrpc", "train.tsv"): 3668,
    ("mrpc", "dev.tsv"): 408,
    ("cola", "dev.tsv"): 1043,
    ("sst2", "dev.tsv"): 872,
    ("stsb", "dev.tsv"): 1500,
    ("qnli", "dev.tsv"): 5463,
    ("rte", "dev.tsv"): 277,
    ("wnli", "dev.tsv"): 71,
}


@pytest.mark.parametrize("task, name", sorted(COUNTS))
def test_shared_glue_files(shared_data, task, name):
    spec = glue.GLUE_TASKS[task]
    ex = glue.read_tsv(shared_data / "glue_data" / spec.dir / name, spec)
    assert len(ex) == COUNTS[(task, name)]
    assert all(all(t.strip() for t in pair) for pair in ex.texts)
    if spec.is_regression:
        assert 0.0 <= min(ex.labels) and max(ex.labels) <= 5.0
    else:
        assert set(ex.labels) == set(range(spec.num_labels))


def test_hf_dataset_offline_error_is_one_line():
    pytest.importorskip("datasets")
    with pytest.raises(UserError, match="--train-file/--dev-file"):
        glue.load_hf("mrpc", "train", "bertforge-test/no-such-dataset")
