"""The pre-training data loader: HDF5 shards → micro-batches, per rank, resumable, in worker processes.

Reads the shard kinds of DESIGN §3.2/§3.3: NVIDIA-format (masks stored), dynamic-masking (unmasked pairs) and
MLM-only rows (unmasked, no NSP label) — both masked here, a fresh draw every epoch, with `instances.mask_tokens`
at a configurable rate and replacement split — and packed (several sequences per row).
What the shards are — files, kind, row counts, widths, masking parameters — comes from their
`bertforge.data.shardset.ShardSet` (`PretrainLoader.shards`); this module only reads rows.

**Lanes.** An update consumes `lanes = global_batch / micro_batch` micro-batches. Each lane is an endless,
deterministic stream of rows; rank r owns lanes [r·accum, (r+1)·accum) and takes one micro-batch from each per
update. The lanes, and so the data of every update, depend only on the seed and the shard set — not on the
world size — which is why 2 processes with accumulation 1 see exactly what 1 process with accumulation 2 sees.
Every lane reads only its own pieces (whole shards, or row ranges of shards when there are fewer shards than
lanes): each rank reads its own part of the data.

**Order.** For lane l in its epoch e: its pieces in a seeded random order; each piece read in chunks of
`chunk_rows` contiguous rows (one HDF5 slice read: gzip chunks are decompressed once, never per row), chunks in
a seeded random order, rows shuffled within the chunk.

**Resume.** The cursor is one integer: micro-batches taken per lane (every update takes one from each lane,
skipped non-finite updates too). Position (epoch, offset) is recomputed from it and the shard row counts;
nothing is pickled.

**Workers.** `PretrainLoader` wraps an IterableDataset in `torch.utils.data.DataLoader`: worker w builds the
rank's items w, w+W, w+2W, … and the DataLoader returns them in order, prefetching `prefetch` per worker.
"""

from __future__ import annotations

import bisect
import functools
import os
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertforge.data.instances import REPLACE_SPLIT, check_replace_split, mask_tokens, num_to_predict
from bertforge.data.packing_rows import PACKED_INPUTS, pack_samples
from bertforge.data.shardset import LOADER_MASKED, ROW_KEYS, ShardSet, check_values, reading
from bertforge.errors import UserError
from bertforge.runtime.signals import stop_signals_held, worker_leaves_stopping_to


@dataclass
class Piece:
    shard: int
    start: int
    stop: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


