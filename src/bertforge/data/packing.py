"""Sequence packing (DESIGN §3.3): the packed shard writer (`bertforge pack`) and its metadata.

Pre-training rows are mostly padding at long sequence lengths (on Wikipedia at seq 512 about half of all
tokens). Packing puts up to K whole sequences into one row so that the model computes on real tokens; the
model keeps them apart with a block-diagonal attention mask (`attention_mask` = sequence index 1..k),
positions restarting at 0 per sequence, one NSP prediction per sequence read at its [CLS], and the masked-LM
positions shifted by each sequence's offset in the row.

The algorithms live in `bertforge.data.packing_algorithms`, the packed row layout in `bertforge.data.packing_rows`.

**Shards.** `pack_shards` makes two passes and never holds the dataset in memory (the existing packers load
everything and run out of RAM on Wikipedia): pass 1 reads only `input_mask` (the lengths) and the count of
real predictions of each row, in chunks; the plan (which samples go into which pack, which pack into which
output shard) is computed from these. Pass 2a streams every input shard once, in chunks, and appends each row
to the bucket file of the output shard that needs it (a bounded in-memory buffer in between); pass 2b turns
each bucket into one packed shard. Packs are shuffled (a seeded permutation), so every output shard mixes
sequences of all input shards. Outputs are written atomically and a re-run skips finished output shards.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from bertforge.data.packing_algorithms import ALGORITHMS, assign_packs, length_histogram, pack_histogram, plan_stats
from bertforge.data.packing_rows import build_packed_rows, mlm_width, prediction_counts, sample_lengths
from bertforge.data.shardset import KIND_ATTR, NVIDIA_KEYS, REMAKE, ShardSet, open_shard, read_json, reading
from bertforge.errors import UserError
from bertforge.runtime.io import output_dir, remove_stale, write_text
from bertforge.runtime.progress import Progress

METADATA = "packing.json"
"""Name of the metadata file beside the packed shards (the pretrain loader reads it)."""
WORK_DIR = ".pack_work"


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


def _plan_id(cfg: PackConfig, shards: ShardSet) -> str:
    key = json.dumps(
        {
            "algorithm": cfg.algorithm,
            "k": cfg.max_per_pack,
            "seed": cfg.seed,
            "shards": cfg.shards,
            "inputs": [[i.path.name, i.rows, i.path.stat().st_size] for i in shards.infos],
        },
        sort_keys=True,
    )
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _open_input(cfg: PackConfig) -> ShardSet:
    """The input shards, checked: masked (NVIDIA-kind) shards only, and valid settings."""
    if cfg.algorithm not in ALGORITHMS:
        raise UserError(f"unknown packing algorithm {cfg.algorithm!r}; choose one of {', '.join(ALGORITHMS)}")
    sizes = {"--max-per-pack": cfg.max_per_pack, "--chunk-rows": cfg.chunk_rows}
    if cfg.shards is not None:
        sizes["--shards"] = cfg.shards
    for flag, value in sizes.items():
        if value < 1:
            raise UserError(f"{flag} must be at least 1, not {value}")
    if cfg.max_per_pack > 127:  # input_mask holds the sequence index as int8 (DESIGN §3.3): 128 would wrap
        raise UserError(f"--max-per-pack must be at most 127 (input_mask is int8), not {cfg.max_per_pack}")
    if cfg.seed < 0:
        raise UserError(f"--seed must be at least 0, not {cfg.seed}")
    if cfg.buffer_mb < 0:  # 0: every row straight to its bucket file
        raise UserError(f"--buffer-mb must be at least 0, not {cfg.buffer_mb}")
    if Path(cfg.output_dir).resolve() == Path(cfg.input_dir).resolve():
        raise UserError("--out must differ from --in")
    _check_apart_from_shards(Path(cfg.output_dir))
    shards = ShardSet.open(cfg.input_dir, "--in")
    if shards.kind == "packed":
        raise UserError(f"{shards.files[0]} is already packed; pass the unpacked shards to --in")
    if shards.kind == "dynamic":
        raise UserError(
            f"{shards.files[0]} is a dynamic-masking shard (no masked_lm_positions): it is packed on "
            "the fly by the pretrain loader; `bertforge pack` needs masked shards"
        )
    if shards.kind == "mlm":
        raise UserError(
            f"{shards.files[0]} holds MLM-only rows, already full (only a shard's last row is short): there is "
            "nothing to pack; train on them as they are (data.pack_per_row also accepts them)"
        )
    if not shards.rows:
        raise UserError(f"the input shards ({shards.directory}) hold no rows; nothing to pack")
    return shards


def read_lengths(shards: ShardSet, chunk_rows: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """Pass 1: (lengths (N,), prediction counts (N,)) over all shards in order, reading only input_mask and
    masked_lm_positions, in chunks."""
    small = np.int16 if shards.seq_len < 2**15 else np.int32
    lengths, preds = [], []
    for info in shards.infos:
        with open_shard(info.path) as f, reading(info.path):
            mask, mpos = f["input_mask"], f["masked_lm_positions"]
            for a in range(0, info.rows, chunk_rows):
                lengths.append(sample_lengths(mask[a : a + chunk_rows]).astype(small))
                if not lengths[-1].all():  # named here: the histogram's range error could not say where
                    row = a + int(np.argmin(lengths[-1]))
                    raise UserError(f"shard {info.path} row {row} is empty (its input_mask is all 0); {REMAKE}")
                preds.append(prediction_counts(mpos[a : a + chunk_rows]).astype(np.int16))
    return np.concatenate(lengths), np.concatenate(preds)


def _shard_bounds(packs: int, shards: int) -> np.ndarray:
    return np.linspace(0, packs, shards + 1).round().astype(np.int64)


def _out_name(i: int) -> str:
    return f"packed_{i:05d}.hdf5"


_CARRIED = (
    "vocab",
    "vocab_file",
    "vocab_sha256",
    "vocab_size",
    "mask_id",
    "special_ids",
    "masked_lm_prob",
    "wwm",
    "split",
)
"""Manifest keys of the input that the packed directory carries over (vocab, masking), so it stands alone."""
_CARRY = NVIDIA_KEYS
"""The datasets a sample brings into its pack."""


@dataclass
class _Plan:
    """Pass 1's result: which samples go into which pack, which pack into which output shard."""

    packs: np.ndarray
    """(P, K) sample indices, -1 = empty slot."""
    width: int
    stats: dict[str, Any]
    strategy_seconds: float
    distinct_packs: int
    bounds: np.ndarray
    """(shards + 1,) pack index where each output shard starts."""
    names: list[str]
    todo: list[int]
    """Output shards not written yet."""
    dest: np.ndarray
    """(N,) output shard of every sample, -1 where that shard is finished."""
    packs_sha: str
    """Digest of `packs`: a resumed run checks that it recomputed the plan its finished shards were made from."""


