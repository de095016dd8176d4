"""Configuration of `bertforge finetune`: one class for SQuAD and GLUE tasks."""

from __future__ import annotations

import dataclasses

from bertforge.errors import ConfigError


@dataclasses.dataclass
class FinetuneConfig:
    """Hyper-parameters of a fine-tuning run (the defaults are BERT's GLUE recipe)."""

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
    epochs: float = 3.0
    """Passes over the training set."""
    lr: float = 2e-5
    """Peak learning rate of AdamW."""
    warmup: float = 0.1
    """Fraction of steps with linear warm-up."""
    weight_decay: float = 0.01
    """Decoupled weight decay (0 for bias and LayerNorm)."""
    adam_eps: float = 1e-6
    """AdamW epsilon (Google BERT's fine-tuning optimizer uses 1e-6)."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this (BERT and Hugging Face: 1.0)."""
    max_steps: int = 0
    """Stop after this many optimizer updates (0: `epochs` decides); the schedule spans the shorter."""
    log_every: int = 20
    """Log loss, lr and throughput every this many updates."""
    batch_size: int = 32
    """Sequences per optimizer update over all devices."""
    micro_batch_size: int = 32
    """Sequences per forward/backward on one device."""
    eval_batch_size: int = 128
    """Sequences per evaluation batch."""
    precision: str = "auto"
    """auto, fp32, bf16 or fp16."""
    device: str = "auto"
    """auto, cpu, cuda[:N], xpu, hpu or mps."""
    group_by_length: bool = False
    """Draw each training batch from rows of similar length (length-sorted mega-batches of 50 batches, batch
    order shuffled; Hugging Face's `group_by_length`): less padding per batch, same rows per epoch."""
    pad_to_max_length: bool = False
    """Pad every training batch to max_seq_len, as Google's run_squad.py and Hugging Face's run_qa.py do (their
    default), instead of to its own longest row. The SQuAD loss is a softmax over every position of the padded
    row, padding included, so only this gives their training objective exactly; it costs the compute on padding.
    GLUE losses read [CLS] only and do not change."""
    dropout: float | None = None
    """Hidden and attention dropout of the model (None: the checkpoint's own config.json rates)."""
    attention: str = "auto"
    """Attention kernel of the model: auto, sdpa, varlen or eager (see model.attention)."""
    seed: int = 42
    """Seed of the head init, dropout and data order."""
    output_dir: str = "runs/finetune"
    """Where the best model, predictions and metrics go."""

    def validate(self) -> None:
        if self.max_seq_len < 8:
            raise ConfigError(f"max_seq_len must be at least 8, got {self.max_seq_len}")
        if self.batch_size % self.micro_batch_size:
            raise ConfigError(f"batch_size {self.batch_size} is not a multiple of micro_batch_size {self.micro_batch_size}")
        if self.precision not in ("auto", "fp32", "bf16", "fp16"):
            raise ConfigError(f"precision must be auto, fp32, bf16 or fp16, not {self.precision!r}")
        if self.epochs <= 0 or self.lr <= 0:
            raise ConfigError("epochs and lr must be > 0")
        if self.max_query_len + 4 >= self.max_seq_len:
            raise ConfigError(f"max_query_len {self.max_query_len} leaves no room for context in max_seq_len "
                              f"{self.max_seq_len}; lower max_query_len or raise max_seq_len")
        if not 0.0 <= self.warmup < 1.0:
            raise ConfigError(f"warmup is a fraction of the steps in [0, 1), got {self.warmup}")
        if self.max_steps < 0 or self.log_every < 1:
            raise ConfigError("max_steps must be >= 0 and log_every >= 1")
