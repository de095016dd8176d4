"""GLUE: one table of tasks (`GLUE_TASKS`), readers for the official TSV files and for Hugging Face datasets,
and the per-task evaluation.

The TSV columns follow the reference processors of Google BERT's `run_classifier.py` (and Hugging Face's
`glue.py`, which copies them): the files in `glue_data/<TASK>/` as `download_glue_data.py` lays them out.
Fields are tab-separated with no quoting (MRPC and SST-2 sentences contain bare `"`), and a UTF-8 byte-order
mark at the start of a file (MRPC's train/dev files have one) is dropped.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.errors import UserError
from bertforge.finetune.metrics import GLUE_METRICS
from bertforge.runtime.io import read_input


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    dir: str
    """Folder under glue_data/."""
    text_cols: tuple[int, ...]
    """TSV column of the first (and second) text."""
    label_col: int
    """TSV column of the label (-1: last)."""
    labels: tuple[str, ...] | None
    """Label strings in class-id order; None for regression."""
    metrics: tuple[str, ...]
    """Metrics reported (names in GLUE_METRICS); the first one picks the best checkpoint."""
    header: bool = True
    """Whether the TSV files start with a header row."""
    dev_files: tuple[str, ...] = ("dev.tsv",)
    """Evaluation files (MNLI: matched and mismatched)."""
    hf_keys: tuple[str, ...] = ("sentence1", "sentence2")
    """Text fields of the Hugging Face `glue` dataset config of the same name."""
    hf_dev_splits: tuple[str, ...] = ("validation",)
    """Hugging Face split(s) matching dev_files."""
    score_range: tuple[float, float] = (0.0, 5.0)
    """Regression: the inclusive range of a label (STS-B's 0-5 similarity scale, Cer et al. 2017)."""

    @property
    def is_regression(self) -> bool:
        return self.labels is None

    @property
    def num_labels(self) -> int:
        return 1 if self.labels is None else len(self.labels)


# Columns and labels: BERT run_classifier.py processors; metrics: the GLUE paper (Wang et al. 2018), Table 1.
GLUE_TASKS: dict[str, TaskSpec] = {
    "cola": TaskSpec("CoLA", (3,), 1, ("0", "1"), ("mcc",), header=False, hf_keys=("sentence",)),
    "sst2": TaskSpec("SST-2", (0,), 1, ("0", "1"), ("accuracy",), hf_keys=("sentence",)),
    "mrpc": TaskSpec("MRPC", (3, 4), 0, ("0", "1"), ("f1", "accuracy")),
    "stsb": TaskSpec("STS-B", (7, 8), -1, None, ("pearson", "spearman")),
    "qqp": TaskSpec("QQP", (3, 4), 5, ("0", "1"), ("f1", "accuracy"), hf_keys=("question1", "question2")),
    "mnli": TaskSpec(
        "MNLI",
        (8, 9),
        -1,
        ("contradiction", "entailment", "neutral"),
        ("accuracy",),
        dev_files=("dev_matched.tsv", "dev_mismatched.tsv"),
        hf_keys=("premise", "hypothesis"),
        hf_dev_splits=("validation_matched", "validation_mismatched"),
    ),
    "qnli": TaskSpec(
        "QNLI", (1, 2), -1, ("entailment", "not_entailment"), ("accuracy",), hf_keys=("question", "sentence")
    ),
    "rte": TaskSpec("RTE", (1, 2), -1, ("entailment", "not_entailment"), ("accuracy",)),
    "wnli": TaskSpec("WNLI", (1, 2), -1, ("0", "1"), ("accuracy",)),
}


@dataclasses.dataclass
class GlueExamples:
    """Parallel lists: one or two texts per example and a label (class id, or float for regression)."""

    texts: list[tuple[str, ...]]
    labels: list[float] | list[int]
    source: str

    def __len__(self) -> int:
        return len(self.texts)


def get_task(name: str) -> TaskSpec:
    if name not in GLUE_TASKS:
        raise UserError(f"--task {name!r}: not a GLUE task; choose one of {', '.join(GLUE_TASKS)}, squad, squad_v2")
    return GLUE_TASKS[name]


def read_tsv(path: str | Path, spec: TaskSpec) -> GlueExamples:
    """Read one GLUE TSV file into examples; errors name the file and line."""
    path = Path(path)
    lines = _read_lines(path, spec)
    if lines and lines[-1] == "":
        lines.pop()
    texts: list[tuple[str, ...]] = []
    labels: list[Any] = []
    need = max(max(spec.text_cols), spec.label_col) + 1
    for lineno, line in enumerate(lines, 1):
        if spec.header and lineno == 1:
            continue
        cols = line.rstrip("\r").split("\t")
        if len(cols) < need:
            raise UserError(
                f"{path}:{lineno}: expected at least {need} tab-separated columns for {spec.dir}, found {len(cols)}"
            )
        labels.append(parse_label(cols[spec.label_col].strip(), spec, f"{path}:{lineno}"))
        texts.append(tuple(cols[c] for c in spec.text_cols))
    if not texts:
        shape = "only a header" if lines else "empty"
        raise UserError(f"GLUE file {path} has no examples ({shape}); give the task's train.tsv/dev.tsv with rows")
    return GlueExamples(texts, labels, str(path))


def _read_lines(path: Path, spec: TaskSpec) -> list[str]:
    """The file's lines (a UTF-8 byte-order mark dropped: MRPC has one); a path that is not a readable UTF-8
    file is a UserError naming it (and, for bad bytes, the line and byte)."""
    fix = f"point --train-file/--dev-file at glue_data/{spec.dir}/*.tsv"
    data = read_input(path, "GLUE file", fix, not_a=", not a TSV file")
    try:
        return data.decode("utf-8-sig").split("\n")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise UserError(
            f"GLUE file {path} is not UTF-8 text (line {line}, byte {e.start}: {e.reason}); save it as UTF-8, "
            "as download_glue_data.py writes it"
        ) from None


def parse_label(raw: str, spec: TaskSpec, where: str) -> int | float:
    """A TSV label: a class id, or a finite score inside `spec.score_range` (a NaN or out-of-range score would
    train as a skipped non-finite step or a wrong target); else a UserError naming `where` (file:line) and it."""
    if spec.labels is not None:
        if raw not in spec.labels:
            raise UserError(
                f"{where}: label {raw!r} is not one of {', '.join(spec.labels)} (is this a test file without labels?)"
            )
        return spec.labels.index(raw)
    lo, hi = spec.score_range
    try:
        score = float(raw)
    except ValueError:
        score = math.nan
    if not lo <= score <= hi:  # NaN fails every comparison, +-inf the range
        raise UserError(
            f"{where}: label {raw!r} is not a number from {lo:g} to {hi:g} ({spec.dir} scores); fix or remove the line"
        )
    return score


def default_files(task: str, data_dir: str | Path) -> tuple[Path, list[Path]]:
    """train.tsv and the dev file(s) of a task under a `glue_data` directory."""
    spec = get_task(task)
    root = Path(data_dir) / spec.dir
    return root / "train.tsv", [root / f for f in spec.dev_files]


def load_hf(task: str, split: str, dataset: str = "glue") -> GlueExamples:
    """A GLUE split from Hugging Face `datasets` (a local path or cache; the hub when online)."""
    spec = get_task(task)
    try:
        import datasets
    except ImportError:
        raise UserError("--dataset needs the `datasets` package: pip install 'bertforge[data]'") from None
    try:
        ds = datasets.load_dataset(dataset, task, split=split)
    except Exception as e:  # offline with nothing cached, unknown name, ...: one line the user can act on
        raise UserError(
            f"--dataset {dataset}: cannot load {task}/{split} ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}); when offline, pass --train-file/--dev-file "
            f"with glue_data TSV files instead"
        ) from None
    where = f"--dataset {dataset}: {task}/{split}"
    fields = list(ds[0]) if len(ds) else []
    for key in (*spec.hf_keys, "label") if fields else ():
        if key not in fields:  # another dataset under a GLUE config name: a KeyError from the first row
            raise UserError(
                f"{where} has no field {key} (fields: {', '.join(fields)}); GLUE's {task} has "
                f"{', '.join((*spec.hf_keys, 'label'))}: pass glue_data TSV files with --train-file/--dev-file instead"
            )
    texts = [tuple(row[k] for k in spec.hf_keys) for row in ds]
    labels: list[Any]
    if spec.is_regression:
        labels = [float(row["label"]) for row in ds]
    else:
        labels = _hf_class_ids(task, spec, [row["label"] for row in ds], ds.features["label"], where)
    return GlueExamples(texts, labels, f"hf:{dataset}/{task}/{split}")


def _hf_class_ids(task: str, spec: TaskSpec, raw: list[int], feature: Any, where: str) -> list[int]:
    """A split's ClassLabel ids as the task's class ids: HF's order can differ from the TSV label strings (MNLI),
    so they map through the label names. Names that are not the task's labels, and rows without a gold label
    (-1, as GLUE's test splits), are a UserError: an index would take them as some class."""
    assert spec.labels is not None
    names = getattr(feature, "names", None)
    if not names:
        raise UserError(
            f"{where}: its label is not a ClassLabel with names (GLUE's {task}: {', '.join(spec.labels)}); pass "
            "glue_data TSV files with --train-file/--dev-file instead"
        )
    ours = [label_of(task, str(n)) for n in names]
    if sorted(ours) != sorted(spec.labels):
        raise UserError(
            f"{where}: its label names ({', '.join(map(str, names))}) are not {task}'s labels "
            f"({', '.join(spec.labels)}); is this GLUE's {task}?"
        )
    ids = [spec.labels.index(n) for n in ours]
    for i, label in enumerate(raw):
        if not 0 <= label < len(ids):
            raise UserError(
                f"{where} row {i} has label {label} (no gold label: a test split?); evaluate on a labelled split"
            )
    return [ids[label] for label in raw]


# Other sources' names for each task's TSV label strings, lower case: Hugging Face `glue`'s ClassLabel names, which
# transformers' run_glue writes as a checkpoint's id2label (roberta-large-mnli's are the same in upper case). Per
# task: another binary task's names (an SST-2 head's negative/positive on CoLA) are not this task's 0/1, and are
# said as foreign names (`runner._align_head_labels`), as run_glue warns that the model's labels differ.
TASK_LABEL_ALIASES = {
    "cola": {"unacceptable": "0", "acceptable": "1"},
    "sst2": {"negative": "0", "positive": "1"},
    "mrpc": {"not_equivalent": "0", "equivalent": "1"},
    "qqp": {"not_duplicate": "0", "duplicate": "1"},
    "wnli": {"not_entailment": "0", "entailment": "1"},  # WNLI's TSV says 1 for entailment, where QNLI/RTE write it
}


def label_of(task: str, name: str) -> str:
    """Another source's label `name` (any case) as the task's TSV label string; other names lower-cased."""
    name = name.lower()
    return TASK_LABEL_ALIASES.get(task, {}).get(name, name)


def class_ids_of(task: str, names: Sequence[str]) -> list[int] | None:
    """The task's class id of each of a checkpoint's labels (its id2label names, in id order) when they name the
    task's labels in some order; None when they do not (generic LABEL_i names, another task's labels)."""
    spec = get_task(task)
    ours = [label_of(task, n) for n in names]
    if spec.labels is None or sorted(ours) != sorted(spec.labels):
        return None
    return [spec.labels.index(n) for n in ours]


def evaluate(task: str, outputs: np.ndarray, labels: Sequence[float]) -> dict[str, float]:
    """Task metrics from model outputs (logits (N, C), or (N,)/(N, 1) scores for regression)."""
    spec = get_task(task)
    outputs = np.asarray(outputs)
    preds = outputs.reshape(-1) if spec.is_regression else outputs.argmax(-1)
    y = np.asarray(labels)
    return {m: GLUE_METRICS[m](preds, y) for m in spec.metrics}
