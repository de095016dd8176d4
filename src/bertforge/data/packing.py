"""Sequence packing (DESIGN §3.3): histogram packing algorithms, the packed shard writer and its metadata.

Pre-training rows are mostly padding at long sequence lengths (on Wikipedia at seq 512 about half of all
tokens). Packing puts up to K whole sequences into one row so that the model computes on real tokens; the
model keeps them apart with a block-diagonal attention mask (`attention_mask` = sequence index 1..k),
positions restarting at 0 per sequence, one NSP prediction per sequence read at its [CLS], and the masked-LM
positions shifted by each sequence's offset in the row.

**Algorithms** (Krell et al. 2021, "Efficient sequence packing without cross-contamination", arXiv 2107.02027).
They work on the histogram of sequence lengths only, never on the samples, so their cost does not depend on
the number of sequences: a *strategy* is a multiset of length-combinations with repeat counts
(e.g. ``(300, 200) x 1234``), and concrete sample indices are dealt to the packs afterwards, bucket by length.

- ``spfhp`` shortest-pack-first: lengths longest first; each group of same-length sequences goes into the
  open pack group with the MOST space left that fits (worst fit), splitting groups as needed.
- ``lpfhp`` longest-pack-first: the same walk, but into the open group with the LEAST space left that fits
  (best fit), and a short length may go into one pack several times at once ("distribute" in Graphcore's
  reference), which fills the tail of short sequences better.
- ``nnlshp`` non-negative least squares: choose repeat counts x >= 0 of every combination of up to K present
  lengths that fills a row exactly, minimising ||w * (A x - h)|| with `scipy.optimize.nnls` (A[l, j] = how
  often length l occurs in combination j); the solution is floored, trimmed to what the histogram holds, and
  the sequences it leaves over are packed with ``lpfhp``. Much slower (a dense least-squares problem with
  ~S²/12 columns at K = 3); it is offered because the paper does, and for small S or few distinct lengths.

The data structure of SPFHP/LPFHP is Graphcore's: open pack groups keyed by the space they have left, each a
list of (count, combination); a group is closed when it is full or holds K sequences. We keep the keys in a
sorted list so finding the best or worst fit is one bisect instead of a scan over all offsets.

**Shards.** `pack_shards` makes two passes and never holds the dataset in memory (the existing packers load
everything and run out of RAM on Wikipedia): pass 1 reads only `input_mask` (the lengths) and the count of
real predictions of each row, in chunks; the plan (which samples go into which pack, which pack into which
output shard) is computed from these. Pass 2a streams every input shard once, in chunks, and appends each row
to the bucket file of the output shard that needs it (a bounded in-memory buffer in between); pass 2b turns
each bucket into one packed shard. Packs are shuffled (a seeded permutation), so every output shard mixes
sequences of all input shards. Outputs are written atomically and a re-run skips finished output shards.

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

import bisect
import dataclasses
import hashlib
import json
import os
import shutil
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import h5py
import numpy as np

from bertforge.errors import UserError
from bertforge.runtime.io import write_text

METADATA = "packing.json"
"""Name of the metadata file beside the packed shards (the pretrain loader reads it)."""
WORK_DIR = ".pack_work"
PACKED_SCHEMA: dict[str, type] = {
    "input_ids": np.int32,
    "segment_ids": np.int8,
    "positions": np.int32,
    "input_mask": np.int8,
    "masked_lm_positions": np.int32,
    "masked_lm_ids": np.int32,
    "next_sentence_positions": np.int32,
    "next_sentence_labels": np.int8,
    "next_sentence_weights": np.int8,
}


# ============================================================================================ strategy
@dataclass
class Strategy:
    """A packing strategy: `counts[j]` packs hold the sequence lengths `combos[j]` (longest first)."""

    combos: list[tuple[int, ...]]
    """Length combinations, each sorted longest first, sum <= max_len, at most max_per_pack entries."""
    counts: np.ndarray
    """(J,) int64 repeat count of each combination."""
    max_len: int
    """Row length S."""
    max_per_pack: int
    """K, the most sequences in one pack."""

    @property
    def packs(self) -> int:
        return int(self.counts.sum())

    @property
    def sequences(self) -> int:
        return int(sum(len(c) * int(n) for c, n in zip(self.combos, self.counts)))

    @property
    def tokens(self) -> int:
        return int(sum(sum(c) * int(n) for c, n in zip(self.combos, self.counts)))

    @property
    def efficiency(self) -> float:
        """Real tokens / token slots of the packed rows."""
        return self.tokens / max(1, self.packs * self.max_len)

    def histogram(self) -> np.ndarray:
        """(S+1,) how many sequences of each length the strategy packs."""
        h = np.zeros(self.max_len + 1, np.int64)
        for c, n in zip(self.combos, self.counts):
            for length in c:
                h[length] += n
        return h

    def check(self, histogram: np.ndarray) -> None:
        """Raise AssertionError unless the strategy packs exactly `histogram` within the length and K."""
        for c, n in zip(self.combos, self.counts):
            assert n > 0, f"empty group {c}"
            assert 1 <= len(c) <= self.max_per_pack, f"pack {c} has more than {self.max_per_pack} sequences"
            assert sum(c) <= self.max_len, f"pack {c} is longer than {self.max_len}"
        want = np.zeros(self.max_len + 1, np.int64)
        want[: len(histogram)] = histogram
        assert np.array_equal(self.histogram(), want), "strategy does not pack every sequence exactly once"


def length_histogram(lengths: np.ndarray, max_len: int) -> np.ndarray:
    """(S+1,) int64 count of each length 0..S; lengths outside 1..S are an error."""
    lengths = np.asarray(lengths)
    if lengths.size and (lengths.min() < 1 or lengths.max() > max_len):
        raise UserError(f"sequence lengths must lie in 1..{max_len}; found {lengths.min()}..{lengths.max()}")
    return np.bincount(lengths.astype(np.int64, copy=False), minlength=max_len + 1).astype(np.int64)


class _OpenGroups:
    """Pack groups that can take more sequences, keyed by the space they have left (sorted keys)."""

    def __init__(self, max_len: int, max_per_pack: int):
        self.max_len, self.k = max_len, max_per_pack
        self.groups: dict[int, list[tuple[int, tuple[int, ...]]]] = defaultdict(list)
        self.keys: list[int] = []  # sorted remaining-space keys with at least one group
        self.closed: list[tuple[int, tuple[int, ...]]] = []

    def add(self, combo: tuple[int, ...], count: int) -> None:
        if count <= 0:
            return
        space = self.max_len - sum(combo)
        if space == 0 or len(combo) == self.k:
            self.closed.append((count, combo))
            return
        if not self.groups[space]:
            bisect.insort(self.keys, space)
        self.groups[space].append((count, combo))

    def pop(self, space: int) -> tuple[int, tuple[int, ...]]:
        """Take the last group added with this much space left (Graphcore's LIFO)."""
        group = self.groups[space].pop()
        if not self.groups[space]:
            del self.groups[space]
            self.keys.pop(bisect.bisect_left(self.keys, space))
        return group

    def strategy(self) -> Strategy:
        merged: dict[tuple[int, ...], int] = defaultdict(int)
        for count, combo in self.closed + [g for gs in self.groups.values() for g in gs]:
            merged[tuple(sorted(combo, reverse=True))] += count
        combos = sorted(merged, key=lambda c: (-sum(c), c))
        return Strategy(combos, np.array([merged[c] for c in combos], np.int64), self.max_len, self.k)


def _walk(histogram: np.ndarray, max_len: int, max_per_pack: int, best_fit: bool, distribute: bool) -> Strategy:
    """The shared walk of SPFHP (worst fit, no distribute) and LPFHP (best fit, distribute)."""
    if max_per_pack < 1:
        raise UserError(f"--max-per-pack must be at least 1, not {max_per_pack}")
    h = np.asarray(histogram, np.int64)
    if len(h) > max_len + 1 and h[max_len + 1:].any():
        raise UserError(f"the histogram holds sequences longer than {max_len}")
    groups = _OpenGroups(max_len, max_per_pack)
    for length in range(min(len(h) - 1, max_len), 0, -1):  # longest first
        n = int(h[length])
        while n > 0:
            keys = groups.keys
            if best_fit:
                i = bisect.bisect_left(keys, length)
                space = keys[i] if i < len(keys) else None
            else:
                space = keys[-1] if keys and keys[-1] >= length else None
            if space is not None:
                count, combo = groups.pop(space)
                repeat = 1
                if distribute:  # as many copies as fit in the space, in K, and in what is left to place
                    repeat = max(1, min(space // length, max_per_pack - len(combo), n))
                take = min(count, n // repeat)
                groups.add(combo, count - take)  # the part of the group that stays as it was
                groups.add(combo + (length,) * repeat, take)
                n -= take * repeat
            else:  # fits nowhere: open new packs
                repeat = max(1, min(max_len // length, max_per_pack, n)) if distribute else 1
                take = n // repeat
                groups.add((length,) * repeat, take)
                n -= take * repeat
    return groups.strategy()


def spfhp(histogram: np.ndarray, max_len: int, max_per_pack: int = 3) -> Strategy:
    """Shortest-pack-first histogram packing (Krell et al. 2021, Alg. 1)."""
    return _walk(histogram, max_len, max_per_pack, best_fit=False, distribute=False)


def lpfhp(histogram: np.ndarray, max_len: int, max_per_pack: int = 3) -> Strategy:
    """Longest-pack-first histogram packing (best fit with distribution; Graphcore's `pack_using_lpfhp`)."""
    return _walk(histogram, max_len, max_per_pack, best_fit=True, distribute=True)


def _exact_combos(present: np.ndarray, max_len: int, k: int) -> list[tuple[int, ...]]:
    """All combinations (longest first) of up to k present lengths whose sum is exactly max_len."""
    is_present = np.zeros(max_len + 1, bool)
    is_present[present] = True
    out: list[tuple[int, ...]] = []

    def extend(prefix: tuple[int, ...], rest: int, depth: int) -> None:
        last = prefix[-1] if prefix else max_len
        if depth == 1:  # the final length is determined: vectorless check
            if 1 <= rest <= last and is_present[rest]:
                out.append(prefix + (rest,))
            return
        if rest <= last and is_present[rest]:
            out.append(prefix + (rest,))  # fewer than k sequences also fill the row exactly
        cands = present[(present <= min(last, rest - 1))]
        for length in cands[::-1]:
            extend(prefix + (int(length),), rest - int(length), depth - 1)

    extend((), max_len, k)
    return out


def nnlshp(histogram: np.ndarray, max_len: int, max_per_pack: int = 3, max_columns: int = 60000) -> Strategy:
    """Non-negative least squares histogram packing (Krell et al. 2021, §4.2), leftovers by LPFHP."""
    from scipy.optimize import nnls

    h = np.zeros(max_len + 1, np.int64)
    h[: min(len(histogram), max_len + 1)] = np.asarray(histogram, np.int64)[: max_len + 1]
    present = np.nonzero(h[1:])[0] + 1
    combos = _exact_combos(present, max_len, max_per_pack)
    if len(combos) > max_columns:
        raise UserError(f"nnlshp would solve a least-squares problem with {len(combos)} columns (over "
                        f"{max_columns}); use --algorithm lpfhp or spfhp, or a smaller --max-per-pack")
    counts = np.zeros(len(combos), np.int64)
    if combos:
        rows = present - 1
        A = np.zeros((len(present), len(combos)))  # (L, J): how often each present length occurs in combo j
        where = {int(length): i for i, length in enumerate(present)}
        for j, c in enumerate(combos):
            for length in c:
                A[where[length], j] += 1
        # Graphcore weights the very short lengths down: they are cheap to leave over and pad
        w = np.where(rows < 8, 0.09, 1.0)
        x, _ = nnls(A * w[:, None], h[present] * w, maxiter=50 * A.shape[1])
        counts = np.floor(x).astype(np.int64)
        # trim to what the histogram holds (least squares may over-use a length), biggest counts first
        left = h.copy()
        for j in np.argsort(-counts, kind="stable"):
            c = counts[j]
            if c == 0:
                continue
            need = np.bincount(np.array(combos[j]), minlength=max_len + 1)
            used = need > 0
            c = min(c, int((left[used] // need[used]).min()))
            counts[j] = c
            left -= c * need
    else:
        left = h.copy()
    rest = lpfhp(left, max_len, max_per_pack)
    merged: dict[tuple[int, ...], int] = defaultdict(int)
    for c, n in list(zip(combos, counts)) + list(zip(rest.combos, rest.counts)):
        if n:
            merged[tuple(c)] += int(n)
    out = sorted(merged, key=lambda c: (-sum(c), c))
    return Strategy(out, np.array([merged[c] for c in out], np.int64), max_len, max_per_pack)


ALGORITHMS: dict[str, Callable[[np.ndarray, int, int], Strategy]] = {"spfhp": spfhp, "lpfhp": lpfhp, "nnlshp": nnlshp}
"""Packing algorithms by name (the `--algorithm` choices)."""


def pack_histogram(histogram: np.ndarray, max_len: int, max_per_pack: int = 3, algorithm: str = "lpfhp") -> Strategy:
    if algorithm not in ALGORITHMS:
        raise UserError(f"unknown packing algorithm {algorithm!r}; choose one of {', '.join(ALGORITHMS)}")
    return ALGORITHMS[algorithm](histogram, max_len, max_per_pack)


# ============================================================================================ assignment
def assign_packs(lengths: np.ndarray, strategy: Strategy, rng: np.random.Generator) -> np.ndarray:
    """Deal sample indices to the strategy's packs: (P, K) indices into `lengths`, -1 = empty slot.

    Samples of one length are taken in a random order (a seeded permutation, then a stable sort by length:
    numpy sorts 8/16-bit keys with a radix sort), and the packs are shuffled, so neighbouring packs do not
    come from neighbouring samples. Within a pack the sequences are ordered longest first.
    """
    lengths = np.asarray(lengths)
    n = len(lengths)
    key = lengths.astype(np.int16 if strategy.max_len < 2**15 else np.int32, copy=False)
    idx_dtype = np.int32 if n < 2**31 else np.int64
    perm = rng.permutation(n).astype(idx_dtype, copy=False)
    order = perm[np.argsort(key[perm], kind="stable")]  # sample indices grouped by length, random within
    cursor = np.zeros(strategy.max_len + 2, np.int64)
    cursor[1:] = np.cumsum(np.bincount(key, minlength=strategy.max_len + 1))
    packs = np.full((strategy.packs, strategy.max_per_pack), -1, idx_dtype)
    row = 0
    for combo, count in zip(strategy.combos, strategy.counts):
        count = int(count)
        for slot, length in enumerate(combo):
            start = cursor[length]
            if start + count > cursor[length + 1]:
                raise ValueError(f"strategy needs more sequences of length {length} than there are")
            packs[row:row + count, slot] = order[start:start + count]
            cursor[length] = start + count
        row += count
    # shuffle the packs: gather whole rows as opaque K*4-byte items (3-4x faster than 2-D fancy indexing)
    rows = packs.view(np.dtype((np.void, packs.dtype.itemsize * packs.shape[1]))).reshape(-1)
    return rows[rng.permutation(len(packs))].view(idx_dtype).reshape(packs.shape)


def plan_stats(lengths: np.ndarray, packs: np.ndarray, max_len: int) -> dict[str, float]:
    """Counts, padding before/after, efficiency and the theoretical speed-up (rows before / rows after)."""
    n, p = int(len(lengths)), int(len(packs))
    tokens = int(np.asarray(lengths, np.int64).sum())
    return {
        "sequences": n,
        "packs": p,
        "tokens": tokens,
        "avg_seq_per_sample": n / max(1, p),
        "padding_fraction_before": 1 - tokens / max(1, n * max_len),
        "padding_fraction_after": 1 - tokens / max(1, p * max_len),
        "packing_efficiency": tokens / max(1, p * max_len),
        # the model computes on rows: the same sequences in fewer rows (DESIGN §3.3)
        "theoretical_speedup": n / max(1, p),
    }


# ============================================================================================ rows
def mlm_width(max_pred: int, max_per_pack: int, pred_counts: np.ndarray | None = None,
              packs: np.ndarray | None = None) -> int:
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


def build_packed_rows(samples: Mapping[str, np.ndarray], packs: np.ndarray, width: int | None = None) -> dict[str, np.ndarray]:
    """Packed rows (the schema in the module docstring) from unpacked NVIDIA-schema `samples`.

    samples: input_ids (N,S), input_mask (N,S), segment_ids (N,S), masked_lm_positions (N,P),
    masked_lm_ids (N,P), next_sentence_labels (N,); packs: (R, K) row indices into samples, -1 = empty.
    Every sequence is copied whole to a running offset; vectorized over packs, one step per slot.
    """
    ids = np.asarray(samples["input_ids"])
    N, S = ids.shape
    R, K = packs.shape
    lengths = sample_lengths(samples["input_mask"])
    mpos = np.asarray(samples["masked_lm_positions"])
    mids = np.asarray(samples["masked_lm_ids"])
    seg = np.asarray(samples["segment_ids"])
    nsp = np.asarray(samples["next_sentence_labels"]).reshape(N)
    if width is None:
        width = mlm_width(mpos.shape[1], K, prediction_counts(mpos), packs)
    out = {
        "input_ids": np.zeros((R, S), np.int32),
        "segment_ids": np.zeros((R, S), np.int8),
        "positions": np.zeros((R, S), np.int32),
        "input_mask": np.zeros((R, S), np.int8),
        "next_sentence_positions": np.zeros((R, K), np.int32),
        "next_sentence_labels": np.zeros((R, K), np.int8),
        "next_sentence_weights": np.zeros((R, K), np.int8),
    }
    col = np.arange(S)[None, :]  # (1, S)
    offset = np.zeros(R, np.int64)
    pred_pos, pred_ids = [], []
    for k in range(K):
        idx = packs[:, k]
        real = idx >= 0  # (R,)
        src = np.maximum(idx, 0)
        length = np.where(real, lengths[src], 0)  # (R,)
        if (offset + length > S).any():
            raise ValueError("a pack is longer than the row")
        rel = col - offset[:, None]  # (R, S) position within this slot's sequence
        inside = (rel >= 0) & (rel < length[:, None])
        gather = np.clip(rel, 0, S - 1)
        out["input_ids"][inside] = np.take_along_axis(ids[src], gather, 1)[inside]
        out["segment_ids"][inside] = np.take_along_axis(seg[src], gather, 1)[inside]
        out["positions"][inside] = rel[inside]
        out["input_mask"][inside] = k + 1
        out["next_sentence_positions"][:, k] = np.where(real, offset, 0)
        out["next_sentence_labels"][:, k] = np.where(real, nsp[src], 0)
        out["next_sentence_weights"][:, k] = real
        p = mpos[src]  # (R, P)
        valid = (p != 0) & real[:, None]
        pred_pos.append(np.where(valid, p + offset[:, None], 0))
        pred_ids.append(np.where(valid, mids[src], 0))
        offset = offset + length
    pos = np.concatenate(pred_pos, axis=1)  # (R, K*P): slot k's predictions after slot k-1's
    lab = np.concatenate(pred_ids, axis=1)
    # compact the real predictions to the front of each row; positions stay increasing (offsets increase)
    order = np.argsort(pos == 0, axis=1, kind="stable")
    pos = np.take_along_axis(pos, order, 1)
    lab = np.take_along_axis(lab, order, 1)
    if (pos[:, width:] != 0).any():
        raise ValueError(f"a pack holds more than {width} predictions")
    out["masked_lm_positions"] = np.zeros((R, width), np.int32)
    out["masked_lm_ids"] = np.zeros((R, width), np.int32)
    n = min(width, pos.shape[1])
    out["masked_lm_positions"][:, :n] = pos[:, :n]
    out["masked_lm_ids"][:, :n] = lab[:, :n]
    return {name: out[name] for name in PACKED_SCHEMA}


def pack_samples(samples: Mapping[str, np.ndarray], max_per_pack: int = 3, algorithm: str = "lpfhp",
                 rng: np.random.Generator | None = None, width: int | None = None) -> dict[str, np.ndarray]:
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


def packed_model_inputs(batch: Mapping[str, Any]) -> dict[str, Any]:
    """A packed batch (numpy or torch arrays, packed schema names) -> the model's keyword arguments.

    Empty NSP slots (weight 0) get label -1, which the model ignores; empty masked-LM slots are position 0.
    """
    import torch

    def t(x) -> torch.Tensor:
        return x.long() if isinstance(x, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(x).astype(np.int64))

    weights = t(batch["next_sentence_weights"])
    return {
        "input_ids": t(batch["input_ids"]),
        "attention_mask": t(batch["input_mask"]),  # sequence index 1..k, 0 = padding: block-diagonal attention
        "token_type_ids": t(batch["segment_ids"]),
        "position_ids": t(batch["positions"]),
        "masked_positions": t(batch["masked_lm_positions"]),
        "masked_labels": t(batch["masked_lm_ids"]),
        "nsp_positions": t(batch["next_sentence_positions"]),
        "nsp_labels": torch.where(weights > 0, t(batch["next_sentence_labels"]), torch.full_like(weights, -1)),
    }


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


# ============================================================================================ shards
@dataclass
class PackConfig:
    """Parameters of one `bertforge pack` run."""

    input_dir: str
    """Directory of NVIDIA-format shards (masked at creation)."""
    output_dir: str
    """Where the packed shards and packing.json go."""
    algorithm: str = "lpfhp"
    """spfhp | lpfhp | nnlshp."""
    max_per_pack: int = 3
    """K: at most this many sequences in one packed row."""
    seed: int = 12345
    """Seed of the sample-to-pack assignment and the pack shuffle."""
    shards: int | None = None
    """Number of output shards (default: as many as input shards)."""
    chunk_rows: int = 4096
    """Rows read from an input shard at a time (bounds memory in both passes)."""
    buffer_mb: int = 256
    """Rows buffered in memory before they are appended to the output-shard bucket files."""


def _plan_id(cfg: PackConfig, files: Sequence[Path], rows: Sequence[int]) -> str:
    key = json.dumps({"algorithm": cfg.algorithm, "k": cfg.max_per_pack, "seed": cfg.seed, "shards": cfg.shards,
                      "inputs": [[p.name, r, p.stat().st_size] for p, r in zip(files, rows)]}, sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def read_lengths(files: Sequence[Path], chunk_rows: int = 4096) -> tuple[np.ndarray, np.ndarray, list[int], int, int]:
    """Pass 1: (lengths (N,), prediction counts (N,), rows per shard, seq_len, max_pred) reading only
    input_mask and masked_lm_positions, in chunks."""
    lengths, preds, rows = [], [], []
    seq_len = max_pred = None
    for path in files:
        try:
            with h5py.File(path, "r") as f:
                if "next_sentence_positions" in f:
                    raise UserError(f"{path} is already packed; pass the unpacked shards to --in")
                if "masked_lm_positions" not in f:
                    raise UserError(f"{path} is a dynamic-masking shard (no masked_lm_positions): it is packed on "
                                    "the fly by the pretrain loader; `bertforge pack` needs masked shards")
                mask, mpos = f["input_mask"], f["masked_lm_positions"]
                n, s = mask.shape
                if mpos.shape[0] != n:
                    raise UserError(f"shard {path} is inconsistent: {mpos.shape[0]} masked_lm rows, {n} input rows; "
                                    "re-create it")
                if seq_len is not None and (s, mpos.shape[1]) != (seq_len, max_pred):
                    raise UserError(f"shard {path} has seq_len/max_pred {s}/{mpos.shape[1]}, the others "
                                    f"{seq_len}/{max_pred}; pack shards of one kind at a time")
                seq_len, max_pred = s, mpos.shape[1]
                for a in range(0, n, chunk_rows):
                    lengths.append(sample_lengths(mask[a:a + chunk_rows]).astype(np.int16 if s < 2**15 else np.int32))
                    preds.append(prediction_counts(mpos[a:a + chunk_rows]).astype(np.int16))
                rows.append(int(n))
        except OSError as e:
            raise UserError(f"shard {path} cannot be read ({e}); re-create it or delete the file") from None
    if seq_len is None or not lengths:
        raise UserError(f"the input shards ({files[0].parent if files else '-'}) hold no rows; nothing to pack")
    return np.concatenate(lengths), np.concatenate(preds), rows, int(seq_len), int(max_pred)


def _shard_bounds(packs: int, shards: int) -> np.ndarray:
    return np.linspace(0, packs, shards + 1).round().astype(np.int64)


def _out_name(i: int) -> str:
    return f"packed_{i:05d}.hdf5"


_MANIFEST_KEYS = ("vocab", "vocab_file", "vocab_sha256", "vocab_size", "mask_id", "special_ids", "masked_lm_prob",
                  "wwm", "split")
_CARRY = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids", "next_sentence_labels")


def _append_bucket(path: Path, rows: dict[str, list[np.ndarray]]) -> None:
    with h5py.File(path, "a") as f:
        for name, parts in rows.items():
            arr = np.concatenate(parts)
            if name not in f:
                f.create_dataset(name, data=arr, maxshape=(None,) + arr.shape[1:], chunks=True, compression="lzf")
            else:
                d = f[name]
                d.resize(d.shape[0] + len(arr), axis=0)
                d[-len(arr):] = arr


def pack_shards(cfg: PackConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Pack the shards of cfg.input_dir into cfg.output_dir; returns the metadata (also in packing.json)."""
    from bertforge.data.shards import list_shards, read_manifest, write_shard

    t0 = time.perf_counter()
    if cfg.algorithm not in ALGORITHMS:
        raise UserError(f"unknown packing algorithm {cfg.algorithm!r}; choose one of {', '.join(ALGORITHMS)}")
    if cfg.max_per_pack < 1:
        raise UserError(f"--max-per-pack must be at least 1, not {cfg.max_per_pack}")
    files = list_shards(cfg.input_dir)
    if not files:
        raise UserError(f"no .hdf5 shards in {cfg.input_dir}; create them with `bertforge data shards`")
    out = Path(cfg.output_dir)
    if out.resolve() == Path(cfg.input_dir).resolve():
        raise UserError("--out must differ from --in")
    out.mkdir(parents=True, exist_ok=True)

    # ---- pass 1: lengths only
    lengths, preds, rows, S, max_pred = read_lengths(files, cfg.chunk_rows)
    n_out = cfg.shards or len(files)
    plan_id = _plan_id(dataclasses.replace(cfg, shards=n_out), files, rows)
    meta_path = out / METADATA
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if meta.get("plan_id") != plan_id:
            raise UserError(f"{out} holds packed shards of a different run (inputs or settings changed); delete it "
                        "or choose another --out")
        if all((out / n).is_file() for n in meta.get("shards", [])):
            log(f"pack: {out} is complete (same inputs and settings); nothing to do")
            return meta
    work = out / WORK_DIR
    plan_file = work / "plan.json"
    same_plan = plan_file.is_file() and json.loads(plan_file.read_text()).get("plan_id") == plan_id
    if not same_plan and not meta_path.is_file() and any(out.glob("packed_*.hdf5")):
        raise UserError(f"{out} holds packed shards of an unfinished run with other inputs or settings; delete "
                        "it or choose another --out")
    if not same_plan and work.exists():
        shutil.rmtree(work)  # buckets of another plan are of no use
    work.mkdir(exist_ok=True)
    (work / "plan.json").write_text(json.dumps({"plan_id": plan_id}))

    hist = length_histogram(lengths, S)
    t_alg = time.perf_counter()
    strategy = pack_histogram(hist, S, cfg.max_per_pack, cfg.algorithm)
    t_alg = time.perf_counter() - t_alg
    packs = assign_packs(lengths, strategy, np.random.default_rng(cfg.seed))
    width = mlm_width(max_pred, cfg.max_per_pack, preds, packs)
    stats = plan_stats(lengths, packs, S)
    log(f"pack: {stats['sequences']} sequences -> {stats['packs']} packs ({cfg.algorithm}, K={cfg.max_per_pack}, "
        f"efficiency {stats['packing_efficiency']:.2%}, strategy in {t_alg:.3f}s)")
    del preds
    bounds = _shard_bounds(len(packs), n_out)
    names = [_out_name(i) for i in range(n_out)]
    todo = [i for i in range(n_out) if not (out / names[i]).is_file()]
    dest = np.full(len(lengths), -1, np.int32)  # output shard of every sample (-1: its shard is finished)
    for i in todo:
        sel = packs[bounds[i]:bounds[i + 1]]
        dest[sel[sel >= 0]] = i

    # ---- pass 2a: stream the inputs once, bucket rows by output shard
    done_marker = work / "buckets.done"
    if todo and not done_marker.is_file():
        for p in work.glob("bucket_*.h5"):
            p.unlink()
        buf: dict[int, dict[str, list[np.ndarray]]] = defaultdict(lambda: defaultdict(list))
        buffered, limit, start = 0, cfg.buffer_mb << 20, 0

        def flush() -> None:
            for i, parts in buf.items():
                _append_bucket(work / f"bucket_{i:05d}.h5", parts)
            buf.clear()

        for path, n in zip(files, rows):
            with h5py.File(path, "r") as f:
                for a in range(0, n, cfg.chunk_rows):
                    b = min(n, a + cfg.chunk_rows)
                    d = dest[start + a:start + b]
                    if (d < 0).all():
                        continue
                    chunk = {k: f[k][a:b] for k in _CARRY}
                    chunk["gid"] = np.arange(start + a, start + b, dtype=np.int64)
                    order = np.argsort(d, kind="stable")
                    ds = d[order]
                    cuts = np.flatnonzero(np.diff(ds)) + 1
                    for part in np.split(order, cuts):
                        i = int(d[part[0]])
                        if i < 0:
                            continue
                        for k, v in chunk.items():
                            buf[i][k].append(v[part])
                            buffered += v[part].nbytes
                    if buffered > limit:
                        flush()
                        buffered = 0
            start += n
        flush()
        done_marker.write_text("ok")

    # ---- pass 2b: one bucket -> one packed shard
    attrs = {"bertforge_kind": "packed", "algorithm": cfg.algorithm, "max_per_pack": cfg.max_per_pack,
             "seq_len": S, "max_pred": max_pred, "mlm_width": width}
    for i in todo:
        sel = packs[bounds[i]:bounds[i + 1]]
        bucket = work / f"bucket_{i:05d}.h5"
        if len(sel) == 0:
            samples = {k: np.zeros((0,) + ((S,) if k in ("input_ids", "input_mask", "segment_ids") else
                                           (max_pred,) if k.startswith("masked") else ()), np.int32) for k in _CARRY}
            local = sel
        else:
            with h5py.File(bucket, "r") as f:
                samples = {k: f[k][()] for k in _CARRY}
                gid = f["gid"][()]
            order = np.argsort(gid)
            samples = {k: v[order] for k, v in samples.items()}
            gid = gid[order]
            local = np.where(sel >= 0, np.searchsorted(gid, np.maximum(sel, 0)), -1)
            if not np.array_equal(gid[local[sel >= 0]], sel[sel >= 0]):
                raise UserError(f"bucket {bucket} is incomplete; delete {work} and re-run")
        rows_out = build_packed_rows(samples, local, width)
        write_shard(out / names[i], rows_out, attrs=attrs)
        bucket.unlink(missing_ok=True)
        log(f"pack: wrote {names[i]} ({len(sel)} packs)")

    # what the trainer needs from the input's manifest (vocab, masking), so the packed directory stands alone
    source = read_manifest(cfg.input_dir) or {}
    meta = {
        **{k: source[k] for k in _MANIFEST_KEYS if k in source},
        "algorithm": cfg.algorithm, "max_per_pack": cfg.max_per_pack, "k_max": cfg.max_per_pack,
        "seq_len": S, "max_pred": max_pred, "mlm_width": width, "seed": cfg.seed,
        **stats, "strategy_seconds": t_alg, "distinct_packs": len(strategy.combos),
        "input_dir": str(Path(cfg.input_dir).resolve()), "input_shards": [p.name for p in files],
        "shards": names, "plan_id": plan_id,
    }
    write_text(meta_path, json.dumps(meta, indent=2) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    log(f"pack: done in {time.perf_counter() - t0:.1f}s; {meta_path}")
    return meta

