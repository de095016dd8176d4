"""One fine-tuning loop for every task: SQuAD v1.1/v2.0 span extraction and the GLUE tasks.

    result = run_finetune(FinetuneRun(task="mrpc", model="path/to/hf_dir", train_file=..., dev_files=[...]), cfg)

`run_finetune` is four named steps, as the pre-training loop: `setup` (tokenizer, model, features) -> `train`
(for epoch: shuffled global batches, each padded to its own longest row -> `runtime.step.train_step`, the one
training step of bertforge: forward, weighted loss, backward, clip, optimizer and fp16 scaler, non-finite skip)
-> `evaluate` -> `keep_best` (Hugging Face format with the tokenizer files beside it, so `transformers` Auto
classes load it). Evaluation sorts sequences by length so each batch pads to nearly nothing, and runs under
`torch.inference_mode`.

Pieces shared with pre-training: the config sections (`model`, `train`, `optim`), parameter groups and the
optimizer named by optim.name (`bertforge.optim`), the schedule named by optim.schedule
(`bertforge.optim.schedule`), the training step (`bertforge.runtime.step`), distributed set-up and the metrics
logger (`bertforge.runtime`), device, precision and autocast (`bertforge.device`).

Nothing of an earlier run is replaced unannounced: a run records its task and model (and whether it only
evaluated) in output_dir/`bertforge_finetune.json`, and `best/` its own origin; an output_dir holding another
run's records (another task or model, training vs --eval-only, pre-training, or unknown) is refused unless
`overwrite`, which deletes them once every start-up check has passed; replacing an earlier run's best/ of the
same task and model is said in one line. SIGTERM/SIGINT stop training at the next update with the current model
saved as `interrupted/` (Hugging Face format), and stop set-up at once; fine-tuning does not resume — it is
short: run it again (once that run has trained to the end, it deletes the stopped attempt's `interrupted/`). A
run that fails or is stopped before its first logged step (bad input, a crash in the first updates) leaves no new
output directory behind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import math
import shutil
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertforge import device as dev
from bertforge.config import compile_keys, compile_mode, compile_notice, resolve_auto
from bertforge.data.vocab import load_tokenizer, tokenizer_file, vocab_rows
from bertforge.errors import Diverged, UserError
from bertforge.finetune import glue, squad
from bertforge.finetune.config import FinetuneConfig, TaskConfig
from bertforge.finetune.metrics import squad_v1_scores, squad_v2_scores
from bertforge.model.attention import segment_bounds
from bertforge.optim.lamb import optimizer_for
from bertforge.optim.schedule import lr_at
from bertforge.runtime import distributed as D
from bertforge.runtime.choices import apply_model_choices
from bertforge.runtime.io import atomic_dir, delete_outputs, output_dir, write_text
from bertforge.runtime.metrics import MetricsLogger
from bertforge.runtime.preempt import Preempted, Preemption
from bertforge.runtime.progress import Progress
from bertforge.runtime.signals import Terminated, sigterm_interrupts
from bertforge.runtime.step import TrainStep, set_lr, train_step, wants_segments

SQUAD_TASKS = ("squad", "squad_v2")
ALL_TASKS = SQUAD_TASKS + tuple(glue.GLUE_TASKS)
TOKENIZER_FILES = (
    "vocab.txt",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
)


@dataclasses.dataclass
class FinetuneRun:
    """What to fine-tune on (the config holds how)."""

    task: str
    model: str
    train_file: str | None = None
    dev_files: list[str] = dataclasses.field(default_factory=list)
    dataset: str | None = None
    eval_only: bool = False
    overwrite: bool = False
    """Delete an earlier run's best/ and interrupted/ in train.output_dir instead of refusing a different one."""
    task_data: TaskData | None = None
    """Tokenized rows built earlier (`glue_task_data`) for the same task, tokenizer and max_seq_len: the GLUE
    suite reuses them over seeds and learning rates instead of tokenizing again."""


# ------------------------------------------------------------------------------------------- data
@dataclasses.dataclass
class Encoded:
    """Variable-length sequences plus per-row targets (padding happens per batch in `collate`)."""

    input_ids: list[np.ndarray]
    token_type_ids: list[np.ndarray]
    targets: dict[str, np.ndarray]
    """labels (GLUE) or start_positions/end_positions (SQuAD), one per row."""

    def __len__(self) -> int:
        return len(self.input_ids)


def encode_glue(tokenizer, examples: glue.GlueExamples, max_seq_len: int, regression: bool) -> Encoded:
    """[CLS] a [SEP] (b [SEP]) truncated to max_seq_len by Hugging Face tokenizers' longest_first, as HF run_glue.
    Google's run_classifier (and NVIDIA's) differ at a tie: they cut b when both texts are equally long, HF
    tokenizers cut a, so a pair of equal lengths left with an odd number of tokens to drop keeps one more token
    of b here."""
    tokenizer.enable_truncation(max_seq_len, strategy="longest_first")
    try:
        inputs = [t if len(t) == 2 else t[0] for t in examples.texts]
        encs = tokenizer.encode_batch(inputs, add_special_tokens=True)
    finally:
        tokenizer.no_truncation()
    ids = [np.asarray(e.ids, dtype=np.int64) for e in encs]
    types = [np.asarray(e.type_ids, dtype=np.int64) for e in encs]
    labels = np.asarray(examples.labels, dtype=np.float32 if regression else np.int64)
    return Encoded(ids, types, {"labels": labels})


def single_token_type(task: TaskData, type_vocab_size: int) -> TaskData:
    """`task` with every token type 0 when the model has one type: a RoBERTa whose tokenizer is BERT's WordPiece
    (klue/roberta-base) or a [CLS]/[SEP] BPE gives segment B type 1, which its one-row table cannot embed (an
    IndexError at the first step); transformers' RoBERTa reads all zeros when given no token types."""
    sets = [e for _, e, _ in task.evals] + ([task.train] if task.train is not None else [])
    if type_vocab_size > 1 or not any(t.any() for e in sets for t in e.token_type_ids):
        return task

    def zero(e: Encoded) -> Encoded:
        return dataclasses.replace(e, token_type_ids=[np.zeros_like(t) for t in e.token_type_ids])

    train = zero(task.train) if task.train is not None else None
    return dataclasses.replace(task, train=train, evals=[(n, zero(e), score) for n, e, score in task.evals])


