"""Configuration of `bertforge finetune`: the `model`, `train` and `optim` sections of pre-training (same keys,
fine-tuning defaults) plus a `task` section, one class for SQuAD and GLUE.

The weights, architecture and vocabulary come from the `--model` directory's config.json, so the fine-tuning
`model` section holds only what a run may change about that model: its two dropout rates (`model.preset`,
`init_from`, `vocab_size` and `max_position_embeddings` are not keys here; setting one is an unknown-key error).
Configs written before the sections (flat keys: `lr`, `batch_size`, `max_seq_len`, ...) keep loading through
`FinetuneConfig.RENAMED`, with a notice naming each new key.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

from bertforge.config import OptimConfig, TrainConfig, dropout_overrides
from bertforge.errors import ConfigError


@dataclasses.dataclass
class FinetuneModelConfig:
    """What a fine-tuning run changes about the `--model` checkpoint (everything else is its config.json)."""

    hidden_dropout: float | None = None
    """Dropout on embeddings and sub-layer outputs (None: the checkpoint's own config.json rate)."""
    attention_dropout: float | None = None
    """Dropout on attention probabilities (None: the checkpoint's own config.json rate)."""

    def validate(self) -> None:
        for name in ("hidden_dropout", "attention_dropout"):
            rate = getattr(self, name)
            if rate is not None and not 0.0 <= rate < 1.0:
                raise ConfigError(f"model.{name} must be in [0, 1), got {rate}")

    def overrides(self) -> dict[str, float] | None:
        """The BertConfig fields (Hugging Face names) to replace in the checkpoint's config, None for none."""
        return dropout_overrides(self.hidden_dropout, self.attention_dropout)


@dataclasses.dataclass
class FinetuneTrainConfig(TrainConfig):
    """The fine-tuning run: the shared `train` keys (fine-tuning defaults) plus epochs, evaluation batches and
    how training batches are drawn and padded."""

    output_dir: str = "runs/finetune"
    """Where the best model, predictions, metrics.jsonl and summary.json go."""
    max_steps: int = 0
    """Stop after this many optimizer updates (0: `epochs` decides); the schedule spans the shorter. Unlike Hugging
    Face's max_steps it does not lengthen the run past `epochs` (a larger value is said in one line at the start)."""
    global_batch_size: int = 32
    """Sequences per optimizer update, over all ranks and accumulation steps."""
    micro_batch_size: int = 32
    """Sequences per forward/backward on one device; accumulation = global / (micro x world size)."""
    seed: int = 42
    """Seed of the head init, dropout and data order."""
    log_every: int = 20
    """Log loss, lr and throughput every N updates (and at the last)."""
    eval_every: int = 0
    """Also evaluate (and keep the best model) every N updates (0: only at the end of each epoch)."""
    tensorboard: bool = False
    """Write TensorBoard scalars to output_dir/tensorboard."""
    plot: bool = True
    """Draw output_dir/metrics.png at the end: the training loss and the dev set's main metric per step."""
    epochs: float = 3.0
    """Passes over the training set (fractions allowed)."""
    eval_batch_size: int = 128
    """Sequences per evaluation batch."""
    group_by_length: bool = False
    """Draw each training batch from rows of similar length (length-sorted mega-batches of 50 batches, batch
    order shuffled; Hugging Face's `group_by_length`): less padding per batch, same rows per epoch."""
    pad_to_max_length: bool = False
    """Pad every training batch to task.max_seq_len, as Google's run_squad.py and Hugging Face's run_qa.py do
    (their default), instead of to its own longest row. The SQuAD loss is a softmax over every position of the
    padded row, padding included, so only this gives their training objective exactly; it costs the compute on
    padding. GLUE losses read [CLS] only and do not change."""

    def validate(self) -> None:
        # eval_every 0 (epoch ends only) is valid here; the shared checks want >= 1 for pre-training's modulo
        TrainConfig.validate(dataclasses.replace(self, eval_every=max(self.eval_every, 1)))
        if self.eval_every < 0:
            raise ConfigError(f"train.eval_every must be >= 0, got {self.eval_every}")
        if not 0 < self.epochs < math.inf:  # NaN fails too
            raise ConfigError(f"train.epochs must be a finite number > 0, got {self.epochs}")
        if self.eval_batch_size < 1:
            raise ConfigError(f"train.eval_batch_size must be >= 1, got {self.eval_batch_size}")
        if self.cuda_graphs and not self.pad_to_max_length:
            raise ConfigError(
                "train.cuda_graphs replays one shape, and fine-tuning pads each batch to its own longest row (a graph "
                "recorded per length): set train.pad_to_max_length=true as well"
            )
        if self.fp8:
            raise ConfigError(
                "train.fp8 is a pre-training option (it has not been validated for fine-tuning); set train.fp8=false"
            )


@dataclasses.dataclass
class FinetuneOptimConfig(OptimConfig):
    """The optimizer and schedule with BERT's fine-tuning recipe as defaults (Google run_classifier.py /
    run_squad.py: AdamW, epsilon 1e-6, linear warm-up over 10% then linear decay to 0)."""

    name: str = "adamw"
    """adamw (BERT's fine-tuning optimizer) or lamb (NVLAMB semantics)."""
    lr: float = 2e-5
    """Peak learning rate."""
    warmup: float = 0.1
    """Fraction of the updates spent warming up."""
    schedule: str = "linear"
    """linear (Hugging Face's: linear warm-up, linear decay to 0), poly (NVIDIA PolyWarmUp, degree 0.5) or wsd
    (warmup-stable-decay: optim.decay, optim.decay_shape)."""


@dataclasses.dataclass
class TaskConfig:
    """How examples become sequences and predictions (the SQuAD keys are ignored by GLUE tasks)."""

    max_seq_len: int = 128
    """Tokens per sequence (SQuAD: 384)."""
    doc_stride: int = 128
    """SQuAD: step between the starts of consecutive context windows."""
    max_query_len: int = 64
    """SQuAD: question tokens kept."""
    n_best: int = 20
    """SQuAD: start/end candidates considered."""
    max_answer_len: int = 30
    """SQuAD: longest answer in tokens."""
    null_score_diff_threshold: float = 0.0
    """SQuAD v2.0: predict no answer when null score - best span score exceeds this."""

    def validate(self) -> None:
        if self.max_seq_len < 8:
            raise ConfigError(f"task.max_seq_len must be at least 8, got {self.max_seq_len}")
        if self.doc_stride < 1 or self.n_best < 1 or self.max_answer_len < 1:
            raise ConfigError("task.doc_stride, task.n_best and task.max_answer_len must be >= 1")
        if not math.isfinite(self.null_score_diff_threshold):
            # NaN fails every `diff > threshold`, so v2.0 would never predict no-answer and report scores without
            # an error; +-inf fixes every prediction to one side (as `bertforge score --na-prob-thresh` refuses)
            raise ConfigError(
                f"task.null_score_diff_threshold must be a finite number, got {self.null_score_diff_threshold}"
            )

    def validate_squad(self) -> None:
        """The SQuAD-only checks, for a SQuAD task (a GLUE task at max_seq_len 64 must not fail on them)."""
        if self.max_query_len < 1:  # a question cut to nothing (or to all but its last tokens) is not asked
            raise ConfigError(f"task.max_query_len must be >= 1 (question tokens kept), got {self.max_query_len}")
        if self.max_query_len + 4 >= self.max_seq_len:
            raise ConfigError(
                f"task.max_query_len {self.max_query_len} leaves no room for context in "
                f"task.max_seq_len {self.max_seq_len}; lower max_query_len or raise max_seq_len"
            )


# the flat keys of configs written before the sections -> their new place
_TASK_KEYS = ("max_seq_len", "doc_stride", "max_query_len", "n_best", "max_answer_len", "null_score_diff_threshold")
_TRAIN_KEYS = (
    "epochs",
    "max_steps",
    "log_every",
    "micro_batch_size",
    "eval_batch_size",
    "precision",
    "device",
    "group_by_length",
    "pad_to_max_length",
    "attention",
    "seed",
    "output_dir",
)
_OPTIM_KEYS = ("lr", "warmup", "weight_decay", "max_grad_norm")


@dataclasses.dataclass
class FinetuneConfig:
    """A fine-tuning run (the defaults are BERT's GLUE recipe)."""

    RENAMED: ClassVar[dict[str, str | tuple[str, ...]]] = {
        **{k: f"task.{k}" for k in _TASK_KEYS},
        **{k: f"train.{k}" for k in _TRAIN_KEYS},
        **{k: f"optim.{k}" for k in _OPTIM_KEYS},
        "batch_size": "train.global_batch_size",
        "adam_eps": "optim.eps",
        "dropout": ("model.hidden_dropout", "model.attention_dropout"),
    }
    """Flat keys of the one-section fine-tuning config -> the shared sections (and `task`)."""

    model: FinetuneModelConfig = dataclasses.field(default_factory=FinetuneModelConfig)
    """Dropout rates of the --model checkpoint."""
    train: FinetuneTrainConfig = dataclasses.field(default_factory=FinetuneTrainConfig)
    """The run."""
    optim: FinetuneOptimConfig = dataclasses.field(default_factory=FinetuneOptimConfig)
    """The optimizer."""
    task: TaskConfig = dataclasses.field(default_factory=TaskConfig)
    """Sequences, SQuAD windows and answers."""