def _plan(cfg: PackConfig, shards: ShardSet, out: Path, n_out: int, log: Callable[[str], None]) -> _Plan:
    lengths, preds = read_lengths(shards, cfg.chunk_rows)
    S = shards.seq_len
    t_alg = time.perf_counter()
    strategy = pack_histogram(length_histogram(lengths, S), S, cfg.max_per_pack, cfg.algorithm)
    t_alg = time.perf_counter() - t_alg
    packs = assign_packs(lengths, strategy, np.random.default_rng(cfg.seed))
    width = mlm_width(shards.max_pred, cfg.max_per_pack, preds, packs)
    stats = plan_stats(lengths, packs, S)
    log(
        f"pack: {stats['sequences']} sequences -> {stats['packs']} packs ({cfg.algorithm}, K={cfg.max_per_pack}, "
        f"efficiency {stats['packing_efficiency']:.2%}, strategy in {t_alg:.3f}s)"
    )
    if n_out > len(packs):  # the extra shards would be empty files, each a reader's open and nothing more
        given = f"--shards {n_out} is" if cfg.shards else f"the default --shards (one per input shard, {n_out}) is"
        raise UserError(f"{given} more than the {len(packs)} packs: give --shards {len(packs)} or fewer")
    bounds = _shard_bounds(len(packs), n_out)
    names = [_out_name(i) for i in range(n_out)]
    todo = [i for i in range(n_out) if not (out / names[i]).is_file()]
    dest = np.full(len(lengths), -1, np.int32)
    for i in todo:
        sel = packs[bounds[i] : bounds[i + 1]]
        dest[sel[sel >= 0]] = i
    packs_sha = hashlib.sha256(np.ascontiguousarray(packs).data).hexdigest()[:16]  # no copy: packs is contiguous
    return _Plan(packs, width, stats, t_alg, len(strategy.combos), bounds, names, todo, dest, packs_sha)


