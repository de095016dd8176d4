"""Synthetic pre-training batches: well-formed, masked, optionally packed, made on the fly (`data.input_dir:
synthetic`), for benchmarks and smoke tests without data preparation (Graphcore's examples have the same idea).

A row is `[CLS] A [SEP] B [SEP]`, padded: segment 0 for [CLS], A and the first [SEP], 1 for B and the last
[SEP]; the A/B split is uniform; tokens are uniform random word ids; the next-sentence label is a fair coin.
Masking is `bertforge.data.instances.mask_batch`, i.e. Google's rule: `min(max_pred, max(1, round(0.15 *
length)))` predictions per sequence, never on [CLS]/[SEP]/padding, 80% [MASK] / 10% kept / 10% random word,
positions sorted. Batches have exactly the keys and conventions of `bertforge.data.loader` (unpacked: NVIDIA
schema; packed: the packed schema of DESIGN §3.3, as `bertforge pack` writes it), as int64 CPU tensors.

**Lengths.** Real lengths (special tokens included) are drawn from a length histogram:

- ``"wiki"`` at seq_len > 256 (phase 2): the parametric imitation of the published Wikipedia seq-512
  histogram (Krell et al. 2021, arXiv 2107.02027, Fig. 1; Graphcore's `histograms.py`): 23.4% of the rows are
  full length and the rest follow a log-normal (sigma 1.1) with its mode near 50 tokens, truncated to
  5..seq_len-1, which gives ~51% padding (the paper: "in excess of 50%"). `wiki_like_lengths` samples it.
  Checked against Graphcore's published counts of 16.3M sequences: full rows 23.4% (same), padding 50.0%
  (imitation 51.3%), mode 50 (same), median of the short rows 135 (same), LPFHP with K=3 1.79 sequences per
  pack (imitation 1.82), NNLSHP with K=3 2.03 on the imitation (MLPerf's packed data: ~2).
- ``"wiki"`` at seq_len <= 256 (phase 1, NVIDIA's seq-128 data): Google's `create_pretraining_data` with
  short_seq_prob 0.1 gives a short target uniform in 2..125 tokens (5..128 with [CLS]/[SEP]); Google draws
  it once per document, here it is 10% of the rows; the other rows fill to the full length, except the last
  rows of documents, which end early (an imitation: 14% of the rows, lengths ~ normal(0.55 S, 0.2 S)). That
  is 76% full rows and ~11% padding.
  For comparison, our own `bertforge data shards --seq-len 128` on WikiText-2's validation articles (long
  "good" articles, few document ends) measured 83.5% full rows and 7% padding; full Wikipedia has many short
  articles, hence more document ends. These phase-1 numbers are an imitation, not published counts.
- ``"full"``: every row full length (the old benchmark rows; for comparison only).
- a list of ``(length, weight)`` pairs: any histogram, lengths in 5..seq_len.

**Packing** (``pack=K``): the expected histogram of 2^20 sequences is packed once with LPFHP
(`bertforge.data.packing.lpfhp`, what `bertforge pack` uses by default; ~5 ms) or another algorithm of
`bertforge pack` (NNLSHP: ~20 s at seq 512, once per process, denser packs); each packed row is then an
independent draw of one of the strategy's packs (weighted by its count), so rows have the same distribution
of sequence combinations (and the same avg_seq_per_sample and packing efficiency) as a packed data set of
that histogram. The masked-LM width is `packing.mlm_width` over those packs (max_pred + K or more).

**Lanes and resume** as in `bertforge.data.loader`: an update takes one micro-batch from each of
`global / micro` lanes; rank r owns lanes [r·accum, (r+1)·accum); micro-batch b of lane l is a pure function
of (seed, l, b), so `iterate(start_batch=n)` continues exactly and the data of an update does not depend on
the world size.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertforge.data import packing_algorithms as pa
from bertforge.data import packing_rows as pr
from bertforge.data.instances import mask_batch, num_to_predict
from bertforge.data.loader import batch_arithmetic
from bertforge.data.shardset import PACKED_SCHEMA, packed_rows_per_update
from bertforge.errors import ConfigError, UserError

MIN_LEN = 5
"""The shortest well-formed row: [CLS] a [SEP] b [SEP]."""
WIKI512_FULL, WIKI512_MODE, WIKI512_SIGMA = 0.234, 50.0, 1.1
"""Phase-2 imitation: share of full-length rows, log-normal mode (tokens) and sigma (module docstring)."""
WIKI128_SHORT, WIKI128_DOC_END = 0.10, 0.14
"""Phase-1 imitation: short_seq_prob (Google's default) and the share of rows cut by a document's end."""
PACK_SAMPLE = 1 << 20
"""Sequences in the histogram that the packing strategy of a packed synthetic source is computed from."""


# ============================================================================================ histograms
def _lognormal_params(seq_len: int) -> tuple[float, float, float, float]:
    """(mu, sigma, lo, hi) of the phase-2 log-normal truncated to 4.5..seq_len-0.5 (lo/hi in CDF space)."""
    from scipy.special import ndtr

    sigma = WIKI512_SIGMA
    mu = np.log(WIKI512_MODE) + sigma**2  # log-normal mode = exp(mu - sigma^2)
    lo, hi = ndtr((np.log(MIN_LEN - 0.5) - mu) / sigma), ndtr((np.log(seq_len - 0.5) - mu) / sigma)
    return mu, sigma, float(lo), float(hi)


@functools.lru_cache(maxsize=4)
def wiki_like_lengths(n: int, seq_len: int = 512, seed: int = 0) -> np.ndarray:
    """n sequence lengths from the phase-2 Wikipedia-like histogram (module docstring); `wiki_phase2_pmf` is
    its exact probability mass function."""
    from scipy.special import ndtri

    rng = np.random.default_rng(seed)
    mu, sigma, lo, hi = _lognormal_params(seq_len)
    short = np.rint(np.exp(mu + sigma * ndtri(rng.uniform(lo, hi, n))))  # truncated to 5..seq_len-1
    full = rng.random(n) < WIKI512_FULL
    return np.where(full, seq_len, short).astype(np.int16)


def wiki_phase2_pmf(seq_len: int = 512) -> np.ndarray:
    """(S+1,) probability of each real length under the phase-2 imitation (what `wiki_like_lengths` draws)."""
    from scipy.special import ndtr

    mu, sigma, lo, hi = _lognormal_params(seq_len)
    lengths = np.arange(MIN_LEN, seq_len)
    mass = ndtr((np.log(lengths + 0.5) - mu) / sigma) - ndtr((np.log(lengths - 0.5) - mu) / sigma)
    pmf = np.zeros(seq_len + 1)
    pmf[MIN_LEN:seq_len] = (1 - WIKI512_FULL) * mass / (hi - lo)
    pmf[seq_len] += WIKI512_FULL
    return pmf / pmf.sum()


def wiki_phase1_pmf(seq_len: int = 128) -> np.ndarray:
    """(S+1,) probability of each real length under the phase-1 imitation (module docstring)."""
    pmf = np.zeros(seq_len + 1)
    pmf[MIN_LEN:] += WIKI128_SHORT / (seq_len + 1 - MIN_LEN)  # short target: uniform 2..S-3 tokens + 3 specials
    ends = np.arange(MIN_LEN, seq_len)
    bump = np.exp(-0.5 * ((ends - 0.55 * seq_len) / (0.2 * seq_len)) ** 2)
    pmf[MIN_LEN:seq_len] += WIKI128_DOC_END * bump / bump.sum()  # rows cut short by a document's end
    pmf[seq_len] += 1 - WIKI128_SHORT - WIKI128_DOC_END
    return pmf


def length_pmf(histogram: Any, seq_len: int) -> np.ndarray:
    """(S+1,) float64 probabilities of the real lengths 0..S: "wiki", "full" or [(length, weight), ...]."""
    if seq_len < MIN_LEN:
        raise ConfigError(f"synthetic rows need seq_len >= {MIN_LEN} ([CLS] a [SEP] b [SEP]), got {seq_len}")
    if histogram == "wiki":
        return wiki_phase1_pmf(seq_len) if seq_len <= 256 else wiki_phase2_pmf(seq_len)
    if histogram == "full":
        pmf = np.zeros(seq_len + 1)
        pmf[seq_len] = 1.0
        return pmf
    if isinstance(histogram, str) or not isinstance(histogram, Sequence) or not histogram:
        raise ConfigError(
            f"data.synthetic_histogram must be 'wiki', 'full' or a list of [length, weight] pairs, got {histogram!r}"
        )
    pmf = np.zeros(seq_len + 1)
    for item in histogram:
        try:
            length, weight = item
            length, weight = int(length), float(weight)
        except (TypeError, ValueError):
            raise ConfigError(f"data.synthetic_histogram: {item!r} is not a [length, weight] pair") from None
        if not MIN_LEN <= length <= seq_len or not weight >= 0:
            raise ConfigError(
                f"data.synthetic_histogram: length {length} must lie in {MIN_LEN}..{seq_len} and "
                f"weight {weight} must be >= 0"
            )
        pmf[length] += weight
    if pmf.sum() <= 0:
        raise ConfigError("data.synthetic_histogram: the weights sum to 0")
    return pmf / pmf.sum()


def _hashable(histogram: Any) -> Any:
    return histogram if isinstance(histogram, str) else tuple(tuple(x) for x in histogram)


def sample_lengths(cdf: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """(n,) int64 lengths drawn from the cumulative distribution `cdf` (S+1,) over lengths 0..S."""
    return np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right").astype(np.int64)


# ============================================================================================ rows
@dataclass(frozen=True)
class TokenIds:
    """Special ids and the first ordinary word id of the synthetic vocabulary."""

    pad: int
    cls: int
    sep: int
    mask: int
    first_word: int


def token_ids(vocab_size: int) -> TokenIds:
    """bert-base-uncased's layout ([CLS] 101, [SEP] 102, [MASK] 103, words from 999) for vocabularies of 2000+
    ids, which leaves 1000+ word ids; a trained vocab's compact layout ([PAD] [UNK] [CLS] [SEP] [MASK] = 0..4)
    for smaller ones (1000 ids in BERT's layout held one word id: the MLM accuracy reached 1.0 on "random" rows)."""
    if vocab_size >= 2000:
        return TokenIds(pad=0, cls=101, sep=102, mask=103, first_word=999)
    if vocab_size < 16:
        raise ConfigError(f"data.synthetic_vocab_size must be >= 16, got {vocab_size}")
    return TokenIds(pad=0, cls=2, sep=3, mask=4, first_word=5)


def make_sequences(
    lengths: np.ndarray,
    seq_len: int,
    max_pred: int,
    vocab_size: int,
    rng: np.random.Generator,
    masked_lm_prob: float = 0.15,
) -> dict[str, np.ndarray]:
    """Masked rows `[CLS] A [SEP] B [SEP]` of the given real lengths (N,), in the NVIDIA schema (DESIGN §3.2)."""
    ids = token_ids(vocab_size)
    L = np.asarray(lengths, np.int64)
    N = len(L)
    rows = np.arange(N)
    col = np.arange(seq_len)[None, :]  # (1, S)
    tokens = rng.integers(ids.first_word, vocab_size, (N, seq_len), dtype=np.int32)  # (N, S)
    sep1 = 2 + (rng.random(N) * (L - 4)).astype(np.int64)  # A holds 1..L-4 tokens, so B holds at least 1
    tokens[:, 0] = ids.cls
    tokens[rows, sep1] = ids.sep
    tokens[rows, L - 1] = ids.sep
    real = col < L[:, None]  # (N, S)
    tokens[~real] = ids.pad
    segments = (col > sep1[:, None]) & real  # B and the last [SEP]
    masked, positions, labels = mask_batch(
        tokens, L, rng, vocab_size, max_pred, masked_lm_prob, special_ids=(ids.pad, ids.cls, ids.sep), mask_id=ids.mask
    )
    return {
        "input_ids": masked,
        "input_mask": real.astype(np.int8),
        "segment_ids": segments.astype(np.int8),
        "masked_lm_positions": positions,
        "masked_lm_ids": labels,
        "next_sentence_labels": rng.integers(0, 2, N).astype(np.int8),
    }


# ============================================================================================ packing
@dataclass(frozen=True)
class PackPlan:
    """The packs a packed synthetic row is drawn from (an LPFHP strategy over the expected histogram)."""

    table: np.ndarray
    """(J, K) int64 sequence lengths of each kind of pack, longest first; 0 = empty slot."""
    cdf: np.ndarray
    """(J,) cumulative pack counts: row kinds are drawn in proportion to how often the strategy uses them."""
    avg_seq_per_sample: float
    """Sequences per packed row."""
    efficiency: float
    """Real tokens / token slots of the packed rows."""
    width: int
    """Masked-LM slots per row: `packing.mlm_width` over the packs (never overflows)."""


@functools.lru_cache(maxsize=8)
def pack_plan(
    seq_len: int,
    histogram: Any,
    max_per_pack: int,
    max_pred: int,
    masked_lm_prob: float = 0.15,
    algorithm: str = "lpfhp",
) -> PackPlan:
    """The packing strategy of PACK_SAMPLE sequences of the histogram (hashable: str or tuple of pairs)."""
    hist = np.rint(length_pmf(histogram, seq_len) * PACK_SAMPLE).astype(np.int64)
    strategy = _cached_strategy(hist, seq_len, max_per_pack, algorithm)
    table = np.zeros((len(strategy.combos), max_per_pack), np.int64)
    for j, combo in enumerate(strategy.combos):
        table[j, : len(combo)] = combo
    preds = num_to_predict(np.arange(seq_len + 1), max_pred, masked_lm_prob)  # predictions by length
    width = pr.mlm_width(max_pred, max_per_pack, preds, np.where(table > 0, table, -1))
    return PackPlan(
        table,
        np.cumsum(strategy.counts).astype(np.float64),
        strategy.sequences / strategy.packs,
        strategy.efficiency,
        width,
    )


def _cached_strategy(hist: np.ndarray, seq_len: int, max_per_pack: int, algorithm: str) -> pa.Strategy:
    """`pa.pack_histogram`, solved once per machine (`runtime.io.cache_dir`): NNLSHP's least squares takes ~11 s
    at seq 512, and a benchmark paid it in its own process and again in each child's set-up (inside first_step_s).
    Keyed by the histogram, the settings and the packing code itself, so a changed algorithm solves afresh; a file
    that does not read back as a strategy of this histogram is solved again."""
    import hashlib

    from bertforge.runtime.io import cache_dir, write_text

    key = hashlib.sha256(hist.tobytes() + f"|{seq_len}|{max_per_pack}|{algorithm}|".encode())
    key.update(Path(pa.__file__).read_bytes())
    path = cache_dir() / "packing" / f"{key.hexdigest()[:24]}.json"
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        saved = json.loads(path.read_text(encoding="utf-8"))
        combos = [tuple(int(x) for x in c) for c in saved["combos"]]
        cached = pa.Strategy(combos, np.asarray(saved["counts"], np.int64), seq_len, max_per_pack)
        if len(combos) == len(cached.counts) and cached.sequences == int(hist.sum()):
            return cached
    strategy = pa.pack_histogram(hist, seq_len, max_per_pack, algorithm)
    # a read-only home (write_text says it as a UserError): solved again next time, nothing lost
    with contextlib.suppress(OSError, UserError):
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {"combos": [list(c) for c in strategy.combos], "counts": strategy.counts.tolist()}
        write_text(path, json.dumps(data))
    return strategy


def make_packed_rows(
    plan: PackPlan,
    rows: int,
    seq_len: int,
    max_pred: int,
    vocab_size: int,
    rng: np.random.Generator,
    masked_lm_prob: float = 0.15,
) -> dict[str, np.ndarray]:
    """`rows` packed rows (the packed schema), each an independent draw of one of the plan's packs."""
    kinds = np.searchsorted(plan.cdf, rng.random(rows) * plan.cdf[-1], side="right")  # (R,)
    lengths = plan.table[kinds]  # (R, K) sequence lengths, 0 = empty slot
    samples = make_sequences(lengths[lengths > 0], seq_len, max_pred, vocab_size, rng, masked_lm_prob)
    return pack_in_order(samples, lengths, plan.width)


def pack_in_order(samples: dict[str, np.ndarray], lengths: np.ndarray, width: int) -> dict[str, np.ndarray]:
    """`packing.build_packed_rows` for sequences that come in pack order (row by row, slot by slot; `lengths`
    (R, K) of the packs, 0 = empty slot, longest first): one flat gather per array instead of one pass per slot
    (2x faster on 256 x 512 rows); the tests check that both give the same rows."""
    R, K = lengths.shape
    S = samples["input_ids"].shape[1]
    used = lengths > 0  # (R, K)
    seq_of = np.where(used, np.cumsum(used.ravel()).reshape(R, K) - 1, 0)  # (R, K) index into samples
    ends = np.cumsum(lengths, axis=1)
    starts = ends - lengths  # (R, K) offset of each sequence in its row
    col = np.arange(S)[None, :]  # (1, S)
    real = col < ends[:, -1:]  # (R, S)
    slot = np.zeros((R, S), np.int64)  # (R, S) slot of each position (K on padding); a loop over K beats (R, S, K)
    for k in range(K):
        slot += col >= ends[:, k : k + 1]
    slot_c = np.minimum(slot, K - 1)
    rel = col - np.take_along_axis(starts, slot_c, 1)  # (R, S) position within its sequence
    src = np.where(real, np.take_along_axis(seq_of, slot_c, 1) * S + rel, 0)  # (R, S) flat index into samples
    out: dict[str, np.ndarray] = {
        "input_ids": np.where(real, samples["input_ids"].ravel()[src], 0).astype(np.int32),
        "segment_ids": np.where(real, samples["segment_ids"].ravel()[src], 0).astype(np.int8),
        "positions": np.where(real, rel, 0).astype(np.int32),
        "input_mask": np.where(real, slot + 1, 0).astype(np.int8),
        "next_sentence_positions": np.where(used, starts, 0).astype(np.int32),
        "next_sentence_labels": np.where(used, samples["next_sentence_labels"][seq_of], 0).astype(np.int8),
        "next_sentence_weights": used.astype(np.int8),
    }
    # predictions: sequences in pack order and positions sorted within each, so row-major order of the
    # (sequence, slot) grid is the row's order; shift by the offset and compact to the front of the row
    pos = samples["masked_lm_positions"]  # (M, P)
    seq, j = np.nonzero(pos)
    row_of = np.repeat(np.arange(R), used.sum(1))  # (M,) the row of every sequence
    offset = starts[used]  # (M,)
    rows = row_of[seq]
    first = np.searchsorted(rows, np.arange(R))  # index of each row's first prediction
    slots = np.arange(len(rows)) - first[rows]
    if len(slots) and slots.max() >= width:
        raise ValueError(f"a pack holds more than {width} predictions")
    out["masked_lm_positions"] = np.zeros((R, width), np.int32)
    out["masked_lm_ids"] = np.zeros((R, width), np.int32)
    out["masked_lm_positions"][rows, slots] = pos[seq, j] + offset[seq]
    out["masked_lm_ids"][rows, slots] = samples["masked_lm_ids"][seq, j]
    return {name: out[name] for name in PACKED_SCHEMA}


# ============================================================================================ loader
class SyntheticLoader:
    """Micro-batches for this rank, `accum` per update, made on the fly (the interface of `PretrainLoader`).

        loader = SyntheticLoader(seq_len=512, max_pred=80, vocab_size=30522, global_batch=256, micro_batch=32,
                                 rank=0, world_size=1, seed=1, histogram="wiki", pack=3)
        it = loader.iterate(start_batch=cursor)
        for step: micro_batches = [next(it) for _ in range(loader.accum)]

    `global_batch` counts rows (packed rows when pack > 0), like `PretrainLoader.from_dir`; `loader_for`
    converts a global batch of sequences.
    """

    def __init__(
        self,
        seq_len: int,
        max_pred: int,
        vocab_size: int,
        global_batch: int,
        micro_batch: int,
        rank: int,
        world_size: int,
        seed: int,
        histogram: Any = "wiki",
        pack: int = 0,
        masked_lm_prob: float = 0.15,
        pack_algorithm: str = "lpfhp",
        num_workers: int = 0,
        prefetch: int = 4,
    ):
        check_params(seq_len, max_pred, vocab_size, histogram, pack, pack_algorithm)
        self.num_workers, self.prefetch = num_workers, prefetch
        self.pin_memory = False
        """Page-locked batches (the training loop sets it on CUDA: non-blocking copies overlap the step)."""
        self.segments = False
        """Batches carry `cu_seqlens` (`data.loader.with_segments`; the training loop decides)."""
        self.seq_len, self.vocab_size, self.micro_batch, self.seed = seq_len, vocab_size, micro_batch, seed
        self.pack, self.masked_lm_prob, self._max_pred = pack, masked_lm_prob, max_pred
        self._accum = batch_arithmetic(global_batch, micro_batch, world_size)
        self.my_lanes = list(range(rank * self._accum, (rank + 1) * self._accum))
        self.histogram = _hashable(histogram)
        self.cdf = np.cumsum(length_pmf(self.histogram, seq_len))
        self.plan = pack_plan(seq_len, self.histogram, pack, max_pred, masked_lm_prob, pack_algorithm) if pack else None

    @property
    def accum(self) -> int:
        return self._accum

    @property
    def kind(self) -> str:
        return "synthetic-packed" if self.pack else "synthetic"

    @property
    def max_pred(self) -> int:
        """Width of masked_positions per row (packed: the packed schema's masked-LM width)."""
        return self.plan.width if self.plan else self._max_pred

    @property
    def avg_seq_per_sample(self) -> float:
        return self.plan.avg_seq_per_sample if self.plan else 1.0

    @property
    def mean_length(self) -> float:
        """Expected real tokens per sequence under the histogram."""
        pmf = np.diff(self.cdf, prepend=0.0)
        return float((pmf * np.arange(len(pmf))).sum())

    def batch(self, lane: int, number: int) -> dict[str, torch.Tensor]:
        """Micro-batch `number` of lane `lane`: a pure function of (seed, lane, number)."""
        rng = np.random.default_rng([self.seed, lane, number])
        if self.plan is not None:
            rows = make_packed_rows(
                self.plan, self.micro_batch, self.seq_len, self._max_pred, self.vocab_size, rng, self.masked_lm_prob
            )
            return pr.packed_model_inputs(rows)
        lengths = sample_lengths(self.cdf, self.micro_batch, rng)
        rows = make_sequences(lengths, self.seq_len, self._max_pred, self.vocab_size, rng, self.masked_lm_prob)
        return pr.unpacked_model_inputs(rows)

    def iterate(self, start_batch: int = 0) -> Iterator[dict[str, torch.Tensor]]:
        """Endless micro-batches of this rank from update `start_batch` on: each update, one per own lane; made
        in `num_workers` processes (in order, `prefetch` each ahead) or, with 0, here when asked for."""
        from bertforge.data.loader import batch_stream

        return batch_stream(
            _SyntheticStream(self, start_batch),
            self.num_workers,
            self.prefetch,
            self.seed,
            self.pin_memory,
            self.segments,
        )


class _SyntheticStream(torch.utils.data.IterableDataset):
    """Item k of a rank is lane my_lanes[k % accum]'s micro-batch start + k // accum; worker w of W makes the
    items w, w + W, ... and the DataLoader hands them out in order."""

    def __init__(self, loader: SyntheticLoader, start_batch: int):
        super().__init__()
        self.loader, self.start = loader, start_batch

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = torch.utils.data.get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        lanes = self.loader.my_lanes
        for k in itertools.count(wid, nw):
            yield self.loader.batch(lanes[k % len(lanes)], self.start + k // len(lanes))


def check_params(
    seq_len: int, max_pred: int, vocab_size: int, histogram: Any, pack: int, pack_algorithm: str = "lpfhp"
) -> None:
    """ConfigError naming the data.synthetic_* key to change, for settings no synthetic row can satisfy."""
    length_pmf(histogram, seq_len)  # checks seq_len and the histogram
    if not 1 <= max_pred <= seq_len - 3:
        raise ConfigError(f"data.synthetic_max_pred must lie in 1..seq_len-3 = {seq_len - 3}, got {max_pred}")
    token_ids(vocab_size)  # checks the size
    if pack < 0:
        raise ConfigError(f"data.synthetic_pack must be >= 0 (0 = unpacked), got {pack}")
    if pack_algorithm not in pa.ALGORITHMS:
        raise ConfigError(
            f"data.synthetic_pack_algorithm must be one of {', '.join(pa.ALGORITHMS)}, got {pack_algorithm!r}"
        )


def loader_for(
    cfg_data: Any, global_batch: int, micro_batch: int, rank: int, world_size: int, seed: int
) -> SyntheticLoader:
    """The synthetic loader of a `PretrainDataConfig` with input_dir "synthetic". `global_batch` counts
    sequences (train.global_batch_size): packed, the update takes global / avg_seq_per_sample rows. Batches
    are made in data.num_workers processes, data.prefetch each ahead."""
    d = cfg_data
    args = (
        d.synthetic_seq_len,
        d.synthetic_max_pred,
        d.synthetic_vocab_size,
        d.synthetic_histogram,
        d.synthetic_pack,
        d.synthetic_pack_algorithm,
    )
    check_params(*args)
    rows = global_batch
    if d.synthetic_pack:
        plan = pack_plan(
            d.synthetic_seq_len,
            _hashable(d.synthetic_histogram),
            d.synthetic_pack,
            d.synthetic_max_pred,
            0.15,
            d.synthetic_pack_algorithm,
        )
        rows = packed_rows_per_update(global_batch, plan.avg_seq_per_sample, micro_batch, world_size)
    return SyntheticLoader(
        d.synthetic_seq_len,
        d.synthetic_max_pred,
        d.synthetic_vocab_size,
        rows,
        micro_batch,
        rank,
        world_size,
        seed,
        d.synthetic_histogram,
        d.synthetic_pack,
        pack_algorithm=d.synthetic_pack_algorithm,
        num_workers=d.num_workers,
        prefetch=d.prefetch,
    )
