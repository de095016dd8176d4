"""Variable-length flash attention *with attention dropout*, on torch's own FlashAttention-2 kernels.

`torch.nn.attention.varlen.varlen_attn` calls the same kernels as this op (`aten::_flash_attention_forward`
and `_flash_attention_backward`, which SDPA's flash backend runs too) but fixes dropout at 0, so BERT's
recipe (attention dropout 0.1) could not train on unpadded or packed tokens without the flash-attn package:
it fell back to SDPA with a dense (T, T) block mask. This op passes `dropout_p` through. The forward kernel
draws its keep mask from the CUDA generator's Philox stream and returns the (seed, offset) it used; the
backward kernel regenerates the same mask from them, so no mask is ever stored.

It is a `torch.library` custom op with a fake (shape) implementation and a registered backward, as torch's
own varlen op is: torch.compile treats it as one opaque kernel. CUDA only (sm80 or newer), fp16/bf16 inputs,
head dim a multiple of 8 up to 256: `attention.varlen_usable` decides when it runs.
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor


def _random_op(name: str):
    """`torch.library.custom_op`, tagged random like aten's own kernel: compiled activation checkpointing then
    replays the forward's RNG state when it recomputes the op (a fresh draw would give the backward another mask
    than the forward used). A torch without custom_op's `tags` gets the untagged op."""
    try:
        return torch.library.custom_op(name, mutates_args=(), tags=(torch.Tag.nondeterministic_seeded,))
    except TypeError:
        return torch.library.custom_op(name, mutates_args=())


def _forward(q, k, v, cu_seqlens, max_seqlen, dropout_p, left, right):
    """aten's varlen forward: out, logsumexp, seed, offset (its debug mask dropped)."""
    out, lse, seed, offset, _ = torch.ops.aten._flash_attention_forward(
        q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, False, False,
        window_size_left=left, window_size_right=right,
    )  # fmt: skip
    return out, lse, seed, offset


@_random_op("bertforge::flash_varlen")
def flash_varlen_op(
    q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, max_seqlen: int, dropout_p: float, left: int, right: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """q, k, v (N, nh, D); cu_seqlens (S+1,) int32 -> out (N, nh, D), logsumexp (nh, N) fp32, and the
    Philox seed and offset the dropout mask was drawn with. left/right: the key window (-1: unbounded)."""
    return _forward(q, k, v, cu_seqlens, max_seqlen, dropout_p, left, right)


# the shapes: aten's own meta kernel, run on the fake tensors (the seed/offset layout differs on ROCm)
flash_varlen_op.register_fake(_forward)


@torch.library.custom_op("bertforge::flash_varlen_backward", mutates_args=())
def flash_varlen_backward_op(
    grad: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, cu_seqlens: Tensor,
    max_seqlen: int, dropout_p: float, seed: Tensor, offset: Tensor, left: int, right: int,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """-> dq, dk, dv (N, nh, D), with the forward's dropout mask regenerated from its seed and offset."""
    dq, dk, dv = torch.ops.aten._flash_attention_backward(
        grad.contiguous(), q, k, v, out, lse, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, False,
        seed, offset, window_size_left=left, window_size_right=right,
    )  # fmt: skip
    return dq, dk, dv


@flash_varlen_backward_op.register_fake
def _flash_varlen_backward_fake(grad, q, k, v, out, lse, cu_seqlens, max_seqlen, dropout_p, seed, offset, left, right):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup(ctx, inputs, output) -> None:
    q, k, v, cu_seqlens, max_seqlen, dropout_p, left, right = inputs
    out, lse, seed, offset = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens, seed, offset)
    ctx.args = (max_seqlen, dropout_p, left, right)


def _backward(ctx, grad, _lse, _seed, _offset):
    q, k, v, out, lse, cu_seqlens, seed, offset = ctx.saved_tensors
    max_seqlen, dropout_p, left, right = ctx.args
    dq, dk, dv = flash_varlen_backward_op(
        grad, q, k, v, out, lse, cu_seqlens, max_seqlen, dropout_p, seed, offset, left, right
    )
    return dq, dk, dv, None, None, None, None, None


flash_varlen_op.register_autograd(_backward, setup_context=_setup)


def flash_varlen(
    q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, max_seqlen: int, dropout_p: float = 0.0,
    half_window: int | None = None,
) -> Tensor:  # fmt: skip
    """q, k, v (N, nh, D) unpadded -> (N, nh, D): each sequence of `cu_seqlens` attends within itself, to keys
    within `half_window` positions when given (bounds inclusive), with dropout on the probabilities."""
    w = -1 if half_window is None else half_window
    return flash_varlen_op(q, k, v, cu_seqlens, max_seqlen, dropout_p, w, w)[0]


def flash_heads(head_dim: int) -> bool:
    """The head sizes FlashAttention-2 takes: multiples of 8 up to 256."""
    return head_dim % 8 == 0 and head_dim <= 256


_CAPABLE: dict[int, bool] = {}


@torch.compiler.assume_constant_result
def flash_capable(index: int) -> bool:
    """FlashAttention-2 runs on sm80 (A100) and newer; an older GPU keeps the masked SDPA path."""
    if index not in _CAPABLE:
        _CAPABLE[index] = torch.cuda.get_device_capability(index) >= (8, 0)
    return _CAPABLE[index]