def _check_apart_from_shards(out: Path) -> None:
    """A reader of --out takes every shard in it: unpacked shards or their manifest.json there would mix two
    kinds in one directory (and the manifest would go stale), so that --out is refused before any work."""
    if not out.is_dir():
        return
    other = sorted(f.name for f in out.glob("*.hdf5") if not f.name.startswith((".", "packed_")))
    if (out / "manifest.json").is_file() or other:
        what = other[0] if other else "manifest.json"
        raise UserError(f"--out {out} holds {what} of unpacked shards or another step: choose an empty --out")


def _resume(out: Path, plan_id: str, log: Callable[[str], None]) -> dict[str, Any] | None:
    """The metadata of a finished run with the same plan (nothing to do), else None after preparing the work
    directory; a directory of another run is refused, so nothing already written is lost."""
    meta_path = out / METADATA
    if meta_path.is_file():
        meta = read_json(meta_path)
        if meta.get("plan_id") != plan_id:
            raise UserError(
                f"{out} holds packed shards of a different run (inputs or settings changed); delete it "
                "or choose another --out"
            )
        if all((out / n).is_file() for n in meta.get("shards", [])):
            log(f"pack: {out} is complete (same inputs and settings); nothing to do")
            return meta
    work = out / WORK_DIR
    plan_file = work / "plan.json"
    same_plan = plan_file.is_file() and read_json(plan_file).get("plan_id") == plan_id
    if not same_plan and not meta_path.is_file() and any(out.glob("packed_*.hdf5")):
        raise UserError(
            f"{out} holds packed shards of an unfinished run with other inputs or settings; delete "
            "it or choose another --out"
        )
    if not same_plan and work.exists():
        shutil.rmtree(work)  # buckets of another plan are of no use
    work.mkdir(exist_ok=True)
    if not same_plan:  # a same plan's file keeps the digest of its packs (_check_same_packs)
        write_text(plan_file, json.dumps({"plan_id": plan_id}))
    return None


def _check_same_packs(out: Path, plan: _Plan, plan_id: str, algorithm: str) -> None:
    """A UserError unless the packs this run computed are those its finished output shards were made from.

    The plan is recomputed on a resume; the same inputs and settings give the same plan only with the same
    code and libraries (nnlshp's least squares comes from scipy): another plan's shards beside this one's
    would hold some sequences twice and others not at all. Buckets of another plan are remade."""
    work = out / WORK_DIR
    plan_file, meta_path = work / "plan.json", out / METADATA
    known = read_json(plan_file).get("packs_sha") if plan_file.is_file() else None
    if known is None and meta_path.is_file():
        known = read_json(meta_path).get("packs_sha")
    if known is None and algorithm == "nnlshp" and len(plan.todo) < len(plan.names):
        # written before the digest existed, and nnlshp's rounding has changed since: its shards cannot be checked
        raise UserError(
            f"{out} holds packed shards of an unfinished nnlshp run of an earlier bertforge, whose plan this one "
            "cannot check (its rounding has changed since): delete it and pack again, or choose another --out"
        )
    if known is not None and known != plan.packs_sha:
        if len(plan.todo) < len(plan.names):
            raise UserError(
                f"{out} holds packed shards of another plan than this run computes from the same inputs and "
                "settings (another version of bertforge, numpy or scipy?): delete it or choose another --out"
            )
        (work / "buckets.done").unlink(missing_ok=True)
    write_text(plan_file, json.dumps({"plan_id": plan_id, "packs_sha": plan.packs_sha}))


