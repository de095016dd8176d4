"""HDF5 pre-training shards in the NVIDIA schema (DESIGN §3.2), plus our dynamic-masking and packed variants.

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

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, Mapping

import h5py
import numpy as np

from bertforge.errors import UserError
from bertforge.runtime.io import commit, temp_name, write_text

# dataset -> (dtype, number of dims); the NVIDIA schema, DESIGN §3.2
NVIDIA_SCHEMA: dict[str, tuple[type, int]] = {
    "input_ids": (np.int32, 2),
    "input_mask": (np.int8, 2),
    "segment_ids": (np.int8, 2),
    "masked_lm_positions": (np.int32, 2),
    "masked_lm_ids": (np.int32, 2),
    "next_sentence_labels": (np.int8, 1),
}
DYNAMIC_SCHEMA: dict[str, tuple[type, int]] = {
    "input_ids": (np.int32, 2),
    "input_mask": (np.int8, 2),
    "segment_ids": (np.int8, 2),
    "next_sentence_labels": (np.int8, 1),
    "word_starts": (np.int8, 2),  # optional
}
KIND_ATTR = "bertforge_kind"
SHARD_SUFFIXES = (".hdf5", ".h5", ".hdf")
MANIFEST = "manifest.json"


def _natural_key(path: Path) -> list[Any]:
    # "shard_10" sorts after "shard_9"
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path.name)]


def list_shards(directory: str | os.PathLike) -> list[Path]:
    """The HDF5 shards in `directory` (or the file itself), sorted numerically; temporary files excluded."""
    d = Path(directory)
    if d.is_file():
        return [d]
    if not d.is_dir():
        raise UserError(f"shard directory {d} does not exist; create shards with `bertforge data shards`")
    return sorted((p for p in d.iterdir() if p.suffix in SHARD_SUFFIXES and p.is_file() and not p.name.startswith(".")),
                  key=_natural_key)


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
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def shard_kind(path: str | os.PathLike) -> str:
    """"nvidia" (masked at creation), "dynamic" (unmasked pairs) or "packed" (DESIGN §3.3)."""
    with _open(path) as f:
        kind = f.attrs.get(KIND_ATTR)
        if isinstance(kind, bytes):
            kind = kind.decode()
        if kind in ("dynamic", "packed"):
            return kind
        if "next_sentence_positions" in f:
            return "packed"
        if "masked_lm_positions" not in f and "input_ids" in f:
            return "dynamic"
        return "nvidia"


def read_attrs(path: str | os.PathLike) -> dict[str, Any]:
    """The file attributes of a shard as plain Python values."""
    with _open(path) as f:
        out = {}
        for k, v in f.attrs.items():
            out[k] = v.item() if hasattr(v, "item") else (v.decode() if isinstance(v, bytes) else v)
        return out


def read_shard(path: str | os.PathLike, validate: bool = True) -> dict[str, np.ndarray]:
    """All datasets of a shard as numpy arrays; checks the row counts agree (a truncated file is an error)."""
    path = Path(path)
    with _open(path) as f:
        try:
            out = {name: f[name][()] for name in f.keys() if isinstance(f[name], h5py.Dataset)}
        except OSError as e:
            raise UserError(f"shard {path} is corrupt ({e}); re-create it or delete the file") from e
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
    if "masked_lm_positions" in arrays and "masked_lm_ids" in arrays:
        if arrays["masked_lm_positions"].shape != arrays["masked_lm_ids"].shape:
            raise UserError(f"shard {path}: masked_lm_positions and masked_lm_ids differ in shape")
    return n


def _open(path: str | os.PathLike) -> h5py.File:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"shard {path} does not exist")
    try:
        return h5py.File(path, "r")
    except OSError as e:
        raise UserError(f"shard {path} is not a readable HDF5 file ({e}); re-create it or delete the file") from e


def file_sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_manifest(directory: str | os.PathLike, manifest: Mapping[str, Any]) -> Path:
    """Write `manifest.json` in `directory` atomically."""
    return write_text(Path(directory) / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def read_manifest(directory: str | os.PathLike) -> dict[str, Any] | None:
    """The manifest beside the shards, or None when there is none."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not valid JSON ({e}); delete it and re-run `bertforge data shards`") from e


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

    def write(self, start: int, arrays: Mapping[str, np.ndarray]) -> None:
        for name, arr in arrays.items():
            self.f[name][start : start + arr.shape[0]] = arr

    def close(self) -> Path:
        self.f.close()
        commit(self.tmp, self.path)
        return self.path

    def abort(self) -> None:
        try:
            self.f.close()
        finally:
            self.tmp.unlink(missing_ok=True)

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
