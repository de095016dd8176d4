"""Attention kernels: SDPA (default), variable-length flash attention (no padding compute), eager reference.

The attention mask convention (see COMMON contract and DESIGN §3.3): `attention_mask (B, T)` holds 0 for
padding and, for a real token, the index (1..k) of the sequence it belongs to within the row. Ordinary rows
are the special case k = 1. A real token attends to the real tokens of its own sequence (block-diagonal);
a padding token attends to every real token of its row, exactly like Hugging Face's key-only padding mask,
so outputs at padding positions match `transformers` too and no softmax row is ever empty (empty rows give
NaN with -inf masking). A row with no real token at all attends everywhere, for the same reason.

Kernels, chosen per model by name (`ATTENTION_IMPLS`):
- `sdpa`: `torch.nn.functional.scaled_dot_product_attention` with a boolean (B, 1, T, T) mask.
- `varlen`: tokens unpadded to (N, H) for the whole encoder, so no matmul runs on padding. Attention runs in a
  varlen flash kernel (`flash_attn.flash_attn_varlen_func` when installed, else
  `torch.nn.attention.varlen.varlen_attn`) on CUDA with half-precision inputs; anywhere else the layer
  re-pads q/k/v for `sdpa` with the block mask and unpads the context again. Data-dependent shapes
  (`nonzero`): meant for eager mode, not for one compiled graph.
- `auto`: the flash varlen path where it is usable for the batch, else plain padded `sdpa` (compiles without
  graph breaks on CPU) — except when training with attention dropout on CPU in eager mode, where it takes
  `unfused`: SDPA has no fused dropout kernel there and falls back to this same computation with torch's slow
  dropout; written out with `model.dropout`'s mask it is ~2x faster (bf16, forward + backward).
- `eager`: softmax(QK^T / sqrt(d) + mask) V written out, the reference the others are tested against.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from bertforge.model.dropout import keep_mask

ATTENTION_IMPLS = ("auto", "sdpa", "varlen", "eager")


def flash_varlen_kernel():
    """The installed varlen flash-attention function, or None (flash-attn package first, then torch's own)."""
    try:
        from flash_attn import flash_attn_varlen_func

        return "flash_attn", flash_attn_varlen_func
    except ImportError:
        pass
    try:
        from torch.nn.attention.varlen import varlen_attn

        return "torch", varlen_attn
    except ImportError:
        return None


# looked up once at import: an import inside the traced forward would break torch.compile's graph
VARLEN_KERNEL = flash_varlen_kernel()


def resolve_attention(name: str) -> str:
    """Validate a kernel name; `auto` stays `auto` (decided per batch: flash varlen where usable, else sdpa)."""
    if name not in ATTENTION_IMPLS:
        from bertforge.errors import ConfigError

        raise ConfigError(f"attention must be one of {', '.join(ATTENTION_IMPLS)}, not {name!r}")
    return name


def block_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) sequence index (0 = padding) -> (B, 1, T, T) bool, True where query t may attend to key s."""
    q = attention_mask[:, :, None]  # (B, T, 1)
    k = attention_mask[:, None, :]  # (B, 1, T)
    real_k = k != 0
    allowed = real_k & ((q == k) | (q == 0))  # (B, T, T): own sequence; padding queries see all real keys
    empty_row = ~real_k.any(dim=-1, keepdim=True)  # (B, 1, 1): a row of padding only attends everywhere
    return (allowed | empty_row)[:, None]  # (B, 1, T, T)


@dataclass
class VarlenMeta:
    """Where the real tokens are, for the unpadded (N, H) layout: the varlen kernels' inputs."""

    indices: torch.Tensor
    """(N,) flat indices of the real tokens in the (B*T) padded layout."""
    cu_seqlens: torch.Tensor
    """(S+1,) int32 cumulative sequence lengths over the N real tokens (one entry per packed sequence)."""
    max_seqlen: int
    """Longest sequence, for the kernel's tiling."""
    shape: tuple[int, int]
    """(B, T) of the padded layout."""


