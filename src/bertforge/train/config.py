"""Configuration of `bertforge pretrain`: model, data, train and optim sections."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from bertforge.config import ModelConfig, OptimConfig, TrainConfig, refuse_empty_paths
from bertforge.errors import ConfigError


@dataclasses.dataclass
class PretrainDataConfig:
    """Where the pre-training shards are and how they are read."""

    input_dir: str = ""
    """Directory of training shards (ours, NVIDIA-format, packed or dynamic-masking)."""
    eval_dir: str | None = None
    """Directory of held-out shards for periodic MLM/NSP evaluation (None: no evaluation)."""
    vocab: str | None = None
    """vocab.txt, tokenizer.json or a directory holding one: sets the vocab size and is copied into every
    checkpoint's model directory (None: the vocab named by the shards' manifest.json, if any)."""
    eval_batches: int = 50
    """Evaluate on at most this many micro-batches of data.eval_dir (0: all of it)."""
    chunk_rows: int = 2048
    """Rows read from a shard at a time (one HDF5 slice; rows are shuffled within it)."""
    num_workers: int = 2
    """Data-loader worker processes per rank (0: load in the training process)."""
    prefetch: int = 4
    """Batches each worker prepares ahead."""

    pack_per_row: int = 0
    """Dynamic-masking and MLM-only shards: pack each micro-batch of sequences on the fly into rows of at most
    this many sequences (0: off). Stored-mask shards are packed once with `bertforge pack` instead."""

    mlm_probability: float | None = None
    """Masking rate of shards masked in the loader (dynamic, MLM-only): the fraction of each row's tokens
    predicted, e.g. 0.15 (BERT, RoBERTa) or 0.30 (MosaicBERT, ModernBERT); None: the rate the shards were built
    with (`data shards --masked-lm-prob`, default 0.15). Masked-LM slots widen to fit it."""
    eval_mlm_probability: float | None = None
    """Masking rate of held-out evaluation on loader-masked shards; None: the training rate (data.mlm_probability).
    Set it (e.g. 0.15) to compare runs trained at different rates on one task: accuracy at 30% masking is lower
    than at 15% for the same model."""
    mask_replace_prob: float = 0.8
    """Of the masked positions, the fraction replaced by [MASK] (BERT's 80/10/10: 0.8)."""
    random_replace_prob: float = 0.1
    """Of the masked positions, the fraction replaced by a random token (0.1); the rest keep their token."""

    synthetic_seq_len: int = 128
    """data.input_dir: synthetic only: sequence length of the generated rows (128 phase 1, 512 phase 2)."""
    synthetic_max_pred: int = 20
    """data.input_dir: synthetic only: masked-LM predictions per sequence at most (20 phase 1, 80 phase 2)."""
    synthetic_histogram: str | list = "wiki"
    """data.input_dir: synthetic only: real-length distribution: "wiki" (an imitation of Wikipedia's phase-1 or
    phase-2 histogram, by seq_len), "full" (every row full length) or a list of [length, weight] pairs."""
    synthetic_pack: int = 0
    """data.input_dir: synthetic only: 0 = unpacked rows; K = packed rows of at most K sequences (as
    `bertforge pack --max-per-pack K` makes them; the update then takes global / avg_seq_per_sample rows)."""
    synthetic_pack_algorithm: str = "lpfhp"
    """data.input_dir: synthetic only: packing algorithm of packed rows (lpfhp | spfhp | nnlshp; nnlshp packs
    denser, ~2.0 sequences per row at seq 512 and K=3 like MLPerf's data, and takes ~20 s at start)."""
    synthetic_vocab_size: int = 30522
    """data.input_dir: synthetic only: token ids are drawn below this (bert-base-uncased's layout of [CLS],
    [SEP], [MASK] from 1000 up; [PAD] [UNK] [CLS] [SEP] [MASK] = 0..4 below)."""

    @property
    def mask_split(self) -> tuple[float, float]:
        """(P([MASK]), P(random token)) of a masked position, as the loader takes it."""
        return (self.mask_replace_prob, self.random_replace_prob)

    @property
    def eval_masking(self) -> dict[str, Any]:
        """`eval_batches`' masking arguments for held-out evaluation (the training rate unless one is set)."""
        rate = self.mlm_probability if self.eval_mlm_probability is None else self.eval_mlm_probability
        return {"mlm_probability": rate, "mask_split": self.mask_split}

    @property
    def synthetic(self) -> bool:
        """True when batches are generated on the fly (`data.input_dir: synthetic`) instead of read."""
        return self.input_dir == "synthetic"

    def validate(self) -> None:
        if self.num_workers < 0:
            raise ConfigError(f"data.num_workers must be >= 0, got {self.num_workers}")
        if self.eval_batches < 0 or self.chunk_rows < 1:
            raise ConfigError("data.eval_batches must be >= 0 and data.chunk_rows >= 1")
        if self.prefetch < 1:
            raise ConfigError(f"data.prefetch must be >= 1, got {self.prefetch}")
        refuse_empty_paths(self, "data.", ["eval_dir", "vocab"])
        if self.pack_per_row < 0:  # else the loader's workers fail on it, naming `bertforge pack`'s --max-per-pack
            raise ConfigError(f"data.pack_per_row must be >= 0 (0: no packing), got {self.pack_per_row}")
        if self.pack_per_row > 127:  # input_mask holds each token's sequence index as int8 (DESIGN §3.3)
            raise ConfigError(f"data.pack_per_row must be at most 127 (input_mask is int8), got {self.pack_per_row}")
        from bertforge.data.instances import REPLACE_SPLIT, check_replace_split
        from bertforge.data.synthetic import check_params

        check_params(
            self.synthetic_seq_len,
            self.synthetic_max_pred,
            self.synthetic_vocab_size,
            self.synthetic_histogram,
            self.synthetic_pack,
            self.synthetic_pack_algorithm,
        )
        for key in ("mlm_probability", "eval_mlm_probability"):
            rate = getattr(self, key)
            if rate is not None and not 0.0 < rate < 1.0:
                raise ConfigError(f"data.{key} must be in (0, 1) (or null), got {rate}")
        try:
            check_replace_split(self.mask_split)
        except ValueError as e:
            raise ConfigError(f"data.mask_replace_prob / data.random_replace_prob: {e}") from None
        if self.synthetic and (
            self.mlm_probability is not None
            or self.eval_mlm_probability is not None
            or self.mask_split != REPLACE_SPLIT
        ):
            raise ConfigError(
                "data.mlm_probability, data.eval_mlm_probability and the replacement split apply to shards "
                "masked in the loader; "
                "data.input_dir: synthetic draws its own masks, so leave them unset"
            )
        unused = [
            f"data.{f.name}"
            for f in dataclasses.fields(self)
            if f.name.startswith("synthetic_") and getattr(self, f.name) != f.default
        ]
        if unused and not self.synthetic:
            raise ConfigError(
                f"{', '.join(unused)} describe the batches of data.input_dir: synthetic; data.input_dir is "
                f"{self.input_dir!r}, which would ignore them: leave them out or set data.input_dir=synthetic"
            )
        if self.synthetic and self.pack_per_row:
            raise ConfigError(
                "data.pack_per_row packs dynamic-masking shards; with data.input_dir: synthetic "
                "set data.synthetic_pack instead"
            )


OBJECTIVE_TASKS = {"mlm_nsp": "pretraining", "mlm": "mlm"}
"""train.objective -> the model task (`bertforge.model.heads.TASK_HEADS`) whose head and loss it trains."""


@dataclasses.dataclass
class PretrainTrainConfig(TrainConfig):
    """The pre-training run: the shared `train` keys plus the objective, checkpoints, time-limited jobs and
    phases."""

    objective: str = "mlm_nsp"
    """mlm_nsp: masked LM + next-sentence prediction on sentence pairs (BERT); mlm: masked LM only on MLM-only
    shards (`bertforge data shards --objective mlm`; RoBERTa, MosaicBERT, ModernBERT): no NSP head or loss.
    Must match the shards' kind (checked at start-up)."""

    save_every: int = 200
    """Write a checkpoint every N optimizer steps (and at the end); 0: never (benchmarks and smoke tests)."""
    keep_last: int = 3
    """Keep the newest K checkpoints."""
    stop_after_steps: int = 0
    """End this process after this many more updates from the step it started or resumed at (0: run to max_steps),
    with a checkpoint: for time-limited cluster jobs resubmitted with --resume (the schedule still spans
    max_steps)."""
    init_checkpoint: str | None = None
    """Phase 2: a phase-1 checkpoint (step_N dir or its run dir) whose weights and optimizer moments start this
    phase, with the step reset and this config's schedule. A --resume in this phase's output_dir wins over it."""

    @property
    def task(self) -> str:
        """The model task this objective trains: "pretraining" (MLM + NSP heads) or "mlm"."""
        return OBJECTIVE_TASKS[self.objective]

    def validate(self) -> None:
        for name in ("max_steps", "keep_last"):  # first: the shared check allows max_steps 0 (fine-tuning's epochs)
            if getattr(self, name) < 1:
                raise ConfigError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        super().validate()
        if self.objective not in OBJECTIVE_TASKS:
            raise ConfigError(f"train.objective must be {' or '.join(OBJECTIVE_TASKS)}, not {self.objective!r}")
        if self.save_every < 0:
            raise ConfigError(f"train.save_every must be >= 0 (0: no checkpoints), got {self.save_every}")
        refuse_empty_paths(self, "train.", ["init_checkpoint"])
        if self.stop_after_steps < 0:
            raise ConfigError(f"train.stop_after_steps must be >= 0 (0: run to max_steps), got {self.stop_after_steps}")


@dataclasses.dataclass
class PretrainConfig:
    """A pre-training phase."""

    RENAMED: ClassVar[dict[str, str]] = {
        "model.attention": "train.attention",
        "model.compile": "train.compile",
        "model.activation_checkpointing": "train.activation_checkpointing",
    }
    """Keys that moved: runtime choices left the model section (architecture only)."""

    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    """The model."""
    data: PretrainDataConfig = dataclasses.field(default_factory=PretrainDataConfig)
    """The input shards."""
    train: PretrainTrainConfig = dataclasses.field(default_factory=PretrainTrainConfig)
    """The run."""
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    """The optimizer."""

    def validate(self) -> None:
        from bertforge.model.config import MODEL_PRESETS

        modern = MODEL_PRESETS[self.model.preset].model_type == "modernbert"
        if modern and not self.model.init_from and self.train.objective == "mlm_nsp":  # init_from: checked at load
            raise ConfigError(
                f"train.objective mlm_nsp trains BERT's next-sentence head, which {self.model.preset} does not have: "
                "set train.objective=mlm (MLM-only shards: data shards --objective mlm)"
            )