def _append_bucket(path: Path, rows: dict[str, list[np.ndarray]]) -> None:
    with h5py.File(path, "a") as f:
        for name, parts in rows.items():
            arr = np.concatenate(parts)
            if name not in f:
                f.create_dataset(name, data=arr, maxshape=(None,) + arr.shape[1:], chunks=True, compression="lzf")
            else:
                d = f[name]
                d.resize(d.shape[0] + len(arr), axis=0)
                d[-len(arr) :] = arr


def _bucket_rows(
    shards: ShardSet, dest: np.ndarray, todo: list[int], work: Path, cfg: PackConfig, log: Callable[[str], None]
) -> None:
    """Pass 2a: stream the inputs once, appending each row to the bucket file of its output shard (a bounded
    buffer in between); a finished pass leaves `buckets.done`. Finished buckets are reused only when every
    output shard still to write has its bucket: pass 2b removes a bucket once its shard is written, so a shard
    deleted after a killed run would otherwise find no bucket to be made from."""
    done_marker = work / "buckets.done"
    if done_marker.is_file() and all((work / f"bucket_{i:05d}.h5").is_file() for i in todo):
        return
    done_marker.unlink(missing_ok=True)  # first: a run killed while remaking the buckets must not trust them
    for p in work.glob("bucket_*.h5"):
        p.unlink()
    buf: dict[int, dict[str, list[np.ndarray]]] = defaultdict(lambda: defaultdict(list))
    buffered, limit, start = 0, cfg.buffer_mb << 20, 0
    progress = Progress("pack: reading", sum(info.rows for info in shards.infos), "rows", log)

    def flush() -> None:
        for i, parts in buf.items():
            _append_bucket(work / f"bucket_{i:05d}.h5", parts)
        buf.clear()

    for info in shards.infos:
        with open_shard(info.path) as f, reading(info.path):
            for a in range(0, info.rows, cfg.chunk_rows):
                b = min(info.rows, a + cfg.chunk_rows)
                progress.update(b - a)
                d = dest[start + a : start + b]
                if (d < 0).all():
                    continue
                chunk = {k: f[k][a:b] for k in _CARRY}
                chunk["gid"] = np.arange(start + a, start + b, dtype=np.int64)
                order = np.argsort(d, kind="stable")
                for part in np.split(order, np.flatnonzero(np.diff(d[order])) + 1):  # one part per output shard
                    i = int(d[part[0]])
                    if i < 0:
                        continue
                    for k, v in chunk.items():
                        buf[i][k].append(v[part])
                        buffered += v[part].nbytes
                if buffered > limit:
                    flush()
                    buffered = 0
        start += info.rows
    flush()
    done_marker.write_text("ok")


