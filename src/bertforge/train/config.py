"""Configuration of `bertforge pretrain`: model, data, train and optim sections."""

from __future__ import annotations

import dataclasses

from bertforge.config import ModelConfig
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
    """Dynamic-masking shards: pack each micro-batch of sequences on the fly into rows of at most this many
    sequences (0: off). Stored-mask shards are packed once with `bertforge pack` instead."""

    def validate(self) -> None:
        if self.num_workers < 0:
            raise ConfigError(f"data.num_workers must be >= 0, got {self.num_workers}")
        if self.eval_batches < 0 or self.chunk_rows < 1:
            raise ConfigError("data.eval_batches must be >= 0 and data.chunk_rows >= 1")
        if self.prefetch < 1:
            raise ConfigError(f"data.prefetch must be >= 1, got {self.prefetch}")


@dataclasses.dataclass
class TrainConfig:
    """The training run: batch arithmetic, precision, logging, checkpoints."""

    output_dir: str = "runs/pretrain"
    """Where checkpoints, metrics.jsonl, summary.json and plots go."""
    max_steps: int = 1000
    """Optimizer updates in this phase (the schedule's horizon)."""
    global_batch_size: int = 256
    """Sequences per optimizer update, over all ranks and accumulation steps."""
    micro_batch_size: int = 32
    """Sequences per forward/backward on one device; accumulation = global / (micro x world size)."""
    precision: str = "auto"
    """auto, fp32, bf16 or fp16 (fp16 uses dynamic loss scaling)."""
    device: str = "auto"
    """auto, cpu, cuda[:N], xpu, hpu or mps."""
    seed: int = 12345
    """Seed of initialisation, dropout and data order."""
    log_every: int = 10
    """Log metrics every N optimizer steps."""
    save_every: int = 200
    """Write a checkpoint every N optimizer steps (and at the end)."""
    eval_every: int = 200
    """Evaluate on data.eval_dir every N optimizer steps (and at the end)."""
    keep_last: int = 3
    """Keep the newest K checkpoints."""
    max_nonfinite_steps: int = 20
    """Stop after this many non-finite steps in a row."""
    tensorboard: bool = True
    """Write TensorBoard scalars to output_dir/tensorboard."""
    plot: bool = True
    """Draw output_dir/metrics.png (loss and accuracy curves) at the end."""
    stop_after_steps: int = 0
    """End this process after this many updates of the phase (0: run to max_steps), with a checkpoint: for
    time-limited cluster jobs that continue with --resume (the schedule still spans max_steps)."""
    init_checkpoint: str | None = None
    """Phase 2: a phase-1 checkpoint (step_N dir or its run dir) whose weights and optimizer moments start this
    phase, with the step reset and this config's schedule. A --resume in this phase's output_dir wins over it."""

    def validate(self) -> None:
        for name in ("max_steps", "global_batch_size", "micro_batch_size", "log_every", "save_every",
                     "eval_every", "keep_last", "max_nonfinite_steps"):
            if getattr(self, name) < 1:
                raise ConfigError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        if self.precision not in ("auto", "fp32", "bf16", "fp16"):
            raise ConfigError(f"train.precision must be auto, fp32, bf16 or fp16, not {self.precision!r}")
        if self.global_batch_size % self.micro_batch_size:
            raise ConfigError(
                f"train.global_batch_size {self.global_batch_size} is not a multiple of train.micro_batch_size "
                f"{self.micro_batch_size}; change one of them"
            )


@dataclasses.dataclass
class OptimConfig:
    """Optimizer and learning-rate schedule (NVIDIA recipe by default)."""

    name: str = "lamb"
    """lamb (NVLAMB semantics) or adamw."""
    lr: float = 6e-3
    """Peak learning rate."""
    warmup: float = 0.2843
    """Fraction of max_steps spent warming up."""
    schedule: str = "poly"
    """poly (NVIDIA PolyWarmUp, degree 0.5) or linear (Google/HF: linear warmup, linear decay)."""
    weight_decay: float = 0.01
    """Decoupled weight decay (0 for bias and LayerNorm parameters)."""
    beta1: float = 0.9
    """First-moment decay."""
    beta2: float = 0.999
    """Second-moment decay."""
    eps: float = 1e-6
    """Denominator epsilon."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this (0: no clipping)."""

    def validate(self) -> None:
        if self.name not in ("lamb", "adamw"):
            raise ConfigError(f"optim.name must be lamb or adamw, not {self.name!r}")
        if self.schedule not in ("poly", "linear"):
            raise ConfigError(f"optim.schedule must be poly or linear, not {self.schedule!r}")
        if not 0.0 <= self.warmup < 1.0:
            raise ConfigError(f"optim.warmup is a fraction of max_steps in [0, 1), got {self.warmup}")
        if self.lr <= 0:
            raise ConfigError(f"optim.lr must be > 0, got {self.lr}")


@dataclasses.dataclass
class PretrainConfig:
    """A pre-training phase."""

    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    """The model."""
    data: PretrainDataConfig = dataclasses.field(default_factory=PretrainDataConfig)
    """The input shards."""
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    """The run."""
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    """The optimizer."""
