"""The `train` settings that change a built model from outside (DESIGN §2: the model holds no runtime
choices), applied in one place for pre-training and fine-tuning, after the weights are in and before DDP and
torch.compile wrap the model: activation checkpointing (`runtime.activation`) and low-precision LayerNorm
(`runtime.norms`). Neither changes parameter names or state_dict keys."""

from __future__ import annotations

from torch import nn

from bertforge.config import TrainConfig
from bertforge.runtime.activation import apply_activation_checkpointing
from bertforge.runtime.norms import apply_low_precision_layernorm


def apply_model_choices(model: nn.Module, train: TrainConfig) -> nn.Module:
    """`model` with the run's checkpointing and LayerNorm precision applied (in place; returned for chaining)."""
    if train.activation_checkpointing:
        apply_activation_checkpointing(model)
    if train.low_precision_layernorm:
        apply_low_precision_layernorm(model)
    return model