def assign_pieces(rows: list[int], lanes: int) -> list[list[Piece]]:
    """Split shards into pieces and deal them to lanes. Shard counts that divide (or are divided by) the lanes,
    in shards of about one size, are dealt as runs always have been: whole shards round-robin when there are at
    least as many shards as lanes, else each shard cut into ceil(lanes / shards) contiguous row ranges. Where
    that leaves lanes more than 1% apart in rows (3 shards for 2 lanes: 200 rows against 100), every lane takes
    an equal contiguous share of all the rows instead: each lane starts its next pass when its rows run out,
    so a smaller lane's rows would be read more often than the others' for the whole run."""
    out = _dealt(rows, lanes)
    sizes = [sum(p.rows for p in lane) for lane in out]
    if max(sizes) - min(sizes) > max(1, min(sizes) // 100):
        out = _equal_shares(rows, lanes)
    if any(not lane for lane in out):
        raise UserError(
            f"{sum(rows)} rows in {len(rows)} shards are too few for {lanes} data lanes "
            "(global batch / micro batch); use more data or a larger micro batch"
        )
    return out


def _dealt(rows: list[int], lanes: int) -> list[list[Piece]]:
    """Whole shards, or each cut into ceil(lanes / shards) parts, dealt round-robin."""
    parts = max(1, -(-lanes // len(rows)))
    pieces = []
    for s, n in enumerate(rows):
        bounds = [n * i // parts for i in range(parts + 1)]
        pieces += [Piece(s, a, b) for a, b in zip(bounds, bounds[1:]) if b > a]
    out: list[list[Piece]] = [[] for _ in range(lanes)]
    for i, p in enumerate(pieces):
        out[i % lanes].append(p)
    return out


def _equal_shares(rows: list[int], lanes: int) -> list[list[Piece]]:
    """Lane l takes rows [total * l // lanes, total * (l + 1) // lanes) of the shards laid end to end: equal to
    a row, in at most shards + lanes pieces."""
    starts = np.concatenate([[0], np.cumsum(rows)])  # (shards + 1,) where each shard begins in the whole
    total = int(starts[-1])
    out: list[list[Piece]] = []
    for lane in range(lanes):
        a, b = total * lane // lanes, total * (lane + 1) // lanes
        first = int(np.searchsorted(starts, a, side="right")) - 1
        pieces = []
        for s in range(first, len(rows)):
            lo, hi = max(a, int(starts[s])), min(b, int(starts[s + 1]))
            if lo >= b:
                break
            if hi > lo:
                pieces.append(Piece(s, lo - int(starts[s]), hi - int(starts[s])))
        out.append(pieces)
    return out


@dataclass
class LaneEpoch:
    """The row order of one lane in one epoch: a list of (shard, chunk_start, chunk_stop, row permutation)."""

    chunks: list[tuple[int, int, int, np.ndarray]]
    offsets: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        total = 0
        self.offsets = []
        for c in self.chunks:
            self.offsets.append(total)
            total += c[2] - c[1]
        self.rows = total

    def locate(self, i: int) -> tuple[int, int]:
        """(chunk index, row within the chunk's shuffled order) of the i-th row of this epoch."""
        k = bisect.bisect_right(self.offsets, i) - 1
        return k, i - self.offsets[k]


def lane_epoch(pieces: list[Piece], seed: int, lane: int, epoch: int, chunk_rows: int, shuffle: bool) -> LaneEpoch:
    rng = np.random.default_rng([seed, lane, epoch])
    order = rng.permutation(len(pieces)) if shuffle else np.arange(len(pieces))
    chunks = []
    for i in order:
        p = pieces[i]
        starts = list(range(p.start, p.stop, chunk_rows))
        c_order = rng.permutation(len(starts)) if shuffle else np.arange(len(starts))
        for c in c_order:
            a = starts[c]
            b = min(a + chunk_rows, p.stop)
            perm = rng.permutation(b - a) if shuffle else np.arange(b - a)
            chunks.append((p.shard, a, b, perm))
    return LaneEpoch(chunks)


@dataclass
class LoaderSpec:
    """Everything a worker needs to rebuild the stream (plain data: cheap to send to worker processes)."""

    files: list[str]
    rows: list[int]
    kind: str
    lanes: list[list[Piece]]
    my_lanes: list[int]
    micro_batch: int
    seed: int
    chunk_rows: int = 2048
    shuffle: bool = True
    vocab_size: int = 30522
    max_pred: int = 20
    masked_lm_prob: float = 0.15
    special_ids: tuple[int, ...] = (0, 101, 102)
    mask_id: int = 103
    wwm: bool = False
    mask_split: tuple[float, float] = REPLACE_SPLIT
    """(P([MASK]), P(random token)) of a masked position; it keeps its token otherwise (80/10/10)."""
    pack_per_row: int = 0
    """Shards masked here (dynamic, mlm) only: pack each micro-batch window of sequences on the fly into rows of
    at most this many sequences (the histogram algorithms of `bertforge.data.packing`); 0 = no packing."""


MAX_OPEN_SHARDS = 32
"""Shard files a process keeps open at once (see OpenShards)."""


class OpenShards:
    """The open HDF5 files of one process's lane readers, at most `limit` at once, the least recently used closed
    first. Kept open for good, a worker would hold every shard of its lanes by the end of an epoch: NVIDIA and
    MLPerf data come in 2048-4320 shards, past the usual open-file limit (`ulimit -n`, 1024). Reopening costs
    ~0.2 ms against ~20 ms to read a chunk of 2048 rows."""

    def __init__(self, limit: int | None = None):
        self.limit = limit or MAX_OPEN_SHARDS
        self._open: OrderedDict[str, Any] = OrderedDict()

    def get(self, path: str) -> Any:
        h = self._open.pop(path, None)
        if h is None:
            import h5py

            while len(self._open) >= self.limit:
                self._open.popitem(last=False)[1].close()
            h = h5py.File(path, "r")
        self._open[path] = h  # now the most recently used
        return h

    def close(self) -> None:
        for h in self._open.values():
            h.close()
        self._open.clear()


class LaneReader:
    """Reads rows of one lane by global position; caches the last chunk it decompressed. `files`: the open
    shards it shares with the other readers of its process (its own when None)."""

    def __init__(self, spec: LoaderSpec, lane: int, files: OpenShards | None = None):
        self.spec, self.lane = spec, lane
        self._epochs: dict[int, LaneEpoch] = {}
        self._cache: tuple[tuple[int, int, int], dict[str, np.ndarray]] | None = None
        self._own_files = files is None
        self._files = OpenShards() if files is None else files
        self.epoch_rows = sum(p.rows for p in spec.lanes[lane])

    def _epoch(self, e: int) -> LaneEpoch:
        if e not in self._epochs:
            if len(self._epochs) > 2:
                self._epochs.pop(min(self._epochs))
            self._epochs[e] = lane_epoch(
                self.spec.lanes[self.lane], self.spec.seed, self.lane, e, self.spec.chunk_rows, self.spec.shuffle
            )
        return self._epochs[e]

    def _chunk(self, shard: int, a: int, b: int) -> dict[str, np.ndarray]:
        key = (shard, a, b)
        if self._cache is None or self._cache[0] != key:
            with reading(self.spec.files[shard]):  # a damaged shard: one line naming it
                h = self._files.get(self.spec.files[shard])
                arrays = {k: h[k][a:b] for k in h if k in ROW_KEYS}
            # every row, once per chunk read (vectorised: small next to the decompression): a bad id or position
            # is one line naming the shard and row, not an index error in the model
            check_values(self.spec.files[shard], arrays, a, self.spec.vocab_size)
            self._cache = (key, arrays)
        return self._cache[1]

    def rows(self, start: int, n: int) -> list[tuple[dict[str, np.ndarray], int, tuple[int, int, int]]]:
        """Rows start..start+n of the lane's endless stream: (chunk arrays, index in chunk, (epoch, shard, row))."""
        out = []
        for g in range(start, start + n):
            e, i = divmod(g, self.epoch_rows)
            ep = self._epoch(e)
            k, j = ep.locate(i)
            shard, a, b, perm = ep.chunks[k]
            arrays = self._chunk(shard, a, b)
            out.append((arrays, int(perm[j]), (e, shard, a + int(perm[j]))))
        return out

    def close(self) -> None:
        if self._own_files:
            self._files.close()


def collate(
    spec: LoaderSpec, rows: list[tuple[dict[str, np.ndarray], int, tuple[int, int, int]]]
) -> dict[str, torch.Tensor]:
    """Rows → model inputs (the names of `bertforge.model`'s forward), int64 tensors. MLM-only rows carry no
    NSP labels (the batch has no `nsp_labels`)."""

    def stack(key: str) -> np.ndarray:
        return np.stack([arr[key][i] for arr, i, _ in rows])

    if spec.kind in LOADER_MASKED:
        batch = _masked_batch(spec, rows, stack)
    elif spec.kind == "packed":
        batch = _packed_batch(stack)
    else:
        batch = {
            "input_ids": stack("input_ids"),
            "attention_mask": stack("input_mask"),
            "token_type_ids": stack("segment_ids"),
            "masked_positions": stack("masked_lm_positions"),
            "masked_labels": stack("masked_lm_ids"),
            "nsp_labels": stack("next_sentence_labels"),
        }
    return {k: torch.from_numpy(np.ascontiguousarray(v).astype(np.int64)) for k, v in batch.items()}


def _masked_batch(spec: LoaderSpec, rows, stack) -> dict[str, np.ndarray]:
    """Unmasked rows (dynamic pairs, MLM-only rows) masked now, then packed when spec.pack_per_row."""
    ids = stack("input_ids").astype(np.int64)
    P = spec.max_pred
    pos = np.zeros((len(rows), P), np.int64)
    lab = np.zeros((len(rows), P), np.int64)
    for r, (arr, i, (e, shard, row)) in enumerate(rows):
        # a fresh mask every epoch, the same on every run and resume: the rng is a function of
        # (seed, epoch, shard, row), never of what was drawn before
        rng = np.random.default_rng([spec.seed, e, shard, row])
        n = int((arr["input_mask"][i] != 0).sum())
        ws = arr["word_starts"][i] if spec.wwm and "word_starts" in arr else None
        masked, p, l = mask_tokens(
            ids[r],
            rng,
            spec.vocab_size,
            P,
            spec.masked_lm_prob,
            special_ids=spec.special_ids,
            word_starts=ws,
            mask_id=spec.mask_id,
            length=n,
            split=spec.mask_split,
        )
        ids[r] = masked
        pos[r, : len(p)] = p
        lab[r, : len(l)] = l
    mlm_only = spec.kind == "mlm"
    nsp = np.zeros(len(rows), np.int8) if mlm_only else stack("next_sentence_labels")
    batch = {
        "input_ids": ids,
        "attention_mask": stack("input_mask"),
        "token_type_ids": stack("segment_ids"),
        "masked_positions": pos,
        "masked_labels": lab,
        "nsp_labels": nsp,
    }
    if spec.pack_per_row:
        # packing + dynamic masking: the freshly masked window is packed like a packed shard's rows, so the
        # micro-batch keeps its sequences (an update sees exactly the global batch) in fewer rows
        e, shard, row = rows[0][2]
        packed = pack_samples(
            {
                "input_ids": ids,
                "input_mask": batch["attention_mask"],
                "segment_ids": batch["token_type_ids"],
                "masked_lm_positions": pos,
                "masked_lm_ids": lab,
                "next_sentence_labels": nsp,
            },
            spec.pack_per_row,
            rng=np.random.default_rng([spec.seed, e, shard, row, 1]),
        )
        batch = _packed_batch(lambda key: packed[key])
    if mlm_only:  # no NSP: the model gets no NSP inputs
        batch.pop("nsp_labels")
        batch.pop("nsp_positions", None)
    return batch


def _packed_batch(get) -> dict[str, np.ndarray]:
    """Packed-schema arrays (DESIGN §3.3) -> the model's input names; empty NSP slots get label -1."""
    batch = {ours: get(field) for ours, field in PACKED_INPUTS.items()}
    batch["nsp_labels"] = np.where(get("next_sentence_weights") > 0, get("next_sentence_labels"), -1)
    return batch


class _RankStream(torch.utils.data.IterableDataset):
    """Item k of a rank is lane my_lanes[k % accum]'s micro-batch number start + k // accum."""

    def __init__(self, spec: LoaderSpec, start_batch: int):
        super().__init__()
        self.spec, self.start = spec, start_batch

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = torch.utils.data.get_worker_info()
        wid, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        accum = len(self.spec.my_lanes)
        files = OpenShards()  # one bound for all lanes: a rank may have hundreds (global / micro batch)
        readers = [LaneReader(self.spec, lane, files) for lane in self.spec.my_lanes]
        m = self.spec.micro_batch
        try:
            k = wid
            while True:
                j, b = k % accum, self.start + k // accum
                yield collate(self.spec, readers[j].rows(b * m, m))
                k += nw
        finally:
            files.close()


class PretrainLoader:
    """Micro-batches for this rank, `accum` per update, from update number `start_batch` on.

    loader = PretrainLoader.from_dir(dir, global_batch=256, micro_batch=32, rank=0, world_size=2, seed=1)
    it = loader.iterate(start_batch=cursor)
    for step: micro_batches = [next(it) for _ in range(loader.accum)]
    """

    def __init__(self, spec: LoaderSpec, shards: ShardSet, num_workers: int = 2, prefetch: int = 4):
        self.spec, self.shards, self.num_workers, self.prefetch = spec, shards, num_workers, prefetch
        self.pin_memory = False
        """Page-locked batches (the training loop sets it on CUDA: non-blocking copies overlap the step)."""
        self.segments = False
        """Batches carry `cu_seqlens` (`with_segments`; the training loop decides)."""

    @property
    def accum(self) -> int:
        return len(self.spec.my_lanes)

    @classmethod
    def from_dir(
        cls,
        directory: str | Path | ShardSet,
        global_batch: int,
        micro_batch: int,
        rank: int,
        world_size: int,
        seed: int,
        num_workers: int = 2,
        prefetch: int = 4,
        chunk_rows: int = 2048,
        vocab_size: int | None = None,
        max_pred: int | None = None,
        pack_per_row: int = 0,
        mlm_probability: float | None = None,
        mask_split: tuple[float, float] = REPLACE_SPLIT,
    ) -> PretrainLoader:
        """`directory`: a shard directory or its `ShardSet`. `vocab_size`: the data's vocab rows, the bound of
        dynamic masking's random words and of the id check (None: the shards' vocab, `_spec`). `mlm_probability` and
        `mask_split`: the masking rate (None: the shards' own) and replacement split of shards masked here (see
        `masking_overrides`)."""
        shards = directory if isinstance(directory, ShardSet) else ShardSet.open(directory)
        if pack_per_row and shards.kind not in LOADER_MASKED:
            from bertforge.errors import ConfigError

            raise ConfigError(
                f"data.pack_per_row packs dynamic-masking and MLM-only shards on the fly, but {shards.directory} "
                f"holds {shards.kind} shards: pack those once with `bertforge pack`, or set it to 0"
            )
        accum = batch_arithmetic(global_batch, micro_batch, world_size)
        n_lanes = accum * world_size
        rows = [i.rows for i in shards.infos]
        spec = _spec(
            shards,
            lanes=assign_pieces(rows, n_lanes),
            my_lanes=list(range(rank * accum, (rank + 1) * accum)),
            micro_batch=micro_batch,
            seed=seed,
            chunk_rows=chunk_rows,
            vocab_size=vocab_size,
            pack_per_row=pack_per_row,
            max_pred=max_pred,
            masking=masking_overrides(shards, mlm_probability, mask_split),
        )
        return cls(spec, shards, num_workers, prefetch)

    @property
    def kind(self) -> str:
        return self.spec.kind

    def iterate(self, start_batch: int = 0) -> Iterator[dict[str, torch.Tensor]]:
        return batch_stream(
            _RankStream(self.spec, start_batch),
            self.num_workers,
            self.prefetch,
            self.spec.seed,
            self.pin_memory,
            self.segments,
        )


def batch_stream(
    dataset: torch.utils.data.IterableDataset,
    num_workers: int,
    prefetch: int,
    seed: int,
    pin_memory: bool = False,
    segments: bool = False,
) -> Iterator[dict[str, torch.Tensor]]:
    """The micro-batches of `dataset` (an IterableDataset that yields them in order), made in `num_workers`
    processes with `prefetch` each ahead — the next batches are ready while the step runs — or, with 0, here
    when asked for. `pin_memory`: page-locked host tensors, so the step's non-blocking copies to the GPU
    overlap with compute (the DataLoader pins in a thread of its own). `segments`: each batch also carries
    `cu_seqlens` (`with_segments`), made where the batch is."""
    if segments:
        dataset = _WithSegments(dataset)
    if num_workers == 0:
        batches = iter(dataset)
        return ({k: v.pin_memory() for k, v in b.items()} for b in batches) if pin_memory else batches
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=None,
        num_workers=num_workers,
        prefetch_factor=prefetch,
        persistent_workers=False,
        pin_memory=pin_memory,
        # its own generator: creating the iterator must not draw from the global RNG that dropout uses
        # (exact resume)
        generator=torch.Generator().manual_seed(seed),
        multiprocessing_context="fork" if _can_fork() else None,
        worker_init_fn=functools.partial(worker_leaves_stopping_to, os.getpid()),
    )
    with stop_signals_held():  # the workers start here, and inherit the mask until their init function runs
        return iter(loader)


def with_segments(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The batch plus `cu_seqlens`, the segments of its attention mask (`model.attention.segment_bounds`): with
    them the model runs the flash kernel on fixed shapes, with no host sync (packed or compiled steps on CUDA)."""
    from bertforge.model.attention import segment_bounds

    return {**batch, "cu_seqlens": segment_bounds(batch["attention_mask"])}


class _WithSegments(torch.utils.data.IterableDataset):
    """`dataset`'s batches `with_segments`, computed in the worker that makes them."""

    def __init__(self, dataset: torch.utils.data.IterableDataset):
        super().__init__()
        self.dataset = dataset

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return (with_segments(b) for b in self.dataset)


def _can_fork() -> bool:
    import multiprocessing as mp

    return "fork" in mp.get_all_start_methods()


def _spec(
    shards: ShardSet, max_pred: int | None = None, masking: dict[str, Any] | None = None, **kw: Any
) -> LoaderSpec:
    """The loader's plain-data spec over `shards`; a dynamic shard's masking parameters fill in the defaults,
    `masking` (from `masking_overrides`) overrides them."""
    shards.check_datasets()  # a missing dataset: one line now, not a KeyError in collate
    # no vocab_size: the shards' own (manifest, a dynamic shard's attribute), else BERT's 30522. A fixed 30522 drew
    # dynamic masking's random words past a smaller data vocab: ids a model sized from the shards has no row for
    if kw.get("vocab_size") is None:
        kw["vocab_size"] = shards.vocab_size or 30522
    return LoaderSpec(
        files=[str(f) for f in shards.files],
        rows=[i.rows for i in shards.infos],
        kind=shards.kind,
        **kw,
        **{"max_pred": max_pred or shards.max_pred or 20, **shards.masking_params(), **(masking or {})},
    )


def masking_overrides(
    shards: ShardSet, mlm_probability: float | None, mask_split: tuple[float, float] = REPLACE_SPLIT
) -> dict[str, Any]:
    """The LoaderSpec fields that data.mlm_probability and the replacement split set for `shards`: the rate, the
    split, and the masked-LM slots. At the shards' own rate the slots are the shards' max_pred, the cap of
    Google's rule (min(max_pred, round(length x rate))), as static masking applies it; a rate given in
    data.mlm_probability widens them to a full row's round(seq_len x rate), so the shards' cap does not bind it.
    Shards masked at creation take neither (a UserError unless both are the defaults)."""
    split = (float(mask_split[0]), float(mask_split[1]))
    if shards.kind not in LOADER_MASKED:
        if mlm_probability is not None or split != REPLACE_SPLIT:
            raise UserError(
                "data.mlm_probability / data.eval_mlm_probability / data.mask_replace_prob / data.random_replace_prob "
                f"set how the loader masks, but {shards.directory} holds {shards.kind} shards whose masks were drawn "
                "when they were written: build shards with --dynamic-masking or --objective mlm, or leave those keys "
                "unset"
            )
        return {}
    check_replace_split(split)
    rate = mlm_probability if mlm_probability is not None else shards.masking_params().get("masked_lm_prob", 0.15)
    full_row = int(num_to_predict(shards.seq_len, shards.seq_len, rate))
    slots = max(shards.max_pred or 20, full_row) if mlm_probability is not None else shards.max_pred or full_row
    return {"masked_lm_prob": float(rate), "mask_split": split, "max_pred": slots}


def batch_arithmetic(global_batch: int, micro_batch: int, world_size: int) -> int:
    """Accumulation steps = global / (micro × world); a global batch that does not divide is an error."""
    if global_batch % (micro_batch * world_size):
        raise UserError(
            f"train.global_batch_size {global_batch} is not a multiple of train.micro_batch_size {micro_batch} x "
            f"{world_size} processes = {micro_batch * world_size}; change the global or micro batch size"
        )
    return global_batch // (micro_batch * world_size)


def eval_batches(
    directory: str | Path | ShardSet,
    batch_size: int,
    rank: int = 0,
    world_size: int = 1,
    max_batches: int | None = None,
    vocab_size: int | None = None,
    seed: int = 0,
    mlm_probability: float | None = None,
    mask_split: tuple[float, float] = REPLACE_SPLIT,
) -> Iterator[dict[str, torch.Tensor]]:
    """Held-out batches in file order (no shuffle), rank r taking batches r, r+W, … (for periodic evaluation).
    Eval shards masked here are masked with a fixed seed, so every evaluation sees the same masks, at the
    training run's rate and split; `vocab_size` as in `PretrainLoader.from_dir`."""
    shards = directory if isinstance(directory, ShardSet) else ShardSet.open(directory)
    spec = _spec(
        shards,
        masking=masking_overrides(shards, mlm_probability, mask_split),
        lanes=[[Piece(s, 0, i.rows) for s, i in enumerate(shards.infos)]],
        my_lanes=[0],
        micro_batch=batch_size,
        seed=seed,
        shuffle=False,
        vocab_size=vocab_size,
    )
    reader = LaneReader(spec, 0)
    total = -(-reader.epoch_rows // batch_size)
    if max_batches:
        total = min(total, max_batches)
    try:
        for b in range(rank, total, world_size):
            n = min(batch_size, reader.epoch_rows - b * batch_size)
            yield collate(spec, reader.rows(b * batch_size, n))
    finally:
        reader.close()
