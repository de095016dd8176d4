"""Masked-LM masking (Google BERT `create_masked_lm_predictions`), vectorized over rows, pure and seeded.

Rules (DESIGN §3.1): candidates are every real position except the special tokens ([CLS]/[SEP]; [PAD] too,
so padded rows are safe); with whole-word masking a piece that continues a word joins the previous
candidate group, exactly as Google's `do_whole_word_mask` (which also lets a "##" piece right after the middle
[SEP] join the last word of A). Candidates are shuffled and taken in order, skipping a group that would
exceed `num_to_predict = min(max_pred, max(1, round(len * masked_lm_prob)))` where len counts [CLS] and the
[SEP]s. Each chosen position becomes [MASK] with p=0.8, stays with p=0.1, becomes a uniformly random vocab
id with p=0.1. Predictions are sorted by position and 0-padded to max_pred (position 0 is always [CLS], so
0 means an empty slot — NVIDIA semantics).

Shuffling-then-taking-the-first-k is done as "the k smallest of iid uniform keys", which is the same
distribution over subsets and vectorizes over a whole shard; `mask_tokens` (one sequence, the loader's
dynamic masking) is the same code on a batch of one. Whole-word masking keeps Google's greedy skip loop per
row. `reference_mask_tokens` is a line-by-line port of Google's loop; the tests check both agree in
distribution.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

# bert-base-uncased's ids ([PAD]=0, [CLS]=101, [SEP]=102, [MASK]=103); pass the ids of your vocab otherwise
# (`bertforge.data.vocab.special_ids`, or the attributes of a dynamic-masking shard).
BERT_UNCASED_SPECIAL_IDS = (0, 101, 102)
BERT_UNCASED_MASK_ID = 103


def num_to_predict(length: np.ndarray | int, max_pred: int, masked_lm_prob: float) -> np.ndarray:
    """min(max_pred, max(1, round(length * masked_lm_prob))); round half to even like Python 3's round()."""
    n = np.rint(np.asarray(length, dtype=np.float64) * masked_lm_prob).astype(np.int64)
    return np.minimum(max_pred, np.maximum(1, n))


def _apply_80_10_10(
    ids: np.ndarray, rows: np.ndarray, cols: np.ndarray, rng: np.random.Generator, vocab_size: int, mask_id: int
) -> None:
    """In place: ids[rows, cols] -> [MASK] (80%), unchanged (10%), a random vocab id (10%)."""
    k = rows.shape[0]
    u = rng.random(k)
    rand = rng.integers(0, vocab_size, k)
    # Google: `if rng.random() < 0.8: [MASK] else: keep if rng.random() < 0.5 else random word`
    replace = np.where(u < 0.8, mask_id, np.where(u < 0.9, ids[rows, cols], rand))
    ids[rows, cols] = replace