def varlen_meta(attention_mask: torch.Tensor, lengths: bool = True) -> VarlenMeta:
    """Sequences are the maximal runs of one nonzero index within a row (packed rows keep them contiguous).
    `lengths=False` skips cu_seqlens/max_seqlen (the unpadded SDPA path needs only the indices)."""
    flat = attention_mask.reshape(-1)  # (B*T,)
    indices = torch.nonzero(flat, as_tuple=False).flatten()  # (N,)
    shape = (attention_mask.shape[0], attention_mask.shape[1])
    if not lengths:
        return VarlenMeta(indices, indices.new_zeros(0, dtype=torch.int32), 0, shape)
    seq = flat[indices]  # (N,)
    row = torch.div(indices, attention_mask.shape[1], rounding_mode="floor")  # (N,)
    starts = torch.ones_like(seq, dtype=torch.bool)
    starts[1:] = (seq[1:] != seq[:-1]) | (row[1:] != row[:-1])
    start_idx = torch.nonzero(starts, as_tuple=False).flatten()  # (S,)
    cu = torch.cat([start_idx, start_idx.new_tensor([indices.numel()])]).to(torch.int32)  # (S+1,)
    max_seqlen = int((cu[1:] - cu[:-1]).max().item()) if cu.numel() > 1 else 0
    return VarlenMeta(indices, cu, max_seqlen, shape)


def sdpa(q, k, v, mask: torch.Tensor, dropout_p: float) -> torch.Tensor:
    """q, k, v (B, nh, T, D), mask (B, 1, T, T) bool -> (B, nh, T, D)."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)


def eager(q, k, v, mask: torch.Tensor, dropout_p: float) -> torch.Tensor:
    """The reference: scores, -inf where not allowed, softmax, dropout, weighted sum. Shapes as `sdpa`."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, nh, T, T)
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    probs = F.dropout(probs, p=dropout_p, training=dropout_p > 0)
    return probs @ v  # (B, nh, T, D)


def unfused(q, k, v, mask: torch.Tensor, dropout_p: float) -> torch.Tensor:
    """SDPA's CPU math path written out, with the cheaper dropout mask of `model.dropout`. Shapes as `sdpa`.

    Precision: SDPA's math path computes 16-bit inputs in fp32. Here the scores and softmax are fp32 (scores
    rounded to bf16 carry ~0.4% error into exp(): that doubled the output and q/k gradient error against
    SDPA's and cost fine-tuning F1); the probabilities then go back to the input dtype for dropout and the
    product with V, whose rounding averages out over the keys. Output and gradient errors stay within SDPA's
    (tests/model/test_dropout.py) at a third of full fp32's extra cost. Autocast is off inside: under it the
    fp32 matmul would be cast back down to bf16.
    """
    dtype = q.dtype
    with torch.autocast(q.device.type, enabled=False):
        q32 = q.float() * (1.0 / math.sqrt(q.shape[-1]))  # the scale on (B, nh, T, D), not on the scores
        scores = (q32 @ k.float().transpose(-1, -2)).masked_fill_(~mask, float("-inf"))  # (B, nh, T, T) fp32
        probs = torch.softmax(scores, dim=-1).to(dtype)  # every row keeps a real key (see block_mask)
        if dropout_p == 0.0:
            return probs @ v
        # dropout as `model.dropout` (same mask, same draws) with its 1/q scale moved to the (B, nh, T, D)
        # output: one pass over the (T, T) probabilities instead of two
        keep, scale = keep_mask(probs.shape, dropout_p, probs.device)
        return (torch.where(keep, probs, 0.0) @ v).mul_(scale)  # (B, nh, T, D)


def varlen(q, k, v, meta: VarlenMeta, dropout_p: float) -> torch.Tensor:
    """q, k, v (N, nh, D) unpadded -> (N, nh, D) with a varlen flash kernel (callers check availability)."""
    kind, fn = VARLEN_KERNEL
    if kind == "flash_attn":
        return fn(q, k, v, meta.cu_seqlens, meta.cu_seqlens, meta.max_seqlen, meta.max_seqlen, dropout_p=dropout_p)
    return fn(q, k, v, meta.cu_seqlens, meta.cu_seqlens, meta.max_seqlen, meta.max_seqlen)


def varlen_usable(hidden: torch.Tensor, dropout_p: float) -> bool:
    """The varlen kernels run on CUDA in fp16/bf16 only (torch's own without attention dropout); elsewhere
    the encoder keeps the padded SDPA path with the block mask."""
    if not hidden.is_cuda or VARLEN_KERNEL is None or (VARLEN_KERNEL[0] == "torch" and dropout_p > 0):
        return False
    dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else hidden.dtype
    return dtype in (torch.float16, torch.bfloat16)
