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
distribution over subsets and vectorizes over a whole shard (keys are 22-24 random bits with the column as
a tie-break, so exactly k are chosen; the tie bias is below 1e-3 per row). `mask_tokens` (one sequence, the
loader's dynamic masking) is the same code on a batch of one. Whole-word masking runs Google's greedy skip
loop vectorized over rows (one step per group rank). `reference_mask_tokens` is a line-by-line port of
Google's loop; the tests check that both agree in distribution.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

# bert-base-uncased's ids ([PAD]=0, [CLS]=101, [SEP]=102, [MASK]=103); pass the ids of your vocab otherwise
# (`bertforge.data.vocab.special_ids`, or the attributes of a dynamic-masking shard).
BERT_UNCASED_SPECIAL_IDS = (0, 101, 102)
BERT_UNCASED_MASK_ID = 103


def num_to_predict(length: np.ndarray | int, max_pred: int, masked_lm_prob: float) -> np.ndarray:
    """min(max_pred, max(1, round(length * masked_lm_prob))); round half to even like Python 3's round()."""
    n = np.rint(np.asarray(length, dtype=np.float64) * masked_lm_prob).astype(np.int64)
    return np.minimum(max_pred, np.maximum(1, n))


REPLACE_SPLIT = (0.8, 0.1)
"""(P([MASK]), P(random token)) of a chosen position; it keeps its token otherwise: Google BERT's 80/10/10."""


def check_replace_split(split: Sequence[float]) -> None:
    """A ValueError unless split = (P([MASK]), P(random)) are probabilities whose sum is at most 1."""
    m, r = split
    if not (0.0 <= m <= 1.0 and 0.0 <= r <= 1.0 and m + r <= 1.0 + 1e-12):
        raise ValueError(f"the replacement split needs P([MASK]) {m} and P(random) {r} in [0, 1] with a sum <= 1")


def _apply_replacement(
    ids: np.ndarray,
    rows: np.ndarray,
    cols: np.ndarray,
    rng: np.random.Generator,
    vocab_size: int,
    mask_id: int,
    split: Sequence[float] = REPLACE_SPLIT,
) -> None:
    """In place: ids[rows, cols] -> [MASK] (p = split[0]), a random vocab id (p = split[1]), else unchanged."""
    k = rows.shape[0]
    u = rng.random(k)
    rand = rng.integers(0, vocab_size, k)
    # Google: `if rng.random() < 0.8: [MASK] else: keep if rng.random() < 0.5 else random word`; with the
    # default split the thresholds are 0.8 and 1 - 0.1 == 0.9, so the draws and results are Google's
    replace = np.where(u < split[0], mask_id, np.where(u < 1.0 - split[1], ids[rows, cols], rand))
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
    split: Sequence[float] = REPLACE_SPLIT,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mask a batch of rows; returns (masked input_ids (N,S), positions (N,P) int32, labels (N,P) int32).

    input_ids: (N, S) token ids, real tokens first; lengths: (N,) real tokens per row (incl. [CLS]/[SEP]).
    word_starts: (N, S) bool/int, 1 where a token starts a word; given -> whole-word masking.
    split: (P([MASK]), P(random token)) of a chosen position (REPLACE_SPLIT: 80/10/10).
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
    cand = real.copy()  # (N, S)
    for sid in special_ids:  # a few ids: comparisons beat np.isin's sort
        cand &= ids != sid
    k = num_to_predict(lengths, max_pred, masked_lm_prob)  # (N,)
    if word_starts is not None:
        sel = _wwm_select(cand, np.asarray(word_starts, dtype=bool), k, rng)  # (N, S) chosen positions
        rows, cols = np.nonzero(sel)  # row-major: positions ascending within each row
        slots = (np.cumsum(sel, axis=1) - 1)[rows, cols]
        positions[rows, slots] = cols
    else:
        # unique integer keys per row: random bits, then the column (breaks the rare tie), and the top bit
        # set for non-candidates so they sort last; 31 - col_bits random bits (22 at seq 512)
        col_bits = max(1, (seq - 1).bit_length())
        if col_bits > 15:  # data.config.MAX_SEQ_LEN refuses such rows at start-up
            raise ValueError(f"sequence length {seq} is too long for the masking keys (at most 32768)")
        keys = rng.integers(0, 1 << (31 - col_bits), (n_rows, seq), dtype=np.uint32) << np.uint32(col_bits)
        keys |= np.arange(seq, dtype=np.uint32)[None, :]
        keys |= (~cand).astype(np.uint32) << np.uint32(31)
        p = min(max_pred, seq)
        first = np.argpartition(keys, p - 1, axis=1)[:, :p] if p < seq else np.broadcast_to(np.arange(seq), keys.shape)
        first_keys = np.take_along_axis(keys, first, axis=1)  # (N, p) the p smallest keys, unordered
        kth = np.sort(first_keys, axis=1)[np.arange(n_rows), np.minimum(k, p) - 1]  # (N,) k-th smallest key
        take = (first_keys <= kth[:, None]) & (first_keys < np.uint32(1 << 31))
        chosen = np.where(take, first, seq)  # seq = "no prediction", sorts last
        chosen.sort(axis=1)  # predictions sorted by position
        valid = chosen < seq
        positions[:, :p] = np.where(valid, chosen, 0)
        rows, slots = np.nonzero(valid)
        cols = chosen[rows, slots]
    labels[rows, slots] = ids[rows, cols]
    _apply_replacement(ids, rows, cols, rng, vocab_size, mask_id, split)
    return ids, positions, labels


def _wwm_select(cand: np.ndarray, starts: np.ndarray, k: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Google's whole-word loop for all rows at once: (N, S) bool of the chosen positions.

    Groups: a candidate starts a new group if it starts a word or is the row's first candidate; otherwise it
    joins the latest group. Groups are visited in a uniformly random order and taken greedily when they fit
    in what is left of k (a group that does not fit is skipped, later smaller ones may still fit) — one
    vectorized step per group rank instead of a Python loop per row.
    """
    n, seq = cand.shape
    first_cand = cand & (np.cumsum(cand, axis=1) == 1)
    new_group = cand & (starts | first_cand)  # (N, S)
    gid = np.cumsum(new_group, axis=1) - 1  # (N, S) group of each position (valid where cand)
    n_groups = new_group.sum(axis=1)  # (N,)
    rows, cols = np.nonzero(cand)
    sizes = np.bincount(rows * seq + gid[rows, cols], minlength=n * seq).reshape(n, seq)  # (N, G<=S) group sizes
    keys = rng.random((n, seq), dtype=np.float32)  # (N, S) a random order of the groups; slots past n_groups last
    keys[np.arange(seq)[None, :] >= n_groups[:, None]] = 2.0
    order = np.argsort(keys, axis=1)  # (N, S) group ids in visiting order
    ordered = np.take_along_axis(sizes, order, axis=1)
    ordered[np.take_along_axis(keys, order, axis=1) >= 2.0] = seq + 1  # never fits
    total = np.zeros(n, dtype=np.int64)
    taken = np.zeros((n, seq), dtype=bool)
    for j in range(int(n_groups.max(initial=0))):
        fit = total + ordered[:, j] <= k
        taken[:, j] = fit
        total += np.where(fit, ordered[:, j], 0)
    chosen_group = np.zeros((n, seq), dtype=bool)
    np.put_along_axis(chosen_group, order, taken, axis=1)
    return cand & np.take_along_axis(chosen_group, np.where(cand, gid, 0), axis=1)


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
    split: Sequence[float] = REPLACE_SPLIT,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mask one sequence: returns (input_ids like `tokens`, positions (max_pred,) int32, labels (max_pred,) int32).

    `tokens` is `[CLS] A [SEP] B [SEP]` (1-D); a padded row is fine when `length` gives the real length
    (default: len(tokens)). `word_starts` (same length, 1 = starts a word) turns on whole-word masking;
    `split` is the replacement split (see `mask_batch`).
    """
    tokens = np.asarray(tokens)
    n = tokens.shape[0] if length is None else int(length)
    ws = None if word_starts is None else np.asarray(word_starts)[None, :]
    ids, pos, lab = mask_batch(
        tokens[None, :], np.array([n]), rng, vocab_size, max_pred, masked_lm_prob, special_ids, mask_id, ws, split
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


# ------------------------------------------------------------------------------------ instance creation
def create_instance_specs(
    doc_first: Sequence[int],
    doc_count: Sequence[int],
    offsets: Sequence[int],
    rng: np.random.Generator,
    max_seq_len: int = 128,
    short_seq_prob: float = 0.1,
    dupe_factor: int = 10,
) -> dict[str, np.ndarray]:
    """Google BERT's `create_instances_from_document` over all documents, dupe_factor times (DESIGN §3.1).

    The corpus is one flat token array; sentence k is tokens[offsets[k]:offsets[k+1]] (no empty sentences),
    document d is sentences doc_first[d] .. doc_first[d]+doc_count[d]-1. Since A and B are always runs of
    consecutive sentences, an instance is just two token ranges: returns int64 arrays `a_start, a_len,
    b_start, b_len` (after truncation) and int8 `label` (1 = random next), instances in shuffled order.

    Scalar draws come from a `random.Random` seeded by `rng` (Python's scalar draws are ~10x cheaper than a
    Generator's); truncation is done in closed form: trimming "the longer of A and B, one token at a time"
    removes a fixed number of tokens from each, and the number taken from the front is Binomial(n, 0.5)
    (each trim is a fair front/back coin in Google's `truncate_seq_pair`), drawn vectorized.
    """
    import random

    r = random.Random(int(rng.integers(0, 2**63)))
    out = _Instances()
    order = list(range(len(doc_first)))
    r.shuffle(order)  # Google shuffles the documents once
    for _ in range(dupe_factor):
        for di in order:
            _document_instances(di, doc_first, doc_count, offsets, r.random, max_seq_len - 3, short_seq_prob, out)
    specs = out.arrays()
    truncate_specs(specs, max_seq_len - 3, rng)
    perm = rng.permutation(len(specs["label"]))  # Google shuffles all instances
    return {k: v[perm] for k, v in specs.items()}


class _Instances:
    """The instances found so far, in compact typed arrays (8 bytes per value, not a Python int object each),
    so a shard's memory stays small."""

    def __init__(self) -> None:
        from array import array

        self.a_start, self.a_len, self.b_start, self.b_len = array("q"), array("q"), array("q"), array("q")
        self.label = array("b")
        # the bound appends, fetched once: the per-instance path is the hot loop of shard building
        self.appends = (
            self.a_start.append,
            self.a_len.append,
            self.b_start.append,
            self.b_len.append,
            self.label.append,
        )

    def arrays(self) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {
            k: np.frombuffer(getattr(self, k), dtype=np.int64).copy() for k in ("a_start", "a_len", "b_start", "b_len")
        }
        out["label"] = np.frombuffer(self.label, dtype=np.int8).copy()
        return out


def _document_instances(
    di: int,
    doc_first: Sequence[int],
    doc_count: Sequence[int],
    off: Sequence[int],
    rand,
    max_num: int,
    short_seq_prob: float,
    out: _Instances,
) -> None:
    """Google's `create_instances_from_document` for document di (one pass of the dupe factor)."""
    add_a_start, add_a_len, add_b_start, add_b_len, add_label = out.appends
    ndocs = len(doc_first)
    first, n = doc_first[di], doc_count[di]
    target = max_num
    if rand() < short_seq_prob:
        target = 2 + int(rand() * (max_num - 1))  # randint(2, max_num_tokens)
    i = 0
    chunk_n = 0
    cur = 0
    while i < n:
        k = first + i
        chunk_n += 1
        cur += off[k + 1] - off[k]
        if i == n - 1 or cur >= target:
            cf = k - chunk_n + 1  # first sentence of the chunk
            a_end = 1 if chunk_n < 2 else 1 + int(rand() * (chunk_n - 1))  # randint(1, len-1)
            a_start = off[cf]
            a_len = off[cf + a_end] - a_start
            if chunk_n == 1 or rand() < 0.5:
                target_b = target - a_len
                rd = di
                for _t in range(10):  # up to 10 tries to pick another document
                    rd = int(rand() * ndocs)
                    if rd != di:
                        break
                rfirst, rn = doc_first[rd], doc_count[rd]
                j = rfirst + int(rand() * rn)  # random start sentence
                b_start = off[j]
                end = rfirst + rn
                while j < end:  # B: sentences from there on until they reach target_b tokens
                    j += 1
                    if off[j] - b_start >= target_b:
                        break
                b_len = off[j] - b_start
                # DESIGN §3.1: B from the same document (only document left) is labelled IsNext
                label = 1 if rd != di else 0
                i -= chunk_n - a_end  # put the unused sentences of the chunk back
            else:
                b_start = off[cf + a_end]
                b_len = off[k + 1] - b_start
                label = 0
            add_a_start(a_start)
            add_a_len(a_len)
            add_b_start(b_start)
            add_b_len(b_len)
            add_label(label)
            chunk_n = 0
            cur = 0
        i += 1


def truncate_amounts(la: np.ndarray, lb: np.ndarray, max_num: int) -> tuple[np.ndarray, np.ndarray]:
    """Tokens Google's `truncate_seq_pair` removes from A and from B (it trims the longer, B on ties)."""
    excess = np.maximum(0, la + lb - max_num)
    d = np.abs(la - lb)
    simple = excess <= d  # only the longer one is trimmed
    rest = np.where(simple, 0, excess - d)  # then both are equal and trims alternate B, A, B, ...
    ra = np.where(simple, np.where(la > lb, excess, 0), np.where(la > lb, d, 0) + rest // 2)
    rb = np.where(simple, np.where(la > lb, 0, excess), np.where(la > lb, 0, d) + rest - rest // 2)
    return ra, rb


def truncate_specs(specs: dict[str, np.ndarray], max_num: int, rng: np.random.Generator) -> None:
    """In place: truncate every (A, B) pair to max_num tokens together; front or back with p=0.5 per token."""
    ra, rb = truncate_amounts(specs["a_len"], specs["b_len"], max_num)
    fa = rng.binomial(ra, 0.5)
    fb = rng.binomial(rb, 0.5)
    specs["a_start"] += fa
    specs["a_len"] -= ra
    specs["b_start"] += fb
    specs["b_len"] -= rb


def reference_truncate(la: int, lb: int, max_num: int) -> tuple[int, int]:
    """Google's loop, counting removals (the test reference of `truncate_amounts`)."""
    ra = rb = 0
    while (la - ra) + (lb - rb) > max_num:
        if la - ra > lb - rb:
            ra += 1
        else:
            rb += 1
    return ra, rb


def _ragged(starts: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row of each element, offset within its run) for runs of `lens` elements: a ragged arange."""
    total = int(lens.sum())
    row = np.repeat(np.arange(lens.shape[0]), lens)  # (total,)
    run_begin = np.cumsum(lens) - lens  # (N,) flat index where each run begins
    within = np.arange(total) - run_begin[row]
    return row, within


def build_rows(
    tokens: np.ndarray, specs: dict[str, np.ndarray], seq_len: int, cls_id: int, sep_id: int
) -> dict[str, np.ndarray]:
    """`[CLS] A [SEP] B [SEP]` rows, 0-padded: input_ids (N,S) int32, input_mask (N,S) int8, segment_ids (N,S) int8.

    Gathers only the real tokens (ragged index arithmetic), so padding costs nothing but the zero fill.
    """
    la, lb = specs["a_len"], specs["b_len"]
    n = la.shape[0]
    ids = np.zeros((n, seq_len), dtype=np.int32)
    flat = ids.reshape(-1)
    base = np.arange(n, dtype=np.int64) * seq_len  # (N,) flat index of each row's [CLS]
    row, j = _ragged(specs["a_start"], la)
    flat[base[row] + 1 + j] = tokens[specs["a_start"][row] + j]  # A at columns 1..la
    row, j = _ragged(specs["b_start"], lb)
    flat[base[row] + la[row] + 2 + j] = tokens[specs["b_start"][row] + j]  # B after the first [SEP]
    flat[base] = cls_id
    flat[base + la + 1] = sep_id
    total = la + lb + 3
    flat[base + total - 1] = sep_id
    c = np.arange(seq_len, dtype=np.int64)[None, :]  # (1, S)
    return {
        "input_ids": ids,
        "input_mask": (c < total[:, None]).view(np.int8),
        # segment 0: [CLS] A [SEP]; segment 1: B [SEP]
        "segment_ids": ((c >= (la + 2)[:, None]) & (c < total[:, None])).view(np.int8),
    }


# ------------------------------------------------------------------------------------ MLM-only rows
def mlm_stream_length(n_tokens: int, n_docs: int, dupe_factor: int) -> int:
    """Tokens of the MLM-only stream: dupe_factor passes over the documents, one separator between
    consecutive documents (none after the last)."""
    return dupe_factor * (n_tokens + n_docs) - 1 if n_docs else 0


def mlm_row_count(n_tokens: int, n_docs: int, dupe_factor: int, seq_len: int) -> int:
    """Rows `full_sentence_rows` yields: the stream cut into pieces of seq_len - 2 tokens, the last one partial."""
    return -(-mlm_stream_length(n_tokens, n_docs, dupe_factor) // (seq_len - 2))


def _document_passes(
    tokens: np.ndarray,
    offsets: np.ndarray,
    doc_first: np.ndarray,
    doc_count: np.ndarray,
    rng: np.random.Generator,
    dupe_factor: int,
    sep_id: int,
) -> Iterator[np.ndarray]:
    """Each pass: every document once, in a fresh seeded order, each followed by [SEP] (int32 (T + docs,))."""
    first = np.asarray(doc_first, dtype=np.int64)
    starts = np.asarray(offsets, dtype=np.int64)[first]  # (D,) each document's first token
    lens = np.asarray(offsets, dtype=np.int64)[first + np.asarray(doc_count, dtype=np.int64)] - starts  # (D,)
    for _ in range(dupe_factor):
        order = rng.permutation(first.size)
        s, n = starts[order], lens[order] + 1  # each document plus its separator
        out = np.full(int(n.sum()), sep_id, dtype=np.int32)
        row, j = _ragged(s, n - 1)
        out[(np.cumsum(n) - n)[row] + j] = tokens[s[row] + j]
        yield out


def full_sentence_rows(
    tokens: np.ndarray,
    offsets: np.ndarray,
    doc_first: np.ndarray,
    doc_count: np.ndarray,
    rng: np.random.Generator,
    seq_len: int,
    dupe_factor: int,
    cls_id: int,
    sep_id: int,
    block_rows: int = 4096,
) -> Iterator[dict[str, np.ndarray]]:
    """MLM-only rows (RoBERTa's FULL-SENTENCES, no segment B, no NSP label), in blocks of `block_rows`.

    The documents (sentence k is tokens[offsets[k]:offsets[k+1]], document d its sentences doc_first[d] ..
    + doc_count[d]) are streamed dupe_factor times, each pass in a new seeded order, with one [SEP] between
    consecutive documents (RoBERTa's extra separator at a document boundary). The stream is cut into pieces
    of seq_len - 2 tokens, each row `[CLS] piece [SEP]`: every row is full but the last, and a sentence that
    does not fit the rest of a row continues in the next (no padding, as MosaicBERT's and ModernBERT's
    concatenated streams; RoBERTa ended the row before it). Yields input_ids (b, S) int32, input_mask (b, S)
    int8 and segment_ids (b, S) int8 (all 0).
    """
    C = seq_len - 2
    total = mlm_stream_length(int(offsets[-1]), len(doc_first), dupe_factor)
    carry = np.zeros(0, np.int32)
    done = 0  # stream tokens already in rows
    for part in _document_passes(tokens, offsets, doc_first, doc_count, rng, dupe_factor, sep_id):
        buf = np.concatenate([carry, part])
        if done + buf.size >= total:  # the last pass: drop the separator after the last document
            buf = buf[: total - done]
        full = buf.size // C if done + buf.size < total else -(-buf.size // C)
        for a in range(0, full, block_rows):
            b = min(full, a + block_rows)
            yield _stream_rows(buf[a * C : b * C], b - a, seq_len, cls_id, sep_id)
        done += min(buf.size, full * C)
        carry = buf[full * C :]


def _stream_rows(piece: np.ndarray, n: int, seq_len: int, cls_id: int, sep_id: int) -> dict[str, np.ndarray]:
    """n rows `[CLS] chunk [SEP]` from consecutive chunks of seq_len - 2 tokens of `piece` (the last may be short)."""
    C = seq_len - 2
    body = np.zeros(n * C, np.int32)
    body[: piece.size] = piece
    ids = np.zeros((n, seq_len), np.int32)
    ids[:, 1 : 1 + C] = body.reshape(n, C)  # (n, C) into columns 1..C
    lens = np.minimum(C, piece.size - np.arange(n) * C)  # (n,) tokens of each chunk
    ids[:, 0] = cls_id
    ids[np.arange(n), lens + 1] = sep_id
    c = np.arange(seq_len)[None, :]  # (1, S)
    return {
        "input_ids": ids,
        "input_mask": (c < (lens + 2)[:, None]).view(np.int8),
        "segment_ids": np.zeros((n, seq_len), np.int8),  # no segment B
    }