def mask_batch(
    input_ids: np.ndarray,
    lengths: np.ndarray,
    rng: np.random.Generator,
    vocab_size: int,
    max_pred: int,
    masked_lm_prob: float = 0.15,
    special_ids: Sequence[int] = BERT_UNCASED_SPECIAL_IDS,
    mask_id: int = BERT_UNCASED_MASK_ID,
    word_starts: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mask a batch of rows; returns (masked input_ids (N,S), positions (N,P) int32, labels (N,P) int32).

    input_ids: (N, S) token ids, real tokens first; lengths: (N,) real tokens per row (incl. [CLS]/[SEP]).
    word_starts: (N, S) bool/int, 1 where a token starts a word; given -> whole-word masking.
    """
    ids = np.array(input_ids, copy=True)
    if ids.ndim != 2:
        raise ValueError(f"input_ids must be (N, S), got shape {ids.shape}")
    n_rows, seq = ids.shape
    lengths = np.asarray(lengths, dtype=np.int64)
    positions = np.zeros((n_rows, max_pred), dtype=np.int32)
    labels = np.zeros((n_rows, max_pred), dtype=np.int32)
    if n_rows == 0:
        return ids, positions, labels
    real = np.arange(seq)[None, :] < lengths[:, None]  # (N, S)
    cand = real & ~np.isin(ids, np.asarray(special_ids, dtype=ids.dtype))  # (N, S)
    k = num_to_predict(lengths, max_pred, masked_lm_prob)  # (N,)
    if word_starts is not None:
        for r in range(n_rows):
            pos = _wwm_choose(cand[r], np.asarray(word_starts[r], dtype=bool), int(k[r]), rng)
            positions[r, : len(pos)] = pos
        rows, slots = np.nonzero(positions)
        cols = positions[rows, slots]
    else:
        keys = rng.random((n_rows, seq), dtype=np.float32)  # (N, S) iid keys: a random order of candidates
        keys[~cand] = 2.0  # non-candidates sort last
        p = min(max_pred, seq)
        first = np.argpartition(keys, p - 1, axis=1)[:, :p] if p < seq else np.argsort(keys, axis=1)
        first_keys = np.take_along_axis(keys, first, axis=1)  # (N, p)
        rank = np.argsort(first_keys, axis=1)
        chosen = np.take_along_axis(first, rank, axis=1)  # (N, p) candidates in shuffled order
        take = (np.arange(p)[None, :] < k[:, None]) & (np.take_along_axis(first_keys, rank, axis=1) < 2.0)
        chosen = np.where(take, chosen, seq)  # seq = "no prediction", sorts last
        chosen.sort(axis=1)  # predictions sorted by position
        valid = chosen < seq
        positions[:, :p] = np.where(valid, chosen, 0)
        rows, slots = np.nonzero(valid)
        cols = chosen[rows, slots]
    labels[rows, slots] = ids[rows, cols]
    _apply_80_10_10(ids, rows, cols, rng, vocab_size, mask_id)
    return ids, positions, labels


def _wwm_choose(cand: np.ndarray, starts: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Sorted positions chosen by Google's whole-word loop for one row."""
    idx = np.flatnonzero(cand)
    if idx.size == 0:
        return idx
    new_group = starts[idx].copy()
    new_group[0] = True  # a leading continuation piece starts its own group (Google: `len(cand_indexes) >= 1`)
    bounds = np.flatnonzero(new_group)
    sizes = np.diff(np.append(bounds, idx.size))
    chosen: list[int] = []
    total = 0
    for g in rng.permutation(len(bounds)):
        if total >= k:
            break
        if total + sizes[g] > k:
            continue
        chosen.extend(idx[bounds[g] : bounds[g] + sizes[g]].tolist())
        total += int(sizes[g])
    return np.sort(np.asarray(chosen, dtype=np.int64))


def mask_tokens(
    tokens: np.ndarray,
    rng: np.random.Generator,
    vocab_size: int,
    max_pred: int,
    masked_lm_prob: float = 0.15,
    special_ids: Sequence[int] = BERT_UNCASED_SPECIAL_IDS,
    word_starts: np.ndarray | None = None,
    mask_id: int = BERT_UNCASED_MASK_ID,
    length: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mask one sequence: returns (input_ids like `tokens`, positions (max_pred,) int32, labels (max_pred,) int32).

    `tokens` is `[CLS] A [SEP] B [SEP]` (1-D); a padded row is fine when `length` gives the real length
    (default: len(tokens)). `word_starts` (same length, 1 = starts a word) turns on whole-word masking.
    """
    tokens = np.asarray(tokens)
    n = tokens.shape[0] if length is None else int(length)
    ws = None if word_starts is None else np.asarray(word_starts)[None, :]
    ids, pos, lab = mask_batch(
        tokens[None, :], np.array([n]), rng, vocab_size, max_pred, masked_lm_prob, special_ids, mask_id, ws
    )
    return ids[0], pos[0], lab[0]


def reference_mask_tokens(
    tokens: list[int],
    rng: np.random.Generator,
    vocab_size: int,
    max_pred: int,
    masked_lm_prob: float = 0.15,
    special_ids: Sequence[int] = BERT_UNCASED_SPECIAL_IDS,
    word_starts: list[bool] | None = None,
    mask_id: int = BERT_UNCASED_MASK_ID,
) -> tuple[list[int], list[int], list[int]]:
    """Google's `create_masked_lm_predictions`, line by line (the reference the vectorized path is tested against)."""
    cand_indexes: list[list[int]] = []
    for i, t in enumerate(tokens):
        if t in special_ids:
            continue
        if word_starts is not None and cand_indexes and not word_starts[i]:
            cand_indexes[-1].append(i)
        else:
            cand_indexes.append([i])
    order = rng.permutation(len(cand_indexes))
    output = list(tokens)
    k = min(max_pred, max(1, int(round(len(tokens) * masked_lm_prob))))
    masked: list[tuple[int, int]] = []
    for g in order:
        index_set = cand_indexes[g]
        if len(masked) >= k:
            break
        if len(masked) + len(index_set) > k:
            continue
        for index in index_set:
            if rng.random() < 0.8:
                new = mask_id
            elif rng.random() < 0.5:
                new = tokens[index]
            else:
                new = int(rng.integers(0, vocab_size))
            output[index] = new
            masked.append((index, tokens[index]))
    masked.sort()
    return output, [i for i, _ in masked], [t for _, t in masked]