def encode_squad(features: squad.SquadFeatures) -> Encoded:
    return Encoded(
        features.input_ids,
        features.token_type_ids,
        {"start_positions": features.start_positions, "end_positions": features.end_positions},
    )


def collate(
    data: Encoded,
    rows: Sequence[int] | np.ndarray,
    pad_id: int,
    device: torch.device,
    targets: bool = True,
    pad_to: int = 0,
    segments: bool = False,
) -> dict[str, torch.Tensor]:
    """A batch padded to its own longest row, or to `pad_to` if longer: input_ids/token_type_ids/attention_mask
    (B, T_batch); with `segments`, also the segmented layout's `cu_seqlens` (`runtime.step.wants_segments`)."""
    T = max(pad_to, *(len(data.input_ids[r]) for r in rows))
    ids = np.full((len(rows), T), pad_id, dtype=np.int64)
    types = np.zeros((len(rows), T), dtype=np.int64)
    mask = np.zeros((len(rows), T), dtype=np.int64)
    for i, r in enumerate(rows):
        n = len(data.input_ids[r])
        ids[i, :n], types[i, :n], mask[i, :n] = data.input_ids[r], data.token_type_ids[r], 1
    batch = {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}
    if targets:
        batch.update({k: v[list(rows)] for k, v in data.targets.items()})
    host = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in batch.items()}
    if segments:
        host["cu_seqlens"] = segment_bounds(host["attention_mask"])
    return {k: v.to(device, non_blocking=True) for k, v in host.items()}