def _bucket_samples(bucket: Path, sel: np.ndarray, S: int, max_pred: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The samples of one output shard from its bucket, in the bucket's order, and `sel` (packs, global sample
    indices) as indices into them (-1 stays -1)."""
    if len(sel) == 0:
        widths = {
            "input_ids": (S,),
            "input_mask": (S,),
            "segment_ids": (S,),
            "masked_lm_positions": (max_pred,),
            "masked_lm_ids": (max_pred,),
            "next_sentence_labels": (),
        }
        return {k: np.zeros((0,) + widths[k], np.int32) for k in _CARRY}, sel
    with h5py.File(bucket, "r") as f:
        samples = {k: f[k][()] for k in _CARRY}
        gid = f["gid"][()]
    # look the samples up through a sorted view of their ids instead of sorting the samples themselves: that
    # copy was a second bucket in memory (build_packed_rows gathers by index, any order will do)
    order = np.argsort(gid)
    at = np.minimum(np.searchsorted(gid[order], np.maximum(sel, 0)), len(gid) - 1)  # clipped: a missing id
    local = np.where(sel >= 0, order[at], -1)
    if not np.array_equal(gid[local[sel >= 0]], sel[sel >= 0]):
        raise UserError(f"bucket {bucket} is incomplete; delete {bucket.parent} and re-run")
    return samples, local


def _write_packed(cfg: PackConfig, shards: ShardSet, plan: _Plan, out: Path, log: Callable[[str], None]) -> None:
    """Pass 2b: one bucket -> one packed shard, for every output shard not written yet."""
    from bertforge.data.shards import write_shard

    attrs = {
        KIND_ATTR: "packed",
        "algorithm": cfg.algorithm,
        "max_per_pack": cfg.max_per_pack,
        "seq_len": shards.seq_len,
        "max_pred": shards.max_pred,
        "mlm_width": plan.width,
    }
    progress = Progress("pack", len(plan.todo), "shards", log, every_s=0)
    for i in plan.todo:
        sel = plan.packs[plan.bounds[i] : plan.bounds[i + 1]]
        bucket = out / WORK_DIR / f"bucket_{i:05d}.h5"
        samples, local = _bucket_samples(bucket, sel, shards.seq_len, shards.max_pred)
        write_shard(out / plan.names[i], build_packed_rows(samples, local, plan.width), attrs=attrs)
        bucket.unlink(missing_ok=True)
        progress.update(note=f"wrote {plan.names[i]} ({len(sel)} packs)")


def _write_metadata(cfg: PackConfig, shards: ShardSet, plan: _Plan, plan_id: str, out: Path) -> dict[str, Any]:
    """packing.json: the packing figures the trainer reads (avg_seq_per_sample) and what it needs from the
    input's manifest (vocab, masking), so the packed directory stands alone."""
    source = shards.manifest
    meta = {
        **{k: source[k] for k in _CARRIED if k in source},
        "algorithm": cfg.algorithm,
        "max_per_pack": cfg.max_per_pack,
        "k_max": cfg.max_per_pack,
        "seq_len": shards.seq_len,
        "max_pred": shards.max_pred,
        "mlm_width": plan.width,
        "seed": cfg.seed,
        **plan.stats,
        "strategy_seconds": plan.strategy_seconds,
        "distinct_packs": plan.distinct_packs,
        "input_dir": str(shards.directory),
        "input_shards": [p.name for p in shards.files],
        "shards": plan.names,
        "plan_id": plan_id,
        "packs_sha": plan.packs_sha,
    }
    write_text(out / METADATA, json.dumps(meta, indent=2) + "\n")
    return meta


def pack_shards(cfg: PackConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Pack the shards of cfg.input_dir into cfg.output_dir; returns the metadata (also in packing.json)."""
    t0 = time.perf_counter()
    shards = _open_input(cfg)
    with output_dir(cfg.output_dir) as out:
        remove_stale(out)  # a half-written shard of a killed run
        n_out = cfg.shards or len(shards.files)
        plan_id = _plan_id(dataclasses.replace(cfg, shards=n_out), shards)
        done = _resume(out, plan_id, log)
        if done is not None:
            return done
        try:
            plan = _plan(cfg, shards, out, n_out, log)
            _check_same_packs(out, plan, plan_id, cfg.algorithm)
            if plan.todo:
                _bucket_rows(shards, plan.dest, plan.todo, out / WORK_DIR, cfg, log)
        except UserError:
            # a refused plan (its work dir kept --out from being removed) or unfinished buckets: a re-run starts over
            shutil.rmtree(out / WORK_DIR, ignore_errors=True)
            raise
        _write_packed(cfg, shards, plan, out, log)
        meta = _write_metadata(cfg, shards, plan, plan_id, out)
    shutil.rmtree(out / WORK_DIR, ignore_errors=True)
    log(f"pack: done in {time.perf_counter() - t0:.1f}s; {out / METADATA}")
    return meta
