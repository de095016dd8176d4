"""Writing HDF5 pre-training shards (and reading one whole); what a shard directory holds — kind, schema,
manifest, widths — is `bertforge.data.shardset`'s to say.

NVIDIA/Habana shards (what `create_pretraining_data.py` + NVIDIA's `hdf5` writer produce), N rows:

    input_ids              int32 [N, S]  0-padded
    input_mask             int8  [N, S]  1 = real token
    segment_ids            int8  [N, S]
    masked_lm_positions    int32 [N, P]  0-padded (position 0 is always [CLS], so 0 = empty slot)
    masked_lm_ids          int32 [N, P]  0-padded
    next_sentence_labels   int8  [N]     1 = random next, 0 = is next

Dynamic-masking shards (ours, `bertforge data shards --dynamic-masking`) hold the unmasked pairs: the first
three datasets above plus `next_sentence_labels`, optionally `word_starts` int8 [N, S] (1 = the token starts
a whole word, for whole-word masking), and the file attribute `bertforge_kind = "dynamic"` together with the
masking parameters (`vocab_size`, `max_pred`, `masked_lm_prob`, `cls_id`, `sep_id`, `pad_id`, `mask_id`, `wwm`).

Packed shards (DESIGN §3.3, written by `bertforge pack`) are recognised by `next_sentence_positions` or the
attribute `bertforge_kind = "packed"`.

Every shard is written to a temporary name in the same directory and renamed into place, so a killed run
never leaves a file that looks finished. A `manifest.json` beside the shards records the parameters, the
counts, the vocab hash and a sha256 per shard.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from bertforge.data.shardset import KIND_ATTR, MANIFEST, open_shard, reading  # noqa: F401 (KIND_ATTR: the writers' name)
from bertforge.errors import UserError
from bertforge.runtime.io import commit, raise_if_disk_full, temp_name, write_text
from bertforge.runtime.signals import redeliver_interrupt


def write_shard(
    path: str | os.PathLike,
    arrays: Mapping[str, np.ndarray],
    attrs: Mapping[str, Any] | None = None,
    compression_level: int = 1,
) -> Path:
    """Write `arrays` as gzip-compressed datasets (in the given order) atomically; returns the path.

    Datasets are written without creation timestamps, so the same arrays give byte-identical files.
    gzip level 1: the data are small integers that compress well even at the fastest level.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(path)
    try:
        with h5py.File(tmp, "w", track_order=True) as f:
            for name, arr in arrays.items():
                arr = np.ascontiguousarray(arr)
                chunks = None
                if arr.ndim and arr.shape[0]:
                    # ~1 MiB chunks of whole rows: good compression, and a reader can slice rows cheaply
                    row_bytes = max(1, arr[0].nbytes)
                    chunks = (max(1, min(arr.shape[0], (1 << 20) // row_bytes)),) + arr.shape[1:]
                f.create_dataset(
                    name,
                    data=arr,
                    compression="gzip" if arr.size else None,
                    compression_opts=compression_level if arr.size else None,
                    chunks=chunks if arr.size else None,
                    track_times=False,
                )
            for k, v in (attrs or {}).items():
                f.attrs[k] = v
        commit(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        raise_if_disk_full(e, path)
        raise
    return path


def read_shard(path: str | os.PathLike, validate: bool = True) -> dict[str, np.ndarray]:
    """All datasets of a shard as numpy arrays; checks the row counts agree (a truncated file is an error)."""
    path = Path(path)
    with open_shard(path) as f, reading(path):
        out = {name: f[name][()] for name in f if isinstance(f[name], h5py.Dataset)}
    if validate:
        validate_arrays(out, path)
    return out


def validate_arrays(arrays: Mapping[str, np.ndarray], path: str | os.PathLike = "<arrays>") -> int:
    """Check the datasets have the same number of rows and the shapes of an unpacked shard; returns N."""
    if "input_ids" not in arrays:
        raise UserError(f"shard {path} has no input_ids dataset; it is not a pre-training shard")
    n = arrays["input_ids"].shape[0]
    for name, arr in arrays.items():
        if arr.ndim and arr.shape[0] != n:
            raise UserError(
                f"shard {path} is truncated or inconsistent: {name} has {arr.shape[0]} rows, input_ids has {n}; "
                "re-create it or delete the file"
            )
    ids = arrays["input_ids"]
    for name in ("input_mask", "segment_ids", "word_starts"):
        if name in arrays and arrays[name].shape != ids.shape:
            raise UserError(f"shard {path}: {name} has shape {arrays[name].shape}, input_ids {ids.shape}")
    if (
        "masked_lm_positions" in arrays
        and "masked_lm_ids" in arrays
        and arrays["masked_lm_positions"].shape != arrays["masked_lm_ids"].shape
    ):
        raise UserError(f"shard {path}: masked_lm_positions and masked_lm_ids differ in shape")
    return n


def write_manifest(directory: str | os.PathLike, manifest: Mapping[str, Any]) -> Path:
    """Write `manifest.json` in `directory` atomically."""
    return write_text(Path(directory) / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")


@contextlib.contextmanager
def _quiet_h5py_dealloc() -> Iterator[None]:
    """h5py object ids freed after a failed write (a full disk) flush again and print "Exception ignored"
    tracebacks from their destructors; the failure itself is reported once, by the caller."""
    hooks = sys.unraisablehook, sys.excepthook  # h5py's destructors print through both
    # quiet, except that a Ctrl-C landing in such a destructor is not dropped with the noise
    sys.unraisablehook, sys.excepthook = redeliver_interrupt, (lambda *_: None)
    try:
        yield
    except BaseException:
        gc.collect()  # the failed objects' destructors run now, while quiet
        raise
    finally:
        sys.unraisablehook, sys.excepthook = hooks


class ShardWriter:
    """Write a shard block by block (bounded memory), atomically: datasets are pre-sized, rows written in
    order, and the file is renamed into place on `close()`; `abort()` (or an exception in a `with`) removes it.

        with ShardWriter(path, {"input_ids": ((N, S), np.int32), ...}, attrs) as w:
            w.write(0, {"input_ids": block, ...})
    """

    def __init__(
        self,
        path: str | os.PathLike,
        layout: Mapping[str, tuple[tuple[int, ...], Any]],
        attrs: Mapping[str, Any] | None = None,
        compression_level: int = 1,
        chunk_rows: int = 4096,
    ):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = temp_name(self.path)
        self.f = h5py.File(self.tmp, "w", track_order=True)
        try:
            for name, (shape, dtype) in layout.items():
                empty = 0 in shape
                self.f.create_dataset(
                    name,
                    shape=shape,
                    dtype=dtype,
                    compression=None if empty else "gzip",
                    compression_opts=None if empty else compression_level,
                    chunks=None if empty else (min(shape[0], chunk_rows),) + tuple(shape[1:]),
                    track_times=False,
                )
            for k, v in (attrs or {}).items():
                self.f.attrs[k] = v
        except BaseException as e:
            self.abort()
            raise_if_disk_full(e, self.path)
            raise

    def write(self, start: int, arrays: Mapping[str, np.ndarray]) -> None:
        with _quiet_h5py_dealloc():
            for name, arr in arrays.items():
                ds = self.f[name]
                try:
                    ds[start : start + arr.shape[0]] = arr
                finally:
                    del ds  # freed here, inside the quiet block, when the write failed

    def close(self) -> Path:
        try:
            self.f.close()
            commit(self.tmp, self.path)
        except BaseException as e:
            self.tmp.unlink(missing_ok=True)
            raise_if_disk_full(e, self.path)
            raise
        return self.path

    def abort(self) -> None:
        # closing flushes: on a full disk it fails too, and the error being handled is the one to report
        with _quiet_h5py_dealloc():
            try:
                self.f.close()
            except Exception:  # noqa: BLE001 - reported by the caller
                gc.collect()
        self.tmp.unlink(missing_ok=True)

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
            raise_if_disk_full(exc, self.path)