def train_batches(
    lengths: np.ndarray, batch_size: int, rng: np.random.Generator, group_by_length: bool = False
) -> list[np.ndarray]:
    """One epoch of training batches (row indices): a random permutation cut into batches; with
    `group_by_length`, each mega-batch of 50 batches is sorted by length before cutting and the batches are then
    shuffled (Hugging Face `LengthGroupedSampler`), so a batch pads to little more than its rows' own lengths."""
    order = rng.permutation(len(lengths))
    if group_by_length:
        mega = 50 * batch_size
        order = np.concatenate(
            [
                c[np.argsort(-lengths[c], kind="stable")]
                for c in (order[i : i + mega] for i in range(0, len(order), mega))
            ]
        )
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    if group_by_length:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def length_sorted_batches(lengths: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """Row indices sorted by length, cut into batches: evaluation pads almost nothing."""
    order = np.argsort(lengths, kind="stable")
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


# ------------------------------------------------------------------------------------------- evaluation
@torch.inference_mode()
def predict(
    model,
    data: Encoded,
    batch_size: int,
    pad_id: int,
    device: torch.device,
    precision: str,
    outputs: Sequence[str],
    progress: Progress | None = None,
) -> dict[str, list[np.ndarray]]:
    """Per-row model outputs (each trimmed to the row's length for per-token outputs), in row order;
    `progress` counts the rows."""
    model.eval()
    lengths = np.array([len(x) for x in data.input_ids])
    result: dict[str, list[Any]] = {k: [None] * len(data) for k in outputs}
    for rows in length_sorted_batches(lengths, batch_size):
        batch = collate(data, rows, pad_id, device, targets=False)
        with dev.autocast(device, precision):
            out = model(**batch)
        for k in outputs:
            values = getattr(out, k).float().cpu().numpy()
            for i, r in enumerate(rows):
                result[k][r] = values[i, : lengths[r]] if values.ndim == 2 and k != "logits" else values[i]
        if progress is not None:
            progress.update(len(rows))
    return result


# ------------------------------------------------------------------------------------------- task glue
Scorer = Callable[[dict[str, list[np.ndarray]]], dict[str, Any]]
"""score(model outputs of an evaluation set) -> metrics; may write files (SQuAD's predictions)."""


@dataclasses.dataclass
class TaskData:
    """A task made uniform for the loop: training rows, evaluation sets, and how to score them."""

    head: str
    """Model head: qa, classification or regression (its width: `task_head`)."""
    train: Encoded | None
    evals: list[tuple[str, Encoded, Scorer]]
    """(name, rows, score(model outputs) -> metrics, may write files) per evaluation set."""
    outputs: tuple[str, ...]
    main_metric: str
    label_names: tuple[str, ...] | None = None
    files: tuple[str, ...] = ()
    """The files in output_dir that the scorers write (SQuAD's predictions), kept in best/ beside the model."""


def task_head(task: str) -> tuple[str, int]:
    """The model head a task trains and its number of outputs (span start/end, classes, or one score)."""
    if task in SQUAD_TASKS:
        return "qa", 2
    spec = glue.get_task(task)
    return ("regression" if spec.is_regression else "classification"), spec.num_labels


def _squad_task(
    run: FinetuneRun, cfg: TaskConfig, tokenizer, out_dir: Path, log: Callable[[str], None] = print
) -> TaskData:
    v2 = run.task == "squad_v2"
    if run.dataset:
        raise UserError("--dataset is for GLUE tasks; pass SQuAD JSON files with --train-file/--dev-file")
    train = None
    if not run.eval_only:
        if not run.train_file:
            raise UserError(f"--task {run.task}: give --train-file (a SQuAD JSON file), or --eval-only")
        examples, _ = squad.read_squad(run.train_file, v1=not v2, training=True)
        train = encode_squad(
            squad.make_features(
                examples, tokenizer, cfg.max_seq_len, cfg.doc_stride, cfg.max_query_len, training=True, log=log
            )
        )
    evals: list[tuple[str, Encoded, Scorer]] = []
    for i, (path, name) in enumerate(zip(run.dev_files, eval_names(run.dev_files))):
        examples, data = squad.read_squad(path, v1=not v2)
        feats = squad.make_features(examples, tokenizer, cfg.max_seq_len, cfg.doc_stride, cfg.max_query_len)
        suffix = "" if i == 0 else f"_{i}"

        def score(out, examples=examples, data=data, feats=feats, suffix=suffix):
            preds, nbest, null_odds = squad.postprocess(
                examples,
                feats,
                out["start_logits"],
                out["end_logits"],
                cfg.n_best,
                cfg.max_answer_len,
                version_2=v2,
                null_score_diff_threshold=cfg.null_score_diff_threshold,
            )
            squad.write_json(out_dir / f"predictions{suffix}.json", preds)
            squad.write_json(out_dir / f"nbest_predictions{suffix}.json", nbest)
            if v2:
                squad.write_json(out_dir / f"null_odds{suffix}.json", null_odds)
                # no-answer above the prediction rule's threshold (not the official script's 1.0, which treats
                # the odds as a probability): the override changes nothing, and EM/F1 score predictions.json
                return squad_v2_scores(data, preds, null_odds, na_prob_thresh=cfg.null_score_diff_threshold)
            return squad_v1_scores(data, preds)

        evals.append((name, encode_squad(feats), score))
    outputs = ("start_logits", "end_logits")
    files = prediction_files(run.task, len(run.dev_files))
    return TaskData(task_head(run.task)[0], train, evals, outputs, "f1", files=files)


def prediction_files(task: str, n_dev: int) -> tuple[str, ...]:
    """The files a SQuAD task's scorers write in output_dir for `n_dev` dev files (a GLUE task's: none)."""
    if task not in SQUAD_TASKS:
        return ()
    kinds = ("predictions", "nbest_predictions") + (("null_odds",) if task == "squad_v2" else ())
    return tuple(f"{k}{'' if i == 0 else f'_{i}'}.json" for i in range(n_dev) for k in kinds)


def eval_names(paths: Sequence[str]) -> list[str]:
    """The name of each evaluation file in metrics and logs: its stem, with the file's index added where an earlier
    file has the name (dev.tsv of two directories), so that no set's metrics replace another's."""
    names: list[str] = []
    for i, path in enumerate(paths):
        name = Path(path).stem
        while name in names:
            name = f"{name}_{i}"
        names.append(name)
    return names


def glue_task_data(run: FinetuneRun, cfg: TaskConfig, tokenizer) -> TaskData:
    """A GLUE task's training and dev rows, tokenized, and its scorers."""
    spec = glue.get_task(run.task)
    train_ex: glue.GlueExamples | None = None
    dev_ex: list[tuple[str, glue.GlueExamples]] = []
    if run.dataset:
        if not run.eval_only:
            train_ex = glue.load_hf(run.task, "train", run.dataset)
        dev_ex = [(s, glue.load_hf(run.task, s, run.dataset)) for s in spec.hf_dev_splits]
    else:
        if not run.eval_only:
            if not run.train_file:
                raise UserError(
                    f"--task {run.task}: give --train-file and --dev-file (glue_data/{spec.dir}/*.tsv), "
                    f"--dataset glue, or --eval-only"
                )
            train_ex = glue.read_tsv(run.train_file, spec)
        dev_ex = [(n, glue.read_tsv(p, spec)) for p, n in zip(run.dev_files, eval_names(run.dev_files))]
    enc = lambda ex: encode_glue(tokenizer, ex, cfg.max_seq_len, spec.is_regression)  # noqa: E731
    evals: list[tuple[str, Encoded, Scorer]] = []
    for name, ex in dev_ex:

        def score(out: dict[str, list[np.ndarray]], ex: glue.GlueExamples = ex) -> dict[str, Any]:
            return glue.evaluate(run.task, np.stack(out["logits"]), ex.labels)

        evals.append((name, enc(ex), score))
    train = enc(train_ex) if train_ex else None
    return TaskData(task_head(run.task)[0], train, evals, ("logits",), spec.metrics[0], spec.labels)


# ------------------------------------------------------------------------------------------- model I/O
def load_model(
    model_dir: str,
    head: str,
    num_labels: int,
    attention: str = "auto",
    config_overrides: dict[str, Any] | None = None,
    training: bool = True,
    say: Callable[[str], None] = print,
    task: str | None = None,
):
    """The --model checkpoint with a `head` (`config_overrides`: BertConfig fields in Hugging Face names, the
    dropout rates of `FinetuneModelConfig.overrides()`). Training starts a head the checkpoint lacks, or has at
    another size (another task's label count), from a fresh init; an evaluation refuses both (it would score an
    untrained head). A GLUE `task`'s trained classifier has its rows put in the task's label order
    (`_align_head_labels`)."""
    from bertforge.model import hf_interop

    check_model_dir(model_dir)
    model, config = hf_interop.load_pretrained(
        Path(model_dir),
        head,
        num_labels=num_labels,
        attention=attention,
        allow_missing_head=True,
        reinit_mismatched_head=True,
        config_overrides=config_overrides,
    )
    resized = model.hf_load_info["reinitialised"]
    if training and resized:
        say(
            f"--model {model_dir}: {_other_head(model_dir, resized)}, this task needs {num_labels}: it starts from "
            "a fresh init (transformers' ignore_mismatched_sizes)"
        )
    elif not training:
        _check_trained_head(model_dir, head, num_labels, model.hf_load_info)
    if head == "classification" and task in glue.GLUE_TASKS and _head_trained(model):
        _align_head_labels(model, model_dir, task, say)
    return model, config


def _head_trained(model) -> bool:
    """The head's weights all came from the checkpoint (none started fresh)."""
    from bertforge.model.heads import TASK_HEADS

    info, prefix = model.hf_load_info, TASK_HEADS[model.task].name + "."
    return not any(k.startswith(prefix) for k in info["initialised"] + info["reinitialised"])


def _align_head_labels(model, model_dir: str, task: str, say: Callable[[str], None]) -> None:
    """A classifier trained elsewhere numbers its classes in its id2label's order (transformers' run_glue: the
    `datasets` order; roberta-large-mnli: another, upper case), bertforge in the task's TSV label order: where
    the names are the task's labels in another order, reorder the rows, as run_glue remaps through label2id.
    Generic LABEL_i names are taken to be in the task's order; other names are kept, and said."""
    from bertforge.model.hf_interop import label_names_of, read_config

    names = label_names_of(read_config(model_dir)[0])
    labels = glue.get_task(task).labels
    if not names or labels is None or all(n.upper().startswith("LABEL_") for n in names):
        return
    ids = glue.class_ids_of(task, names)
    if ids is None:
        say(
            f"--model {model_dir}: its id2label ({', '.join(names)}) does not name {task}'s labels "
            f"({', '.join(labels)}): its classifier's rows are taken as those labels, in that order"
        )
        return
    if ids == sorted(ids):
        return
    order = [ids.index(j) for j in range(len(ids))]  # the checkpoint's row of each of our class ids
    with torch.no_grad():
        head = model.head
        head.weight.copy_(head.weight[order].clone())
        if head.bias is not None:
            head.bias.copy_(head.bias[order].clone())
    say(
        f"--model {model_dir}: its classifier's rows ({', '.join(names)}) reordered to {task}'s label order "
        f"({', '.join(labels)}), as its config.json's id2label says"
    )


def _other_head(model_dir: str, keys: list[str]) -> str:
    """'its head (classifier.weight, ...) has 3 outputs (fine-tuned for another task)', the count from
    config.json's id2label."""
    from bertforge.model.hf_interop import label_names_of, read_config

    labels = label_names_of(read_config(model_dir)[0])
    size = f"{len(labels)} outputs" if labels else "another size"
    return f"its head ({', '.join(keys)}) has {size} (fine-tuned for another task)"


def _check_trained_head(model_dir: str, head: str, num_labels: int, info: dict[str, list[str]]) -> None:
    """--eval-only scores the checkpoint's own head: refuse one it lacks or has at another size."""
    advice = "pass the best/ of a run fine-tuned on this task, or fine-tune this model (without --eval-only)"
    if info["reinitialised"]:
        raise UserError(
            f"--model {model_dir}: {_other_head(model_dir, info['reinitialised'])}, this task needs {num_labels}; "
            f"--eval-only scores a model's own head: {advice}"
        )
    if info["initialised"]:
        raise UserError(
            f"--model {model_dir} has no fine-tuned {head} head ({', '.join(info['initialised'])} missing), and "
            f"--eval-only would score an untrained one: {advice}"
        )


def check_model_dir(model_dir: str) -> None:
    """A Hugging Face-format model directory, or a one-line error; for a pre-training run or one of its
    checkpoints, it names the model directory inside."""
    from bertforge.train.checkpoint import MODEL_DIR, latest_checkpoint

    path = Path(model_dir)
    if (path / "config.json").is_file():
        return
    hint = ""
    if (path / MODEL_DIR / "config.json").is_file():
        hint = f"; this is a checkpoint: its model is {path / MODEL_DIR}"
    elif (found := latest_checkpoint(path / "checkpoints")) is not None:
        hint = f"; this is a pre-training run: the model of its latest checkpoint is {found.model_dir}"
    raise UserError(f"--model {model_dir}: not a Hugging Face-format model directory (no config.json){hint}")


def check_seq_len(model_dir: str, max_seq_len: int, mconfig) -> None:
    """A sequence longer than the model's position table fails deep into training (IndexError, or a device-side
    assert on GPU): refuse it at start-up."""
    limit = mconfig.usable_positions
    if max_seq_len > limit:
        raise UserError(
            f"task.max_seq_len {max_seq_len} is longer than --model {model_dir} takes ({limit} positions, "
            f"max_position_embeddings in its config.json): set task.max_seq_len={limit} or less"
        )


def save_model(
    model,
    config,
    src_dir: str,
    out: Path,
    head: str,
    label_names: Sequence[str] | None,
    beside: Callable[[Path], None] | None = None,
) -> None:
    """Hugging Face format (config.json + model.safetensors), the source's tokenizer files and what `beside(dir)`
    writes, as one directory renamed into place: a kill leaves the earlier `out` or this one whole, never a model
    without its tokenizer files or a truncated predictions file in a directory that looks complete."""
    from bertforge.model import hf_interop

    with atomic_dir(out) as tmp:
        hf_interop.save_pretrained(model, config, tmp, head, label_names)
        for name in TOKENIZER_FILES:
            if (Path(src_dir) / name).is_file():
                shutil.copyfile(Path(src_dir) / name, tmp / name)
        if beside is not None:
            beside(tmp)


def check_vocab(model_dir: str, tokenizer, vocab_size: int) -> None:
    """A tokenizer with more tokens than the model has embedding rows fails at the first step (IndexError, or a
    device-side assert on GPU): refuse it at start-up, naming both files."""
    n = vocab_rows(tokenizer)
    if n > vocab_size:
        raise UserError(
            f"--model {model_dir}: {tokenizer_file(Path(model_dir))} has {n} tokens but "
            f"{Path(model_dir) / 'config.json'} has vocab_size {vocab_size} (ids >= {vocab_size} have no "
            "embedding); put the model's own tokenizer files beside it, or pick the model this tokenizer belongs to"
        )


# what a run records of itself, at the top of its output_dir and in best/: its task and --model
ORIGIN_FILE = "bertforge_finetune.json"
# a fine-tuning run's outputs besides pre-training's `RUN_OUTPUTS`: what --overwrite deletes
FINETUNE_OUTPUTS = ("best", "interrupted", ORIGIN_FILE)
PREDICTION_FILES = ("predictions*.json", "nbest_predictions*.json", "null_odds*.json")


def _origin(run: FinetuneRun) -> dict[str, str]:
    return {"task": run.task, "model": str(Path(run.model).resolve())}


def _record(run: FinetuneRun) -> dict[str, Any]:
    """What output_dir/ORIGIN_FILE says of the run that wrote the directory's records."""
    return {**_origin(run), "eval_only": run.eval_only}


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _earlier_record(out_dir: Path) -> Any:
    """The record of the run that wrote out_dir (directories from before the top-level record: best/'s)."""
    top = _read_json(out_dir / ORIGIN_FILE)
    if top is not None:
        return top
    best = _read_json(out_dir / "best" / ORIGIN_FILE)
    return {**best, "eval_only": False} if isinstance(best, dict) else None


def run_records(out_dir: Path) -> list[Path]:
    """The records of a run, fine-tuning's or pre-training's, in out_dir (what --overwrite deletes); empty
    when it holds none (an empty metrics.jsonl or a lone record file is a start that failed)."""
    from bertforge.train.loop import RUN_OUTPUTS, holds_run

    held = [out_dir / n for n in ("best", "interrupted", "summary.json") if (out_dir / n).exists()]
    if not held and not holds_run(out_dir):
        return []
    names = dict.fromkeys((*FINETUNE_OUTPUTS, *RUN_OUTPUTS))  # in order, once
    found = [out_dir / n for n in names if (out_dir / n).exists()]
    return found + sorted(p for pattern in PREDICTION_FILES for p in out_dir.glob(pattern))


def check_output_dir(run: FinetuneRun, out_dir: Path) -> None:
    """Refuse an output_dir holding another run's records (fine-tuning of another task or model, or with(out)
    --eval-only; pre-training; unknown) unless `run.overwrite`, which `claim_output_dir` carries out once every
    check has passed. The same fine-tune again goes ahead where the earlier one did not finish (fine-tuning does
    not resume, it runs again); a finished one (its summary.json) is kept unless `run.overwrite`. The same
    --eval-only evaluation again goes ahead: it trains nothing, and writes the same records again."""
    _check_model_outside(run, out_dir)
    held = run_records(out_dir)
    _check_output_kinds(run, out_dir, held if run.overwrite else [])
    earlier = _earlier_record(out_dir)
    again = run.eval_only or not (out_dir / "summary.json").exists()
    if not held or run.overwrite or (earlier == _record(run) and again):
        return  # the same fine-tune again after a crash or a stop: keep_best says when it replaces best/
    names = ", ".join(p.name + ("/" if p.is_dir() else "") for p in held if p.name != ORIGIN_FILE)
    if earlier == _record(run):
        raise UserError(
            f"train.output_dir {out_dir} holds a finished run of this fine-tune ({names}); pass --overwrite to "
            "replace it, or choose another --output-dir"
        )
    if isinstance(earlier, dict):
        what = f"fine-tuning: task {earlier.get('task')}, model {earlier.get('model')}"
        what += ", --eval-only" if earlier.get("eval_only") else ""
    else:
        what = "pre-training" if (out_dir / "checkpoints").is_dir() else "origin unknown"
    raise UserError(
        f"train.output_dir {out_dir} holds an earlier run's {names} ({what}); pass --overwrite to delete it, or "
        "choose another --output-dir"
    )


def _check_output_kinds(run: FinetuneRun, out_dir: Path, deleted: list[Path]) -> None:
    """A directory where the run writes a file (predictions.json, metrics.png) or a file where it makes a
    directory (tensorboard/): refused now, not as a failed write at the first evaluation or after the training.
    What --overwrite deletes (`deleted`) is not in the way."""
    files = (
        "metrics.jsonl",
        "summary.json",
        "metrics.png",
        ORIGIN_FILE,
        *prediction_files(run.task, len(run.dev_files)),
    )
    for name, is_dir in (*((n, False) for n in files), *((n, True) for n in ("best", "interrupted", "tensorboard"))):
        path = out_dir / name
        if path not in deleted and path.exists() and path.is_dir() != is_dir:
            raise UserError(
                f"{path} is a {'file' if is_dir else 'directory'}, where the run writes its "
                f"{'directory' if is_dir else 'file'} {name}; move it away or choose another train.output_dir"
            )


def _check_model_outside(run: FinetuneRun, out_dir: Path) -> None:
    """--model inside what a run in out_dir replaces (best/, interrupted/) or --overwrite deletes: refused."""
    model = Path(run.model).resolve()
    for name in ("best", "interrupted", "checkpoints"):
        if model.is_relative_to((out_dir / name).resolve()):
            raise UserError(
                f"--model {run.model} is inside train.output_dir {out_dir}, whose {name}/ this run would replace "
                "or delete; choose another --output-dir"
            )


def claim_output_dir(run: FinetuneRun, out_dir: Path, say: Callable[[str], None]) -> None:
    """Rank 0, once every input has passed its checks: delete an earlier run's records (`run.overwrite`), then
    record this run. Nothing in output_dir changes before this, so a refused start leaves an earlier run as it
    was."""
    if run.overwrite and (gone := run_records(out_dir)):
        delete_outputs(gone, out_dir, say, quiet=[ORIGIN_FILE])
    out_dir.mkdir(parents=True, exist_ok=True)  # run_finetune has made it; a caller of setup alone may not have
    write_text(out_dir / ORIGIN_FILE, json.dumps(_record(run), indent=1))


# ---------------------------------------------------------------------------------------------- set-up
@dataclasses.dataclass
class Session:
    """Everything one fine-tuning run holds, built by `setup` (the split of the pre-training loop: set-up,
    `train`, `evaluate`, `keep_best`, `finish`)."""

    run: FinetuneRun
    cfg: FinetuneConfig
    info: D.DistInfo
    device: torch.device
    precision: str
    out_dir: Path
    say: Callable[[str], None]
    task: TaskData
    model: torch.nn.Module
    """The bare model (what evaluation runs and `best/` saves)."""
    mconfig: Any
    logger: MetricsLogger
    step_fn: TrainStep | None = None
    """The optimizer and training step (None when only evaluating)."""
    history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    best: dict[str, Any] | None = None
    train_s: float = 0.0
    skipped: int = 0
    """Updates skipped for non-finite gradients."""

    @property
    def pad_id(self) -> int:
        return self.mconfig.pad_token_id


def _fit_micro_batch(cfg: FinetuneConfig, world: int, say) -> FinetuneConfig:
    """Each process takes global / world of every batch in micro-batches of train.micro_batch_size. The presets'
    micro-batch is the whole global batch (32, one device): on several processes, where it cannot fit, each takes
    its share whole (the same update: the micro-batch is a memory setting), and says so."""
    t = cfg.train
    share, rest = divmod(t.global_batch_size, world)
    if t.micro_batch_size > share and share and not rest:
        say(
            f"train.micro_batch_size {t.micro_batch_size} on {world} processes: {share}, each process's share of "
            "the global batch"
        )
        t = dataclasses.replace(t, micro_batch_size=share)
    if t.global_batch_size % (t.micro_batch_size * world):
        raise UserError(
            f"train.global_batch_size {t.global_batch_size} must be a multiple of "
            f"train.micro_batch_size {t.micro_batch_size} x {world} processes"
        )
    return dataclasses.replace(cfg, train=t)


def _padded_qa_attention(cfg: FinetuneConfig, run: FinetuneRun, device: torch.device, say) -> FinetuneConfig:
    """SQuAD with train.pad_to_max_length asks for the references' objective: their loss is a softmax over every
    position of the padded row, padding included, whose logits come from padding tokens that attend to the real
    ones. On CUDA `auto` unpads (padding's logits are the bias alone) or runs the segmented layout (padding attends
    to itself), a different loss; SDPA with the padding mask computes the references' (docs/finetuning.md)."""
    t = cfg.train
    if not (t.pad_to_max_length and run.task in SQUAD_TASKS and t.attention == "auto" and device.type == "cuda"):
        return cfg
    say("train.pad_to_max_length on SQuAD: attention sdpa (the references' loss over padded rows), not unpadded")
    return dataclasses.replace(cfg, train=dataclasses.replace(t, attention="sdpa"))


def setup(run: FinetuneRun, cfg: FinetuneConfig, log: Callable[[str], None] = print) -> Session:
    """Check the inputs, join the process group, load the tokenizer, the model and the task's data, build the
    optimizer, then claim the output dir and open the metrics log: a bad input fails before anything is written
    or deleted."""
    _check_run(run)
    # fine-tuning pads each batch to its own length: no auto setting compiles (measured for pre-training only)
    train_cfg, optim_cfg = resolve_auto(cfg.train, cfg.optim, fast=False, packed=False)
    cfg = dataclasses.replace(cfg, train=train_cfg, optim=optim_cfg)
    info, device = D.init_distributed(cfg.train.device, cfg.train.ddp_timeout)
    say = log if info.is_main else (lambda s: None)
    cfg = _fit_micro_batch(_padded_qa_attention(cfg, run, device, say), info.world_size, say)
    t = cfg.train
    dev.check_compile_toolchain(device, compile_keys(t, cfg.optim))
    out_dir = Path(t.output_dir)
    check_output_dir(run, out_dir)  # every rank: all refuse, or none
    torch.manual_seed(t.seed)
    precision = dev.resolve_precision(t.precision, device)

    t_setup = time.perf_counter()
    tokenizer = load_tokenizer(run.model)
    head, num_labels = task_head(run.task)
    overrides = cfg.model.overrides()
    model, mconfig = load_model(run.model, head, num_labels, t.attention, overrides, not run.eval_only, say, run.task)
    check_vocab(run.model, tokenizer, mconfig.vocab_size)  # before tokenizing: a mismatch fails in seconds
    check_seq_len(run.model, cfg.task.max_seq_len, mconfig)
    task = run.task_data or (
        _squad_task(run, cfg.task, tokenizer, out_dir, say)
        if run.task in SQUAD_TASKS
        else glue_task_data(run, cfg.task, tokenizer)
    )
    task = single_token_type(task, mconfig.type_vocab_size)
    apply_model_choices(model, t)
    model.to(device)
    # the optimizer checks its settings here: before anything is deleted
    training = not run.eval_only and task.train is not None
    step_fn = build_step(model, cfg, device, precision, info) if training else None
    if info.is_main:
        claim_output_dir(run, out_dir, say)  # --overwrite deletes once every input has passed its checks
    logger = MetricsLogger(out_dir, is_main=info.is_main, tensorboard=t.tensorboard, stream=_Printer(say))
    say(
        f"finetune {run.task} | {run.model} | {device} {precision} x{info.world_size} | "
        f"train {len(task.train) if task.train else 0} rows | eval {sum(len(e[1]) for e in task.evals)} rows | "
        f"{cfg.optim.name} lr {cfg.optim.lr:g} | setup {time.perf_counter() - t_setup:.1f}s"
    )
    return Session(run, cfg, info, device, precision, out_dir, say, task, model, mconfig, logger, step_fn)


def _check_run(run: FinetuneRun) -> None:
    if run.task not in ALL_TASKS:
        raise UserError(f"--task {run.task!r}: choose one of {', '.join(ALL_TASKS)}")
    if not run.dev_files and not run.dataset:
        alt = " (a SQuAD JSON file)" if run.task in SQUAD_TASKS else " or --dataset"  # --dataset: GLUE tasks only
        raise UserError(f"--task {run.task}: give --dev-file (evaluation data){alt}")
    seen: dict[Path, str] = {}
    for path in run.dev_files:  # a typo for another file (dev_matched twice): one set scored and reported twice
        if (where := Path(path).resolve()) in seen:
            raise UserError(f"--dev-file {path} names the file of --dev-file {seen[where]} again: give each file once")
        seen[where] = path
    check_model_dir(run.model)


def build_step(
    model: torch.nn.Module, cfg: FinetuneConfig, device: torch.device, precision: str, info: D.DistInfo
) -> TrainStep:
    """The optimizer named by optim.name and the one training step (DDP wrapper when distributed)."""
    o, t = cfg.optim, cfg.train
    optimizer = optimizer_for(model, o, device.type)
    wrapper = D.wrap_ddp(model, device, info) if info.distributed else None
    return TrainStep.build(
        model,
        optimizer,
        device,
        precision,
        o.max_grad_norm,
        compile_mode(t),
        wrapper,
        compile_scope=t.compile_scope,
    )


# ------------------------------------------------------------------------------------- evaluate, save
def evaluate(s: Session, epoch: float) -> dict[str, Any]:
    """Every evaluation set's metrics (rank 0), `main` = the task's main metric of the first set."""
    t0 = time.perf_counter()
    metrics: dict[str, Any] = {}
    for name, data, score in s.task.evals:
        progress = Progress(f"evaluate {name}", len(data), "rows", s.say)
        t = s.cfg.train
        out = predict(s.model, data, t.eval_batch_size, s.pad_id, s.device, s.precision, s.task.outputs, progress)
        for k, v in score(out).items():
            metrics[k if len(s.task.evals) == 1 else f"{name}/{k}"] = v
    metrics["eval_s"] = time.perf_counter() - t0
    dev.release_host_memory()
    metrics["main"] = next(v for k, v in metrics.items() if k.split("/")[-1] == s.task.main_metric)
    s.say(
        f"epoch {epoch:g} | "
        + " | ".join(f"{k} {v:.4g}" for k, v in metrics.items() if isinstance(v, float) and k != "main")
    )
    return metrics


def _improves(new: float, old: float) -> bool:
    """Whether an evaluation's main metric beats the best one's. NaN (the Pearson correlation of a model whose
    scores went NaN) is worse than any number: compared with `<=` it replaced a good best/."""
    return not math.isnan(new) and (math.isnan(old) or new > old)


def keep_best(s: Session, metrics: dict[str, Any]) -> None:
    """Record an evaluation; if it is the best so far, save the model (and SQuAD's predictions) to best/."""
    s.history.append(metrics)
    if s.best is not None and not _improves(metrics["main"], s.best["main"]):
        return
    best_dir = s.out_dir / "best"
    if s.best is None and best_dir.exists():
        s.say(f"replacing the earlier run's {best_dir} (same task and model) with this run's best")
    s.best = metrics

    def beside(tmp: Path) -> None:
        write_text(tmp / ORIGIN_FILE, json.dumps(_origin(s.run), indent=1))
        # this evaluation's predictions, by the names this run writes: files of an earlier run in output_dir that
        # match a pattern (its second dev file's predictions_1.json) are not this model's
        for name in s.task.files:
            if (s.out_dir / name).is_file():
                shutil.copyfile(s.out_dir / name, tmp / name)

    save_model(s.model, s.mconfig, s.run.model, best_dir, s.task.head, s.task.label_names, beside)


def evaluate_and_keep(s: Session, epoch: float, step: int) -> None:
    """Rank 0 evaluates, logs and keeps the best model; the other ranks wait (train.ddp_timeout), and a full disk
    while rank 0 writes best/ is the same one line on every rank."""

    def work() -> None:
        m = {"epoch": round(epoch, 3), "step": step, **evaluate(s, epoch)}
        s.logger.log(
            step,
            {"eval_" + k.replace("/", "_"): v for k, v in m.items() if isinstance(v, (int, float)) and k != "step"},
        )
        keep_best(s, m)

    D.on_main(work)


# ---------------------------------------------------------------------------------------------- the loop
def micro_batches(
    s: Session, data: Encoded, rows: np.ndarray, pad_to: int
) -> tuple[Iterator[dict[str, torch.Tensor]], int, list[float]]:
    """This rank's share of a global batch as micro-batches (collated lazily), their count and loss weights.

    A micro-batch's mean loss is weighted by its share of the global batch, times the world size because DDP
    averages over ranks: a short last batch of an epoch is still a plain mean over its rows. A rank left without
    rows takes one at weight 0."""
    t = s.cfg.train
    mine = rows[s.info.rank :: s.info.world_size]
    parts = [mine[i : i + t.micro_batch_size] for i in range(0, len(mine), t.micro_batch_size)]
    weights = [len(m) / len(rows) * s.info.world_size for m in parts]
    if not parts:  # fewer rows than ranks (an epoch's last batch): a row of weight 0 keeps this rank in DDP's
        # gradient all-reduce, where the ranks with rows would otherwise wait for it forever
        parts, weights = [rows[:1]], [0.0]
    segments = wants_segments(s.device, t.attention, packed=False, fixed=bool(compile_mode(t)))
    batches = (collate(data, m, s.pad_id, s.device, pad_to=pad_to, segments=segments) for m in parts)
    return batches, len(parts), weights


def train(s: Session, preempt: Preemption | None = None) -> None:
    """for epoch -> for global batch: lr, one `train_step` over this rank's micro-batches -> every N: log /
    evaluate; evaluate and keep the best model at each epoch's end. `preempt`: read after each update; set,
    the model is saved as interrupted/ and `Preempted` raised."""
    t, o, data, step_fn = s.cfg.train, s.cfg.optim, s.task.train, s.step_fn
    assert data is not None and step_fn is not None, "run_finetune trains only a task with training rows"
    steps_per_epoch = math.ceil(len(data) / t.global_batch_size)
    by_epochs = max(1, math.ceil(steps_per_epoch * t.epochs))
    total = min(by_epochs, t.max_steps) if t.max_steps else by_epochs
    if t.max_steps > by_epochs:  # Hugging Face's max_steps overrides the epochs: said, not silently cut short
        s.say(
            f"train.max_steps {t.max_steps} is more than the {by_epochs} updates of train.epochs {t.epochs:g} "
            f"({len(data)} rows, global batch {t.global_batch_size}): training stops after {by_epochs}; raise "
            "train.epochs (--epochs) to train longer"
        )
    s.logger.total_steps = total
    if notice := compile_notice(t):
        s.say(notice)
    rng = np.random.default_rng(t.seed)  # same order on every rank: each takes its slice of each batch
    lengths = np.array([len(x) for x in data.input_ids])
    pad_to = s.cfg.task.max_seq_len if t.pad_to_max_length else 0
    step = epoch = nonfinite = 0
    last_eval = -1
    while step < total:
        epoch += 1
        step_fn.model.train()
        t0, seqs = time.perf_counter(), 0
        for rows in train_batches(lengths, t.global_batch_size, rng, t.group_by_length):
            if step >= total:
                break
            step += 1  # a skipped (non-finite) update still uses its batch and its place in the schedule
            lr = lr_at(step, o.lr, total, o.warmup, o.schedule, o.decay, o.decay_shape)
            set_lr(step_fn.optimizer, lr)
            batches, accum, weights = micro_batches(s, data, rows, pad_to)
            result = train_step(step_fn, batches, accum, weights=weights)
            nonfinite = 0 if result.finite else nonfinite + 1
            s.skipped += not result.finite
            if nonfinite >= t.max_nonfinite_steps:
                _stop_nonfinite(s, step_fn, step, nonfinite)
            if step % 10 == 0:  # batches of every length fragment the host heap (see release_host_memory)
                dev.release_host_memory()
            seqs += len(rows)
            if step % t.log_every == 0 or step == total:
                loss = float(D.all_reduce_sum(result.loss.clone())) / s.info.world_size
                s.logger.log(
                    step,
                    {
                        "epoch": epoch,
                        "loss": loss,
                        "lr": lr,
                        "grad_norm": float(result.grad_norm),
                        "seq_per_s": seqs / (time.perf_counter() - t0),
                        "skipped": s.skipped,
                    },
                )
            if t.eval_every and step % t.eval_every == 0:
                t_pause = time.perf_counter()  # evaluation stays out of the training time and throughput
                evaluate_and_keep(s, step / steps_per_epoch, step)
                last_eval, t0 = step, t0 + time.perf_counter() - t_pause
                step_fn.model.train()
            if preempt is not None and preempt.agreed(s.device):
                _stop_preempted(s, preempt, step)
        s.train_s += time.perf_counter() - t0
        if last_eval != step:
            evaluate_and_keep(s, min(float(epoch), step / steps_per_epoch), step)
            last_eval = step


def _stop_nonfinite(s: Session, step_fn: TrainStep, step: int, count: int) -> None:
    scaler = step_fn.scaler
    best = f"the best model so far is in {s.out_dir / 'best'}" if s.best else "no model was saved"
    raise Diverged(
        f"{count} non-finite gradient steps in a row at update {step} ({s.precision}"
        f"{f', loss scale {scaler.get_scale():g}' if scaler.is_enabled() else ''}); {best}. Lower optim.lr, use "
        "train.precision=bf16 or fp32, or raise train.max_nonfinite_steps, or check the data"
    )


def _stop_preempted(s: Session, preempt: Preemption, step: int) -> None:
    where = s.out_dir / "interrupted"
    D.on_main(lambda: save_model(s.model, s.mconfig, s.run.model, where, s.task.head, s.task.label_names))
    best = f"; the best evaluated model is in {s.out_dir / 'best'}" if s.best else ""
    raise preempt.stopped(
        f"saved the model after update {step} as {where} (Hugging Face format){best}; fine-tuning does not "
        "resume: run it again to train to the end"
    )


def _drop_earlier_interrupted(s: Session) -> None:
    """A run that trained to the end over an earlier stopped attempt of the same fine-tune (`check_output_dir` lets
    it run again) deletes that attempt's interrupted/: left beside this run's best/ and summary.json, it reads as
    this run's stop, a model older than the finished run's."""
    where = s.out_dir / "interrupted"
    if s.info.is_main and where.is_dir():
        shutil.rmtree(where)
        s.say(f"deleted {where}, the model of an earlier stopped attempt: this run trained to the end")


def finish(s: Session) -> dict[str, Any]:
    """Every rank gets rank 0's results; rank 0 writes summary.json (and the plot)."""
    best, history = s.best, s.history
    if s.info.distributed:
        best, history = D.broadcast_object((best, history))
    summary = {
        "task": s.run.task,
        "model": s.run.model,
        "device": str(s.device),
        "precision": s.precision,
        "world_size": s.info.world_size,
        "best": best,
        "history": history,
        "train_s": s.train_s,
        "skipped_steps": s.skipped,
        "config": dataclasses.asdict(s.cfg),
    }
    s.logger.finish(summary, plot=False)  # its plot has pre-training's accuracies; ours the task's metric
    if s.cfg.train.plot and s.info.is_main:
        png = plot_finetune(s.out_dir / "metrics.jsonl", s.out_dir / "metrics.png", s.task.main_metric)
        if png is not None:
            s.say(f"wrote {png} (training loss, dev {s.task.main_metric})")
    return summary


def plot_finetune(jsonl: Path, png: Path, metric: str) -> Path | None:
    """The training loss and the dev set's main metric (`eval_main`) against the update step, as a PNG."""
    from bertforge.runtime.metrics import plot_points, read_jsonl, save_figure

    rows = read_jsonl(jsonl)
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, title in ((axes[0], "loss", "training loss"), (axes[1], "eval_main", f"dev {metric}")):
        pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
        plot_points(ax, pts, marker="." if key == "eval_main" else None)
        ax.set_xlabel("step")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, png)


