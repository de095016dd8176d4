"""Low-precision LayerNorm, applied to a built model from outside (DESIGN §2: the model holds no runtime
choices): `train.low_precision_layernorm`.

Why: autocast runs `layer_norm` in fp32 on CUDA (it is on autocast's fp32 list), so every LayerNorm hands an fp32
tensor to the residual stream. A post-LN BERT's hidden states, the residual adds and their gradients then all
travel in fp32, and each one also needs a 16-bit copy for the next matmul: twice the bytes of the bf16 matmul
inputs around them, in a step whose non-matmul time is memory traffic. Here each LayerNorm runs in the autocast
dtype instead (bf16 or fp16 in and out; the kernel still accumulates its mean and variance in fp32), so the
residual stream and its gradients stay 16-bit. This is MosaicBERT's recipe (Composer's LowPrecisionLayerNorm,
"an alternative to Fused LayerNorm"); the cost is a 16-bit residual add, as in NVIDIA's fp16 MLPerf BERT.

    apply_low_precision_layernorm(model)   # every nn.LayerNorm; names and state_dict unchanged

Outside autocast (fp32 runs, an fp32 evaluation, export) the layer is the plain LayerNorm, bit for bit. As with
activation checkpointing, only the instance's `forward` is replaced, so parameter names, `state_dict()` keys and
checkpoints are exactly the model's. Apply it before torch.compile and DDP.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn


def _low_precision_forward(norm: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    kind = x.device.type
    if not torch.is_autocast_enabled(kind):
        return type(norm).forward(norm, x)  # fp32 runs: the plain LayerNorm
    dtype = torch.get_autocast_dtype(kind)
    weight = None if norm.weight is None else norm.weight.to(dtype)
    bias = None if norm.bias is None else norm.bias.to(dtype)
    # autocast would lift layer_norm back to fp32 (its fp32 list, on CUDA): run it in dtype with autocast off
    with torch.autocast(kind, enabled=False):
        return F.layer_norm(x.to(dtype), norm.normalized_shape, weight, bias, norm.eps)


def is_low_precision(norm: nn.Module) -> bool:
    return getattr(norm.forward, "__func__", None) is _low_precision_forward


def apply_low_precision_layernorm(model: nn.Module) -> int:
    """Run every nn.LayerNorm of `model` in the autocast dtype (in place); returns how many there are. Applying it
    twice is the same as once; a model with no LayerNorm is an error rather than a silent no-op."""
    norms = [m for m in model.modules() if isinstance(m, nn.LayerNorm)]
    if not norms:
        raise ValueError(f"low-precision LayerNorm: {type(model).__name__} has no nn.LayerNorm")
    for norm in norms:
        if not is_low_precision(norm):
            # an instance attribute shadows the class's forward for this norm only (is_low_precision tests it)
            norm.forward = types.MethodType(_low_precision_forward, norm)  # type: ignore[method-assign]
    return len(norms)
