"""Packed rows (DESIGN §3.3): packs of sample indices -> the packed schema, and both schemas -> model inputs.

Packed shard layout (K = max sequences per pack, W = masked-LM width, S = sequence length):

    input_ids               int32 [N, S]   sequences copied whole at running offsets, 0-padded
    segment_ids             int8  [N, S]
    positions               int32 [N, S]   restart at 0 for every sequence (0 on padding)
    input_mask              int8  [N, S]   sequence index 1..k, 0 = padding
    masked_lm_positions     int32 [N, W]   shifted by the sequence offset; 0 = empty slot
    masked_lm_ids           int32 [N, W]
    next_sentence_positions int32 [N, K]   offset of each sequence's [CLS]
    next_sentence_labels    int8  [N, K]
    next_sentence_weights   int8  [N, K]   1 = a real sequence in this slot, 0 = empty

W: DESIGN §3.3 suggests max_pred + K (Google's masking predicts round(0.15 * len) per sequence, and the
rounding of K sequences can exceed the single-row budget by up to K). That bound does not hold for every
masking setting (e.g. a larger masked_lm_prob with a generous max_pred), so W is the larger of max_pred + K
and the largest sum of real predictions over the planned packs, which pass 1 computes exactly: a pack can
never overflow, and all shards of one run share W (static shapes for the loader and torch.compile).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from bertforge.data.packing_algorithms import assign_packs, length_histogram, pack_histogram
from bertforge.data.shardset import PACKED_SCHEMA


# ============================================================================================ rows
def mlm_width(
    max_pred: int, max_per_pack: int, pred_counts: np.ndarray | None = None, packs: np.ndarray | None = None
) -> int:
    """max(max_pred + K, the largest per-pack sum of real predictions): a width that cannot overflow."""
    width = max_pred + max_per_pack
    if pred_counts is not None and packs is not None and len(packs):
        per = np.where(packs >= 0, np.asarray(pred_counts)[np.maximum(packs, 0)], 0).sum(axis=1)
        width = max(width, int(per.max()))
    return int(width)


def sample_lengths(input_mask: np.ndarray) -> np.ndarray:
    """Real tokens per row (the NVIDIA input_mask holds 1 for real tokens, 0-padded)."""
    return (np.asarray(input_mask) != 0).sum(axis=1)


def prediction_counts(masked_lm_positions: np.ndarray) -> np.ndarray:
    """Real predictions per row: nonzero positions (position 0 is always [CLS], so 0 is an empty slot)."""
    return (np.asarray(masked_lm_positions) != 0).sum(axis=1)


_BLOCK_TOKENS = 1 << 17
"""Token slots of packed rows built at a time: the per-slot (rows, S) gathers and int64 index arrays of one
block are ~40 bytes a slot (~5 MB), where building every row at once needed ~4x the whole output shard."""


def build_packed_rows(
    samples: Mapping[str, np.ndarray], packs: np.ndarray, width: int | None = None
) -> dict[str, np.ndarray]:
    """Packed rows (the schema in the module docstring) from unpacked NVIDIA-schema `samples`.

    samples: input_ids (N,S), input_mask (N,S), segment_ids (N,S), masked_lm_positions (N,P),
    masked_lm_ids (N,P), next_sentence_labels (N,); packs: (R, K) row indices into samples, -1 = empty.
    Every sequence is copied whole to a running offset; vectorized over a block of packs, one step per slot.
    """
    src = {k: np.asarray(samples[k]) for k in ("input_ids", "segment_ids", "masked_lm_positions", "masked_lm_ids")}
    N, S = src["input_ids"].shape
    R, K = packs.shape
    src["lengths"] = sample_lengths(samples["input_mask"])
    src["nsp"] = np.asarray(samples["next_sentence_labels"]).reshape(N)
    if width is None:
        width = mlm_width(src["masked_lm_positions"].shape[1], K, prediction_counts(src["masked_lm_positions"]), packs)
    widths = {"masked_lm_positions": width, "masked_lm_ids": width}
    widths |= {k: K for k in ("next_sentence_positions", "next_sentence_labels", "next_sentence_weights")}
    out: dict[str, np.ndarray] = {n: np.zeros((R, widths.get(n, S)), dt) for n, dt in PACKED_SCHEMA.items()}
    step = max(1, _BLOCK_TOKENS // max(1, S))
    for a in range(0, R, step):  # the slices of `out` are views: each block writes its rows in place
        _fill_rows(src, packs[a : a + step], {k: v[a : a + step] for k, v in out.items()})
    return out


def _fill_rows(src: Mapping[str, np.ndarray], packs: np.ndarray, out: dict[str, np.ndarray]) -> None:
    """Write the packed rows of `packs` (B, K) into the zeroed (B, ...) arrays of `out` (build_packed_rows)."""
    R, K = packs.shape
    S = out["input_ids"].shape[1]
    width = out["masked_lm_positions"].shape[1]
    col = np.arange(S)[None, :]  # (1, S)
    offset = np.zeros(R, np.int64)
    pred_pos, pred_ids = [], []
    for k in range(K):
        idx = packs[:, k]
        real = idx >= 0  # (B,)
        i = np.maximum(idx, 0)
        length = np.where(real, src["lengths"][i], 0)  # (B,)
        if (offset + length > S).any():
            raise ValueError("a pack is longer than the row")
        rel = col - offset[:, None]  # (B, S) position within this slot's sequence
        inside = (rel >= 0) & (rel < length[:, None])
        gather = np.clip(rel, 0, S - 1)
        out["input_ids"][inside] = np.take_along_axis(src["input_ids"][i], gather, 1)[inside]
        out["segment_ids"][inside] = np.take_along_axis(src["segment_ids"][i], gather, 1)[inside]
        out["positions"][inside] = rel[inside]
        out["input_mask"][inside] = k + 1
        out["next_sentence_positions"][:, k] = np.where(real, offset, 0)
        out["next_sentence_labels"][:, k] = np.where(real, src["nsp"][i], 0)
        out["next_sentence_weights"][:, k] = real
        p = src["masked_lm_positions"][i]  # (B, P)
        valid = (p != 0) & real[:, None]
        pred_pos.append(np.where(valid, p + offset[:, None], 0))
        pred_ids.append(np.where(valid, src["masked_lm_ids"][i], 0))
        offset = offset + length
    pos = np.concatenate(pred_pos, axis=1)  # (B, K*P): slot k's predictions after slot k-1's
    lab = np.concatenate(pred_ids, axis=1)
    # compact the real predictions to the front of each row; positions stay increasing (offsets increase)
    order = np.argsort(pos == 0, axis=1, kind="stable")
    pos = np.take_along_axis(pos, order, 1)
    lab = np.take_along_axis(lab, order, 1)
    if (pos[:, width:] != 0).any():
        raise ValueError(f"a pack holds more than {width} predictions")
    n = min(width, pos.shape[1])
    out["masked_lm_positions"][:, :n] = pos[:, :n]
    out["masked_lm_ids"][:, :n] = lab[:, :n]


def pack_samples(
    samples: Mapping[str, np.ndarray],
    max_per_pack: int = 3,
    algorithm: str = "lpfhp",
    rng: np.random.Generator | None = None,
    width: int | None = None,
) -> dict[str, np.ndarray]:
    """Pack a window of unpacked, already-masked samples on the fly (the loader's path for dynamic-masking
    shards): the same histogram algorithms over the window, then `build_packed_rows`. Returns packed rows
    (fewer than the samples); `width` fixes the masked-LM width (default max_pred + K, wider if needed)."""
    rng = rng if rng is not None else np.random.default_rng(0)
    S = np.asarray(samples["input_ids"]).shape[1]
    lengths = sample_lengths(samples["input_mask"])
    strategy = pack_histogram(length_histogram(lengths, S), S, max_per_pack, algorithm)
    packs = assign_packs(lengths, strategy, rng)
    P = np.asarray(samples["masked_lm_positions"]).shape[1]
    need = mlm_width(P, max_per_pack, prediction_counts(samples["masked_lm_positions"]), packs)
    if width is not None and need > width:
        raise ValueError(f"packed predictions need a width of {need}, more than width={width}")
    return build_packed_rows(samples, packs, width if width is not None else need)


PACKED_INPUTS = {
    "input_ids": "input_ids",
    "attention_mask": "input_mask",  # sequence index 1..k, 0 = padding: block-diagonal attention
    "token_type_ids": "segment_ids",
    "position_ids": "positions",
    "masked_positions": "masked_lm_positions",
    "masked_labels": "masked_lm_ids",
    "nsp_positions": "next_sentence_positions",
}
"""The model's forward argument -> the packed schema's field (DESIGN §3.3); `nsp_labels` is made from two fields.
The loader (numpy, in its workers) and `packed_model_inputs` (torch) both read it."""


def packed_model_inputs(batch: Mapping[str, Any]) -> dict[str, Any]:
    """A packed batch (numpy or torch arrays, packed schema names) -> the model's keyword arguments.

    Empty NSP slots (weight 0) get label -1, which the model ignores; empty masked-LM slots are position 0.
    """
    import torch

    def t(x) -> torch.Tensor:
        return x.long() if isinstance(x, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(x).astype(np.int64))

    weights = t(batch["next_sentence_weights"])
    out = {ours: t(batch[field]) for ours, field in PACKED_INPUTS.items()}
    out["nsp_labels"] = torch.where(weights > 0, t(batch["next_sentence_labels"]), torch.full_like(weights, -1))
    return out


def unpacked_model_inputs(batch: Mapping[str, Any]) -> dict[str, Any]:
    """An NVIDIA-schema batch -> the model's keyword arguments (the reference the packed path must equal)."""
    import torch

    def t(x) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(x).astype(np.int64))

    return {
        "input_ids": t(batch["input_ids"]),
        "attention_mask": t(batch["input_mask"]),
        "token_type_ids": t(batch["segment_ids"]),
        "masked_positions": t(batch["masked_lm_positions"]),
        "masked_labels": t(batch["masked_lm_ids"]),
        "nsp_labels": t(batch["next_sentence_labels"]),
    }
