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
  varlen flash kernel (`flash_attn.flash_attn_varlen_func` when installed, else torch's own FlashAttention-2
  kernels through `model.flash_varlen`; both apply attention dropout) on CUDA (sm80+) with half-precision
  inputs; anywhere else the layer re-pads q/k/v for `sdpa` with the block mask and unpads the context again.
  Data-dependent shapes (`nonzero`): meant for eager mode, not for one compiled graph.
- `auto`: the flash varlen path where it is usable for the batch — in the segmented layout (every token, fixed
  shapes: `segment_bounds`) when the batch carries `cu_seqlens`, else unpadded — or plain padded `sdpa`
  (compiles without graph breaks on CPU) — except when training with attention dropout on CPU in eager mode,
  where it takes `unfused`: SDPA has no fused dropout kernel there and falls back to this same computation
  with torch's slow dropout; written out with `model.dropout`'s mask it is ~2x faster (bf16, forward +
  backward).
- `eager`: softmax(QK^T / sqrt(d) + mask) V written out, the reference the others are tested against.

Every encoder family goes through `attend` (fused qkv in, context out, in whichever layout the encoder runs).
ModernBERT adds two things here, both as Hugging Face's `ModernBertAttention` defines them: rotary position
embeddings on q and k (`rope_tables`, `rotate`; Su et al. 2021, the rotate-half layout), and sliding-window
local attention, a constraint on the scores: query i sees key j only when |i - j| <= local_attention // 2
(`block_mask(..., half_window)` for the masked kernels, or on rows past three half-windows `BandMask`, the same
constraint computed in blocks with memory linear in T; the kernel's `window_size` for varlen flash).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from bertforge.model.dropout import fast_dropout_usable, keep_mask
from bertforge.model.flash_varlen import flash_capable, flash_heads, flash_varlen

ATTENTION_IMPLS = ("auto", "sdpa", "varlen", "eager")


def flash_varlen_kernel():
    """The varlen flash-attention function to use, or None: the flash-attn package when installed, else torch's
    own FlashAttention-2 kernels through `model.flash_varlen` (dropout included; needs a CUDA build of torch)."""
    try:
        from flash_attn import flash_attn_varlen_func

        return "flash_attn", flash_attn_varlen_func
    except ImportError:
        pass
    if not hasattr(torch.ops.aten, "_flash_attention_forward"):
        return None
    return "torch", flash_varlen


# looked up once at import: an import inside the traced forward would break torch.compile's graph
VARLEN_KERNEL = flash_varlen_kernel()


def resolve_attention(name: str) -> str:
    """Validate a kernel name; `auto` stays `auto` (decided per batch: flash varlen where usable, else sdpa)."""
    if name not in ATTENTION_IMPLS:
        from bertforge.errors import ConfigError

        raise ConfigError(f"attention must be one of {', '.join(ATTENTION_IMPLS)}, not {name!r}")
    return name


def block_mask(attention_mask: torch.Tensor, half_window: int | None = None) -> torch.Tensor:
    """(B, T) sequence index (0 = padding) -> (B, 1, T, T) bool, True where query t may attend to key s.
    `half_window`: only keys within that distance (ModernBERT's local layers), padding queries included, as
    Hugging Face's sliding-window mask. A query left with no key (only ever a padding query, whose output is
    undefined: HF's own kernels differ there) attends everywhere, or to every key in its window in a local
    layer (what the blocked `band_mask` can do too), so no softmax row is empty."""
    q = attention_mask[:, :, None]  # (B, T, 1)
    k = attention_mask[:, None, :]  # (B, 1, T)
    allowed = (k != 0) & ((q == k) | (q == 0))  # (B, T, T): own sequence; padding queries see all real keys
    empty_row = ~allowed.any(dim=-1, keepdim=True)  # (B, T, 1)
    if half_window is None:
        return (allowed | empty_row)[:, None]  # (B, 1, T, T)
    idx = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    window = (idx[:, None] - idx[None, :]).abs() <= half_window  # (T, T): |i - j| <= window / 2
    allowed = allowed & window
    empty_row = ~allowed.any(dim=-1, keepdim=True)
    return (allowed | (empty_row & window))[:, None]  # (B, 1, T, T)


@dataclass
class BandMask:
    """Sliding-window attention in blocks, so its cost and memory grow linearly with T (the dense mask of
    `block_mask(..., half_window)` is (T, T)): queries in blocks of `width` = half_window, each block against
    the keys of itself and its two neighbours, which hold every key within the window of all its queries."""

    mask: torch.Tensor
    """(B * nb, 1, w, 3w) bool, True where the query may attend to the key; nb = ceil(T / w)."""
    width: int
    """w, the block size: the half window."""


def band_usable(length: int, half_window: int | None) -> bool:
    """Blocks cost T * 3w scores against the dense T * T: worth it past three blocks. Exporters trace the
    dense mask, which takes any T (the blocked layout fixes nb at trace time)."""
    if half_window is None or half_window < 1 or length <= 3 * half_window:
        return False
    return not (torch.jit.is_tracing() or torch.onnx.is_in_onnx_export() or torch.compiler.is_exporting())


def band_mask(attention_mask: torch.Tensor, half_window: int) -> BandMask:
    """(B, T) sequence index -> the blocked sliding-window mask, allowing exactly what `block_mask(...,
    half_window)` allows, so both give the same outputs at every position, padding included."""
    B, T = attention_mask.shape
    w = half_window
    nb = -(-T // w)
    seq = F.pad(attention_mask.long(), (0, nb * w - T), value=-1)  # (B, nb*w); -1: past the row's end
    q = seq.view(B, nb, w, 1)  # (B, nb, w, 1)
    k = F.pad(seq, (w, w), value=-1).unfold(1, 3 * w, w)[:, :, None, :]  # (B, nb, 1, 3w): blocks b-1, b, b+1
    r = torch.arange(w, device=seq.device)[:, None]  # query offset in its block
    c = torch.arange(3 * w, device=seq.device)[None, :]  # key offset from the previous block's start
    band = (c >= r) & (c <= r + 2 * w)  # (w, 3w): |i - j| = |w + r - c| <= w
    allowed = (k > 0) & ((q == k) | (q == 0)) & band  # (B, nb, w, 3w)
    empty = ~allowed.any(dim=-1, keepdim=True)
    allowed = allowed | (empty & band & (k >= 0))  # block_mask's fallback: every key of the row in the window
    return BandMask(allowed.view(B * nb, 1, w, 3 * w), w)


def banded(q, k, v, band: BandMask, dropout_p: float, fn) -> torch.Tensor:
    """q, k, v (B, T, nh, D) -> (B, T, nh * D): `fn` (sdpa/eager/unfused) on query blocks (B*nb, nh, w, D)
    against their 3-block key windows (B*nb, nh, 3w, D)."""
    B, T, nh, D = q.shape
    w = band.width
    nb = band.mask.shape[0] // B
    tail = nb * w - T

    def windows(x):  # (B, T, nh, D) -> (B*nb, nh, 3w, D)
        blocks = F.pad(x, (0, 0, 0, 0, w, w + tail)).view(B, nb + 2, w, nh, D)
        win = torch.cat((blocks[:, :-2], blocks[:, 1:-1], blocks[:, 2:]), dim=2)  # (B, nb, 3w, nh, D)
        return win.view(B * nb, 3 * w, nh, D).transpose(1, 2)

    qb = F.pad(q, (0, 0, 0, 0, 0, tail)).view(B * nb, w, nh, D).transpose(1, 2)  # (B*nb, nh, w, D)
    ctx = fn(qb, windows(k), windows(v), band.mask, dropout_p)  # (B*nb, nh, w, D)
    return ctx.transpose(1, 2).reshape(B, nb * w, nh * D)[:, :T]


def sliding_mask(attention_mask: torch.Tensor, half_window: int) -> torch.Tensor | BandMask:
    """The local layers' mask: blocked where that is cheaper (`band_usable`), else dense (B, 1, T, T)."""
    if band_usable(attention_mask.shape[1], half_window):
        return band_mask(attention_mask, half_window)
    return block_mask(attention_mask, half_window)


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """positions (..., T) -> cos, sin (..., T, 1, D) fp32, broadcasting over the heads of (..., T, nh, D).
    Computed as Hugging Face's default rope (fp32 inverse frequencies, the angle table concatenated twice)."""
    exponent = torch.arange(0, head_dim, 2, dtype=torch.float, device=positions.device) / head_dim
    inv_freq = 1.0 / (theta**exponent)  # (D/2,)
    freqs = positions[..., None].float() * inv_freq  # (..., T, D/2)
    emb = torch.cat((freqs, freqs), dim=-1)[..., None, :]  # (..., T, 1, D)
    return emb.cos(), emb.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x (..., T, nh, D) in fp32 (as HF), back in x's dtype: x cos + rotate_half(x) sin."""
    x32 = x.float()
    x1, x2 = x32.chunk(2, dim=-1)
    return (x32 * cos + torch.cat((-x2, x1), dim=-1) * sin).to(x.dtype)


@dataclass
class VarlenMeta:
    """Where the real tokens are, for the unpadded (N, H) layout: the varlen kernels' inputs."""

    indices: torch.Tensor | None
    """(N,) flat indices of the real tokens in the (B*T) padded layout; None in the segmented layout, where all
    B*T tokens run (see `segment_bounds`)."""
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


def unpad(x: torch.Tensor, meta: VarlenMeta) -> torch.Tensor:
    """(B*T, ...) -> (N, ...) at the real tokens (the unpadded layout)."""
    assert meta.indices is not None, "the segmented layout keeps every token"
    return x.index_select(0, meta.indices)


def repad(x: torch.Tensor, meta: VarlenMeta) -> torch.Tensor:
    """(N, ...) -> (B*T, ...), zeros at padding: `unpad` undone."""
    assert meta.indices is not None, "the segmented layout keeps every token"
    return x.new_zeros(meta.shape[0] * meta.shape[1], *x.shape[1:]).index_copy(0, meta.indices, x)


def segment_bounds(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) sequence index -> cu_seqlens (B*m + 1,) int32 over all B*T tokens of the batch, flattened: one
    segment per run of equal values in a row, the padding runs included, then empty segments up to a multiple
    of B (m segments per row on average, rounded up).

    The segmented layout gives the varlen kernel fixed shapes: the encoder runs on every token, (B*T, H), with
    no `nonzero` and no host sync, so a compiled step is one graph (and CUDA graphs can replay it). Packed rows
    are nearly full, so the padding computed is small; a padding run attends within itself, and nothing reads
    its outputs. The loader computes this on the host (`data.loader.with_segments`): the number of segments is
    data-dependent, and rounding it up to a multiple of B leaves only a few sizes to compile for."""
    B, T = attention_mask.shape
    starts = torch.ones(B, T, dtype=torch.bool, device=attention_mask.device)
    starts[:, 1:] = attention_mask[:, 1:] != attention_mask[:, :-1]
    first = torch.nonzero(starts.reshape(-1)).flatten()  # (S,) where each segment starts, in the flat layout
    m = -(-first.numel() // B)
    cu = first.new_full((B * m + 1,), B * T, dtype=torch.int32)  # trailing entries: empty segments at the end
    cu[: first.numel()] = first
    return cu


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


def varlen(q, k, v, meta: VarlenMeta, dropout_p: float, half_window: int | None = None) -> torch.Tensor:
    """q, k, v (N, nh, D) unpadded -> (N, nh, D) with a varlen flash kernel (callers check availability).
    `half_window`: keys within that distance only; both kernels' window_size bounds are inclusive."""
    kind, fn = VARLEN_KERNEL
    cu, n = meta.cu_seqlens, meta.max_seqlen
    if kind == "flash_attn":
        window = (-1, -1) if half_window is None else (half_window, half_window)
        return fn(q, k, v, cu, cu, n, n, dropout_p=dropout_p, window_size=window)
    return fn(q, k, v, cu, n, dropout_p, half_window)


def attend(
    qkv: torch.Tensor,
    heads: int,
    mask: torch.Tensor | BandMask | None,
    meta: VarlenMeta | None,
    dropout_p: float,
    impl: str,
    rope: tuple[torch.Tensor, torch.Tensor] | None = None,
    half_window: int | None = None,
) -> torch.Tensor:
    """Self-attention of a fused projection, in the encoder's layout:
    - padded: qkv (B, T, 3H), mask (B, 1, T, T) -> (B, T, H);
    - unpadded, varlen flash (mask None): qkv (N, 3H), meta -> (N, H);
    - unpadded, masked kernel: qkv (N, 3H), meta and mask -> (N, H), attention on the re-padded batch;
    - local layers of long rows: a `BandMask` instead of the (B, 1, T, T) mask, attention in blocks.
    `rope` (cos, sin) must be in the layout attention runs in ((B|1, T, 1, D), or (N, 1, D) for flash);
    `half_window` is used by flash only (the masked kernels carry the window in `mask`)."""
    if meta is not None and mask is not None:
        B, T = meta.shape
        ctx = attend(repad(qkv, meta).view(B, T, -1), heads, mask, None, dropout_p, impl, rope)  # (B, T, H)
        return unpad(ctx.reshape(B * T, -1), meta)  # (N, H)
    lead = qkv.shape[:-1]  # (B, T) or (N,)
    q, k, v = qkv.view(*lead, 3, heads, -1).unbind(-3)  # 3 x (B, T, nh, D) or (N, nh, D)
    if rope is not None:
        q, k = rotate(q, *rope), rotate(k, *rope)
    if meta is not None:
        return varlen(q, k, v, meta, dropout_p, half_window).reshape(lead[0], -1)  # (N, H)
    if mask is None:
        raise ValueError("padded attention needs the (B, 1, T, T) mask (only the flash path runs without one)")
    fn = masked_kernel(impl, dropout_p, q)
    if isinstance(mask, BandMask):
        return banded(q, k, v, mask, dropout_p, fn)  # (B, T, H)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, nh, T, D)
    return fn(q, k, v, mask, dropout_p).transpose(1, 2).reshape(*lead, -1)  # (B, T, H)


def masked_kernel(impl: str, dropout_p: float, x: torch.Tensor):
    """The kernel for a masked (padded-layout) attention call: sdpa, eager, or `unfused` when training with
    attention dropout on CPU (SDPA's math fallback there, written out with the cheaper dropout mask)."""
    if impl == "eager":
        return eager
    if impl == "auto" and dropout_p > 0 and fast_dropout_usable(x):
        return unfused
    return sdpa


def varlen_usable(hidden: torch.Tensor, head_dim: int) -> bool:
    """The varlen flash kernels run on CUDA (sm80 or newer) in fp16/bf16 only, on heads a multiple of 8 wide up
    to 256, with or without attention dropout; elsewhere the encoder keeps the padded SDPA path with the block
    mask."""
    if not flash_heads(head_dim) or not hidden.is_cuda or VARLEN_KERNEL is None:
        return False
    if not flash_capable(hidden.device.index or 0):
        return False
    dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else hidden.dtype
    return dtype in (torch.float16, torch.bfloat16)
