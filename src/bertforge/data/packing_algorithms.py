"""Histogram packing algorithms (DESIGN §3.3): sequence lengths -> a packing strategy -> packs of sample indices.

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
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from bertforge.errors import UserError


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
        want = np.zeros(max(self.max_len + 1, len(histogram)), np.int64)
        want[: len(histogram)] = histogram
        got = np.zeros_like(want)
        got[: self.max_len + 1] = self.histogram()
        assert np.array_equal(got, want), "strategy does not pack every sequence exactly once"


def length_histogram(lengths: np.ndarray, max_len: int) -> np.ndarray:
    """(S+1,) int64 count of each length 0..S; lengths outside 1..S are an error."""
    lengths = np.asarray(lengths)
    if lengths.size and (lengths.min() < 1 or lengths.max() > max_len):
        raise UserError(f"sequence lengths must lie in 1..{max_len}; found {lengths.min()}..{lengths.max()}")
    return np.bincount(lengths.astype(np.int64, copy=False), minlength=max_len + 1).astype(np.int64)


def _checked_histogram(histogram: np.ndarray, max_len: int, max_per_pack: int) -> np.ndarray:
    """(S+1,) int64 copy of `histogram` (index = length), zero-padded; a UserError for what no algorithm can pack.

    Every algorithm walks lengths 1..S only: a count at length 0 or beyond S, or a negative count, would be
    silently left out of the strategy, and the samples of those lengths out of every pack."""
    if max_per_pack < 1:
        raise UserError(f"--max-per-pack must be at least 1, not {max_per_pack}")
    h = np.asarray(histogram, np.int64).reshape(-1)
    if (h < 0).any():
        raise UserError(f"the length histogram has a negative count (at length {int(np.argmax(h < 0))})")
    if len(h) and h[0]:
        raise UserError(f"the length histogram holds {int(h[0])} sequences of length 0; lengths must be 1..{max_len}")
    if h[max_len + 1 :].any():
        raise UserError(f"the histogram holds sequences longer than {max_len}")
    out = np.zeros(max_len + 1, np.int64)
    out[: min(len(h), max_len + 1)] = h[: max_len + 1]
    return out


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
    h = _checked_histogram(histogram, max_len, max_per_pack)
    groups = _OpenGroups(max_len, max_per_pack)
    for length in range(max_len, 0, -1):  # longest first
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


def _count_exact_combos(present: np.ndarray, max_len: int, k: int, cap: int = 1 << 40) -> int:
    """How many combinations `_exact_combos` would list (saturating at `cap`), without listing them.

    g[d, r] = multisets of exactly d present lengths summing to r; adding one length m with any multiplicity is
    g[d, r] += g[d-1, r-m] for d ascending (g[d-1] already counts m). O(L * k) vector ops: milliseconds, where
    listing ~S^(k-1)/(k!(k-1)!) tuples (24 million at S = 512, k = 5) takes minutes and gigabytes."""
    g = np.zeros((k + 1, max_len + 1), np.int64)
    g[0, 0] = 1
    for m in (int(x) for x in present):
        for d in range(1, k + 1):
            g[d, m:] = np.minimum(g[d, m:] + g[d - 1, : max_len + 1 - m], cap)
    return int(min(g[1:, max_len].sum(), cap))


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
        # after `length`, at most depth-1 lengths <= length must make up rest - length, so length >= rest / depth:
        # the shorter candidates can never complete a row (pruning them keeps the order and the result)
        shortest = -(-rest // depth)
        cands = present[(present >= shortest) & (present <= min(last, rest - 1))]
        for length in cands[::-1]:
            extend(prefix + (int(length),), rest - int(length), depth - 1)

    extend((), max_len, k)
    return out


def nnlshp(histogram: np.ndarray, max_len: int, max_per_pack: int = 3, max_columns: int = 60000) -> Strategy:
    """Non-negative least squares histogram packing (Krell et al. 2021, §4.2), leftovers by LPFHP."""
    from scipy.optimize import nnls

    h = _checked_histogram(histogram, max_len, max_per_pack)
    present = np.nonzero(h[1:])[0] + 1
    # count before listing: at K >= 5 the list alone would take minutes and gigabytes before this refusal
    columns = _count_exact_combos(present, max_len, max_per_pack)
    if columns > max_columns:
        raise UserError(
            f"nnlshp would solve a least-squares problem with {columns} columns (over "
            f"{max_columns}); use --algorithm lpfhp or spfhp, or a smaller --max-per-pack"
        )
    combos = _exact_combos(present, max_len, max_per_pack) if columns else []
    counts = np.zeros(len(combos), np.int64)
    if combos:
        rows = present - 1
        A = np.zeros((len(present), len(combos)))  # (L, J): how often each present length occurs in combo j
        where = {int(length): i for i, length in enumerate(present)}
        for j, combo in enumerate(combos):
            for length in combo:
                A[where[length], j] += 1
        # Graphcore weights the very short lengths down: they are cheap to leave over and pad
        w = np.where(rows < 8, 0.09, 1.0)
        x, _ = nnls(A * w[:, None], h[present] * w, maxiter=50 * A.shape[1])
        # floor, but an integer that nnls returns with round-off (2.9999999999999996) counts as that integer: a
        # bare floor dropped one exact-fit pack of each such combination to the leftovers (75 of 411 on
        # WikiText-2 at S = 512, K = 3) and made the plan hinge on the last bit of the arithmetic
        counts = np.floor(x + (1e-6 + 1e-9 * x)).astype(np.int64)
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
    n, S = len(lengths), strategy.max_len
    if n and (lengths.min() < 1 or lengths.max() > S):
        raise ValueError(f"sample lengths must lie in 1..{S}; found {lengths.min()}..{lengths.max()}")
    key = lengths.astype(np.int16 if S < 2**15 else np.int32, copy=False)
    idx_dtype = np.int32 if n < 2**31 else np.int64
    perm = rng.permutation(n).astype(idx_dtype, copy=False)
    order = perm[np.argsort(key[perm], kind="stable")]  # sample indices grouped by length, random within
    # order[bounds[l] : bounds[l + 1]] are the samples of length l; cursor[l] is the next one not dealt yet.
    # The bound is kept apart from the cursors: comparing with cursor[l + 1], which moves as length l + 1 is
    # dealt, let a strategy that asks for too many of length l take samples of length l + 1 already used.
    bounds = np.zeros(S + 2, np.int64)
    bounds[1:] = np.cumsum(np.bincount(key, minlength=S + 1))
    cursor = bounds[:-1].copy()
    packs = np.full((strategy.packs, strategy.max_per_pack), -1, idx_dtype)
    row = 0
    for combo, count in zip(strategy.combos, strategy.counts):
        count = int(count)
        for slot, length in enumerate(combo):
            start = cursor[length]
            if start + count > bounds[length + 1]:
                raise ValueError(f"strategy needs more sequences of length {length} than there are")
            packs[row : row + count, slot] = order[start : start + count]
            cursor[length] = start + count
        row += count
    left = bounds[1:] - cursor  # (S+1,) samples of each length in no pack
    if left.any():
        raise ValueError(
            f"strategy leaves {int(left.sum())} sequences out of every pack (e.g. of length {int(np.argmax(left))})"
        )
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