def run_finetune(run: FinetuneRun, cfg: FinetuneConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Fine-tune (or only evaluate) and return the summary; writes train.output_dir/{best/, metrics.jsonl,
    summary.json}.

    Under torchrun (or mpirun/srun) every rank takes its share of each optimizer batch and DDP averages the
    gradients (one all-reduce per update); rank 0 evaluates and writes. SIGTERM/SIGINT during training save
    interrupted/ at the next update; during set-up (reading, tokenizing) they stop it at once and leave no new
    directory; both raise `Preempted`.
    """
    started = False
    try:
        # a signal raises at once until the training loop's Preemption takes it (nested: no moment unhandled)
        with sigterm_interrupts(), _run_dir(Path(cfg.train.output_dir)):
            s = setup(run, cfg, log)
            started = True
            return _train_or_evaluate(s)
    except KeyboardInterrupt as e:
        if started:  # a second signal in training, or one while evaluating or writing: the CLI says so
            raise
        raise preempted(e, "stopped during set-up, before training") from None


def preempted(e: KeyboardInterrupt, what: str) -> Preempted:
    """A signal that stopped work with no update to stop at (set-up, tokenizing) as `Preempted`: the CLI prints
    "received SIGTERM: <what>" and exits 128 + the signal, as after a stop in training."""
    sig = signal.SIGTERM if isinstance(e, Terminated) else signal.SIGINT
    return Preempted(f"received {sig.name}: {what}", sig)


def _train_or_evaluate(s: Session) -> dict[str, Any]:
    try:
        if s.step_fn is None:
            if s.info.is_main:  # nothing trained: nothing to save
                s.best = {"epoch": 0, **evaluate(s, 0)}
                s.history.append(s.best)
            return finish(s)
        with Preemption() as preempt:  # finish inside: a signal during the final evaluation still stops
            train(s, preempt)
            _drop_earlier_interrupted(s)
            return finish(s)
    finally:
        s.logger.close()
        # DDP's reducer goes before its process group: freed after it, gloo can block the process at exit
        s.step_fn = None
        gc.collect()
        D.cleanup()


@contextlib.contextmanager
def _run_dir(out: Path) -> Iterator[None]:
    """Rank 0 creates train.output_dir (and missing parents); a run that fails before logging a step (a bad
    input, a crash in the first updates) leaves no new directory behind, as pre-training's. A stop on a signal
    keeps interrupted/."""
    if not D.env_info().is_main:  # only rank 0 writes there
        yield
        return
    from bertforge.train.loop import unstarted_removed

    # unstarted_removed first: it must see which directories output_dir creates
    with unstarted_removed(out), output_dir(out, "train.output_dir"):
        yield


class _Printer:
    """A text stream that forwards whole lines to a log function (the metrics logger prints to a stream)."""

    def __init__(self, fn: Callable[[str], None]):
        self.fn = fn

    def write(self, text: str) -> None:
        if text.strip():
            self.fn(text.rstrip("\n"))

    def flush(self) -> None:
        pass
