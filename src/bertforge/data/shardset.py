"""The one owner of the shard format: what a directory of pre-training shards holds, read once.

A `ShardSet` answers every question the rest of bertforge asks about a shard directory — which files, in
which order, of which kind (DESIGN §3.2 NVIDIA, our dynamic-masking variant, our MLM-only rows, §3.3 packed), their row
counts and widths, the manifest beside them (vocab, masking parameters, packing statistics) — from the HDF5
metadata only (no row is read), once per directory and process:

    shards = ShardSet.open("runs/wiki/shards_phase1")       # cached: a second call returns the same object
    shards.kind, shards.seq_len, shards.rows, shards.vocab_size
    shards.check_model(vocab_size=30522, max_position_embeddings=512)
    shards.check_compatible(ShardSet.open(eval_dir))

The cache key is the resolved path plus the names, sizes, modification times and inodes of the shard and
manifest files (one `stat` each), so a directory that is rewritten in the same process is read again. A ShardSet is
plain, frozen data: cheap to pickle into DataLoader workers.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from bertforge.errors import UserError, first_line
from bertforge.runtime.io import read_json_object

# dataset -> dtype of each kind's schema, in the order the writers create them
NVIDIA_SCHEMA: dict[str, type] = {  # DESIGN §3.2
    "input_ids": np.int32,
    "input_mask": np.int8,
    "segment_ids": np.int8,
    "masked_lm_positions": np.int32,
    "masked_lm_ids": np.int32,
    "next_sentence_labels": np.int8,
}
DYNAMIC_SCHEMA: dict[str, type] = {  # unmasked pairs; word_starts only with whole-word masking
    "input_ids": np.int32,
    "input_mask": np.int8,
    "segment_ids": np.int8,
    "next_sentence_labels": np.int8,
    "word_starts": np.int8,
}
MLM_SCHEMA: dict[str, type] = {  # MLM-only full rows, unmasked: no segment B (segment_ids all 0), no NSP label
    "input_ids": np.int32,
    "input_mask": np.int8,
    "segment_ids": np.int8,
    "word_starts": np.int8,
}
PACKED_SCHEMA: dict[str, type] = {  # DESIGN §3.3
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
SCHEMAS = {"nvidia": NVIDIA_SCHEMA, "dynamic": DYNAMIC_SCHEMA, "mlm": MLM_SCHEMA, "packed": PACKED_SCHEMA}
LOADER_MASKED = ("dynamic", "mlm")
"""Kinds stored unmasked: the loader masks them, a fresh draw every epoch."""
OBJECTIVES = {"nvidia": "mlm_nsp", "dynamic": "mlm_nsp", "mlm": "mlm", "packed": "mlm_nsp"}
"""The pre-training objective each kind's rows are made for (`train.objective`)."""
NVIDIA_KEYS = tuple(NVIDIA_SCHEMA)
PACKED_KEYS = tuple(PACKED_SCHEMA)
ROW_KEYS = frozenset(NVIDIA_SCHEMA) | frozenset(DYNAMIC_SCHEMA) | frozenset(PACKED_SCHEMA)
"""Every per-row dataset a reader may need."""

OPTIONAL_KEYS = frozenset({"word_starts"})
"""Schema datasets a shard may lack (word_starts: only written with whole-word masking)."""
WIDTH_GROUPS = (
    ("input_ids", "input_mask", "segment_ids", "positions", "word_starts"),
    ("masked_lm_positions", "masked_lm_ids"),
    ("next_sentence_positions", "next_sentence_labels", "next_sentence_weights"),
)
"""Datasets whose rows must be equally wide: one value per token, per masked-LM slot, per packed sequence."""
ID_KEYS = ("input_ids", "masked_lm_ids")
"""Datasets of token ids: each must be below the model's vocab size (an embedding or loss index)."""
POSITION_KEYS = ("masked_lm_positions", "next_sentence_positions", "positions")
"""Datasets of positions within a row: each must be below seq_len (a gather index in the heads)."""
SAMPLE_ROWS = 1024
"""Rows of the first shard whose values `check_model` reads at start-up; the loader checks every row it reads."""
REMAKE = "re-create it with the command that wrote it (`bertforge data shards` or `bertforge pack`) or delete the file"

KIND_ATTR = "bertforge_kind"
SHARD_SUFFIXES = (".hdf5", ".h5", ".hdf")
MANIFEST = "manifest.json"
"""Written by `bertforge data shards`; `bertforge pack` writes packing.json, some tools metadata.json."""
MANIFEST_FILES = (MANIFEST, "packing.json", "metadata.json")


def natural_key(path: Path) -> list[Any]:
    """Sort key that puts "shard_10" after "shard_9"."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path.name)]


def list_shards(path: str | os.PathLike, option: str = "the path") -> list[Path]:
    """The HDF5 shards of a directory (or the file itself), sorted numerically; hidden files (the temporary
    names of unfinished writes, `.NAME.tmp-PID.hdf5`) excluded. A missing directory is a UserError naming
    `option`, the setting that gave the path."""
    d = Path(path)
    if d.is_file():
        return [d]
    _check_link(d)
    if not d.is_dir():
        raise UserError(
            f"shard directory {d} does not exist; run `bertforge data shards` or `bertforge data "
            f"prepare` first, or fix {option}"
        )
    names = [p for p in d.iterdir() if p.suffix in SHARD_SUFFIXES and not p.name.startswith(".")]
    for p in names:  # a shard whose link lost its target would otherwise drop out of the data unnoticed
        _check_link(p)
    return sorted((p for p in names if p.is_file()), key=natural_key)


def _check_link(p: Path) -> None:
    """A UserError when `p` is a symlink whose target does not exist (a moved or unmounted data set)."""
    if p.is_symlink() and not p.exists():
        raise UserError(
            f"{p} is a symlink to {os.readlink(p)}, which does not exist; restore the target (is its file "
            "system mounted?) or remove the link"
        )


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from a file beside the shards; invalid JSON is a UserError naming the file."""
    return read_json_object(path, "re-create the shards or delete it")


def read_manifest(directory: str | os.PathLike) -> dict[str, Any]:
    """manifest.json, packing.json and metadata.json beside the shards, merged in that order; {} if none."""
    out: dict[str, Any] = {}
    for name in MANIFEST_FILES:
        p = Path(directory) / name
        if p.is_file():
            out.update(read_json(p))
    return out


def _plain(v: Any) -> Any:
    return v.item() if hasattr(v, "item") else (v.decode() if isinstance(v, bytes) else v)


def read_attrs(path: str | os.PathLike) -> dict[str, Any]:
    """The file attributes of one shard as plain Python values (a writer's check of a finished shard)."""
    with open_shard(Path(path)) as f:
        return {k: _plain(v) for k, v in f.attrs.items()}


def kind_of(keys: set[str] | frozenset[str], attrs: Mapping[str, Any]) -> str:
    """ "nvidia" (masked at creation), "dynamic" (unmasked pairs), "mlm" (unmasked MLM-only rows) or "packed",
    from datasets and attributes."""
    if attrs.get(KIND_ATTR) in ("dynamic", "mlm", "packed"):
        return str(attrs[KIND_ATTR])
    if "next_sentence_positions" in keys:
        return "packed"
    if "masked_lm_positions" in keys:
        return "nvidia"
    return "dynamic"


def open_shard(path: Path):
    import h5py

    if not path.is_file():
        raise UserError(f"shard {path} does not exist")
    try:
        return h5py.File(path, "r")
    except OSError as e:
        raise UserError(
            _not_the_file(path, e)
            or f"shard {path} is not a readable HDF5 file ({first_line(e)}); if another program is still writing "
            "it, wait for it to finish; else re-create it with the command that wrote it or delete it"
        ) from None


def _not_the_file(path: str | os.PathLike, e: BaseException) -> str | None:
    """The message for an error that is not the shard's fault (permissions, the process's open-file limit, a
    file gone or locked): told that the file is corrupt, a user would delete a good shard."""
    code = getattr(e, "errno", None)
    if code in (errno.EMFILE, errno.ENFILE):
        return (
            f"cannot open shard {path}: too many open files ({first_line(e)}); raise the limit (`ulimit -n`) "
            "or use fewer data loader workers"
        )
    if code in (errno.EACCES, errno.EPERM):
        return f"cannot read shard {path}: permission denied; give this user read access to it"
    if code == errno.ENOENT:  # listed at start-up, gone when a lane reached it
        return f"shard {path} no longer exists (moved or deleted during the run); restore the file"
    # HDF5 locks a file it opens: a writer's lock, or a file system without locks (NFS without lockd: ENOLCK)
    if code == errno.EAGAIN:
        return f"cannot open shard {path}: another process holds it open for writing; wait for it to finish"
    if code in (errno.ENOLCK, errno.ENOSYS):
        return (
            f"cannot lock shard {path} for reading ({first_line(e)}): its file system has no file locks; "
            "set HDF5_USE_FILE_LOCKING=FALSE in the environment"
        )
    return None


@contextlib.contextmanager
def reading(path: str | os.PathLike) -> Iterator[None]:
    """Reads of shard `path` inside: h5py's errors of a damaged file (a bit flip fails decompression, a
    truncated file a read past its end) become one UserError naming the file."""
    try:
        yield
    except (OSError, KeyError, RuntimeError) as e:
        raise UserError(
            _not_the_file(path, e) or f"shard {path} is corrupt or truncated ({first_line(e)}); {REMAKE}"
        ) from None


@dataclass(frozen=True)
class ShardInfo:
    """One shard, from its HDF5 metadata."""

    path: Path
    rows: int
    kind: str
    seq_len: int
    max_pred: int
    """Width of masked_lm_positions (0 for dynamic shards: see ShardSet.max_pred)."""
    attrs: Mapping[str, Any] = field(default_factory=dict)
    datasets: frozenset[str] = frozenset()
    """Names of its datasets."""

    @classmethod
    def read(cls, path: Path) -> ShardInfo:
        import h5py

        with open_shard(path) as h, reading(path):
            attrs = {k: _plain(v) for k, v in h.attrs.items()}
            shapes = {k: h[k].shape for k in h if isinstance(h[k], h5py.Dataset)}
            ragged = [k for k in shapes if h5py.check_vlen_dtype(h[k].dtype) is not None]
        if ragged:
            # MLPerf's convert_fixed2variable.py stores each row at its own length (hdf5_*_shards_varlength,
            # eval_varlength): no fixed width, no input_mask
            raise UserError(
                f"shard {path} holds variable-length rows ({ragged[0]}: MLPerf's *_varlength format), which "
                "bertforge does not read; use the fixed-length shards MLPerf's preparation writes before that "
                "conversion (hdf5_*_shards_uncompressed, eval/part_eval_10k.hdf5)"
            )
        kind = kind_of(set(shapes), attrs)
        check_widths(path, shapes)
        rows, seq_len = shapes["input_ids"]
        max_pred = shapes["masked_lm_positions"][1] if "masked_lm_positions" in shapes else 0
        bad = {k: s[0] for k, s in shapes.items() if s and s[0] != rows}
        if bad:
            raise UserError(
                f"shard {path} is truncated or inconsistent: input_ids has {rows} rows but {bad}; "
                "re-create it or delete the file"
            )
        return cls(path, int(rows), kind, int(seq_len), int(max_pred), attrs, frozenset(shapes))


def check_widths(path: Path, shapes: Mapping[str, tuple[int, ...]]) -> None:
    """A UserError naming the shard and dataset unless its per-token and per-slot datasets are [rows, width] and
    those of a row agree in width (a narrower input_mask would otherwise fail deep in the model at the first
    step). Which datasets must be there is the reader's to say (`ShardSet.check_datasets`)."""
    if "input_ids" not in shapes or "input_mask" not in shapes:
        raise UserError(
            f"shard {path} has no input_ids/input_mask dataset; it is not a pre-training "
            "shard: move it out of the directory"
        )
    for k in (*WIDTH_GROUPS[0], *WIDTH_GROUPS[1]):  # per token, per slot: [rows, width] in every kind
        if k in shapes and len(shapes[k]) != 2:
            raise UserError(f"shard {path}: {k} has shape {shapes[k]}, expected [rows, width]; {REMAKE}")
    for group in WIDTH_GROUPS:
        present = [k for k in group if k in shapes and len(shapes[k]) == 2]
        for k in present[1:]:
            if shapes[k][1] != shapes[present[0]][1]:
                raise UserError(
                    f"shard {path}: {k} is {shapes[k][1]} wide but {present[0]} is {shapes[present[0]][1]} "
                    f"(their rows must match); {REMAKE}"
                )


def check_values(path: str | os.PathLike, arrays: Mapping[str, np.ndarray], first_row: int, vocab_size: int) -> None:
    """A UserError naming the shard and row (`first_row` is the row of arrays[...][0]) when a token id is not below
    `vocab_size` or a position is outside its row: an index error deep in the model otherwise."""
    seq_len = arrays["input_ids"].shape[1]
    limits = [(k, vocab_size) for k in ID_KEYS] + [(k, seq_len) for k in POSITION_KEYS]
    for key, limit in limits:
        a = arrays.get(key)
        # the loader checks every chunk it reads: a clean one costs a min and a max, no masks
        if a is None or not a.size or (a.min() >= 0 and a.max() < limit):
            continue
        bad = np.flatnonzero(((a < 0) | (a >= limit)).reshape(len(a), -1).any(axis=1))
        row = np.atleast_1d(a[int(bad[0])])
        value = int(row[(row < 0) | (row >= limit)][0])
        if key in ID_KEYS:
            fix = (
                f"the model's vocab has {limit} tokens: set model.vocab_size above the shards' largest id "
                "(or data.vocab to the vocab they were built with), or rebuild the shards with this vocab"
            )
        else:
            fix = f"rows are {seq_len} tokens long: the shard is corrupt; {REMAKE}"
        raise UserError(f"shard {path} row {first_row + int(bad[0])}: {key} holds {value}; {fix}")


_CACHE: dict[str, tuple[tuple, ShardSet]] = {}
"""resolved path -> (file signature, its ShardSet): one entry per path, replaced when the files change."""


@dataclass(frozen=True)
class ShardSet:
    """The shards of one directory (or one shard file) and their manifest; build with `ShardSet.open`."""

    directory: Path
    """The resolved directory (for a single file: its directory)."""
    infos: tuple[ShardInfo, ...]
    """Per shard, in numeric file order."""
    manifest: Mapping[str, Any]
    """manifest.json / packing.json / metadata.json merged ({} when there is none)."""

    KINDS: ClassVar[tuple[str, ...]] = tuple(SCHEMAS)

    @classmethod
    def open(cls, path: str | os.PathLike, option: str = "the path") -> ShardSet:
        """The ShardSet of a directory (or of a single shard file), read once per process and directory;
        `option` names the setting that gave the path, for the error when it does not exist."""
        _check_link(Path(path))  # before resolving it: a broken link would read as a missing directory
        p = Path(path).resolve()
        files = list_shards(p, option)
        directory = p.parent if p.is_file() else p
        sig = (*_stat_sig(files), *_stat_sig([directory / n for n in MANIFEST_FILES]))
        cached = _CACHE.get(str(p))
        if cached is None or cached[0] != sig:
            cached = _CACHE[str(p)] = (sig, cls._read(p, directory, files))
        return cached[1]

    @classmethod
    def _read(cls, p: Path, directory: Path, files: list[Path]) -> ShardSet:
        if not files:
            raise UserError(f"no .hdf5 shards in {p}; run `bertforge data shards` to create them")
        infos = tuple(ShardInfo.read(f) for f in files)
        kinds = sorted({i.kind for i in infos})
        if len(kinds) > 1:
            first = {k: next(i.path.name for i in infos if i.kind == k) for k in kinds}
            raise UserError(
                f"shards in {directory} mix kinds ({', '.join(f'{n}: {k}' for k, n in first.items())}); "
                "keep one kind per directory"
            )
        widths = sorted({(i.seq_len, i.max_pred) for i in infos})
        if len(widths) > 1:
            named = {w: next(i.path.name for i in infos if (i.seq_len, i.max_pred) == w) for w in widths}
            raise UserError(
                f"shards in {directory} differ in seq_len/max_pred "
                f"({', '.join(f'{n}: {s}/{m}' for (s, m), n in named.items())}); keep the shards of one "
                "`bertforge data shards` run (one phase) per directory"
            )
        manifest = read_manifest(directory)
        if p.is_dir():
            _check_listed(directory, manifest, infos)
            if not manifest:
                # shards copied by hand or from another tool: usable, but a missing one would go unnoticed
                print(
                    f"warning: {directory} has no {MANIFEST} (or packing.json/metadata.json): cannot check that "
                    f"all its shards are there; using the {len(infos)} found",
                    file=sys.stderr,
                    flush=True,
                )
        return cls(directory, infos, manifest)

    # ------------------------------------------------------------------------------------ plain facts
    @property
    def files(self) -> tuple[Path, ...]:
        return tuple(i.path for i in self.infos)

    @property
    def kind(self) -> str:
        return self.infos[0].kind

    @property
    def keys(self) -> tuple[str, ...]:
        """The datasets of this kind's schema (word_starts of the unmasked kinds is optional)."""
        return tuple(SCHEMAS[self.kind])

    @property
    def rows(self) -> int:
        return sum(i.rows for i in self.infos)

    @property
    def seq_len(self) -> int:
        return self.infos[0].seq_len

    @property
    def attrs(self) -> Mapping[str, Any]:
        """The first shard's file attributes (a dynamic shard's masking parameters)."""
        return self.infos[0].attrs

    @property
    def max_pred(self) -> int:
        """Masked-LM slots per row: the dataset width, or a dynamic shard's `max_pred` (manifest, attribute);
        0 when unknown."""
        return self.infos[0].max_pred or int(self.manifest.get("max_pred", self.attrs.get("max_pred", 0)))

    @property
    def vocab_size(self) -> int | None:
        """The token id space the shards were built with (manifest, or a dynamic shard's attribute)."""
        v = self.manifest.get("vocab_size", self.attrs.get("vocab_size"))
        return int(v) if v is not None else None

    @property
    def vocab_file(self) -> Path | None:
        """The vocab recorded in the manifest, when it still exists."""
        for key in ("vocab_file", "vocab"):
            v = self.manifest.get(key)
            if isinstance(v, str) and Path(v).exists():
                return Path(v)
        return None

    @property
    def vocab_sha(self) -> str | None:
        v = self.manifest.get("vocab_sha256")
        return str(v) if v else None

    @functools.cached_property
    def avg_seq_per_sample(self) -> float:
        """Sequences per row: packed shards' packing.json figure, 1.0 for the other kinds. Packed shards without
        it (Habana's packer writes none) count their filled NSP slots once: taken as 1.0, an update would see
        avg_seq_per_sample times the sequences train.global_batch_size asks for."""
        if self.kind != "packed":
            return 1.0
        if "avg_seq_per_sample" in self.manifest:
            return float(self.manifest["avg_seq_per_sample"])
        if not self.rows or any("next_sentence_weights" not in i.datasets for i in self.infos):
            return 1.0
        sequences = 0
        for i in self.infos:
            with open_shard(i.path) as h, reading(i.path):
                sequences += int((h["next_sentence_weights"][()] > 0).sum())
        return max(1.0, sequences / self.rows)

    @property
    def objective(self) -> str:
        """mlm_nsp (sentence pairs with NSP labels) or mlm (MLM-only rows, `data shards --objective mlm`)."""
        return OBJECTIVES[self.kind]

    def masking_params(self) -> dict[str, Any]:
        """Dynamic masking's parameters from an unmasked shard's attributes (`bertforge data shards
        --dynamic-masking` or `--objective mlm`): max_pred, masked_lm_prob, special and [MASK] ids, whole-word
        masking. {} for the kinds that are masked at creation."""
        if self.kind not in LOADER_MASKED:
            return {}
        a = self.attrs
        out: dict[str, Any] = {}
        if "max_pred" in a:
            out["max_pred"] = int(a["max_pred"])
        if "masked_lm_prob" in a:
            out["masked_lm_prob"] = float(a["masked_lm_prob"])
        ids = [int(a[k]) for k in ("pad_id", "cls_id", "sep_id") if k in a]
        if ids:
            out["special_ids"] = tuple(ids)
        if "mask_id" in a:
            out["mask_id"] = int(a["mask_id"])
        if "wwm" in a:
            out["wwm"] = bool(a["wwm"])
        return out

    # ------------------------------------------------------------------------------------ checks
    def check_objective(self, objective: str) -> None:
        """A UserError (one line) unless these shards are made for `objective` (train.objective)."""
        if objective == self.objective:
            return
        fix = (
            "build MLM-only shards with `bertforge data shards --objective mlm`"
            if objective == "mlm"
            else "build sentence-pair shards (`bertforge data shards` without --objective mlm)"
        )
        raise UserError(
            f"train.objective is {objective} but {self.directory} holds {self.kind} shards made for "
            f"{self.objective}: set train.objective={self.objective}, or {fix}"
        )

    def check_model(self, vocab_size: int, max_position_embeddings: int) -> None:
        """A UserError when the model cannot take these shards: rows longer than its position table, or token
        ids (the vocab the manifest records, and a sample of the rows: `check_rows`) beyond its vocab."""
        if self.seq_len > max_position_embeddings:
            raise UserError(
                f"shards in {self.directory} have seq_len {self.seq_len} but the model has "
                f"max_position_embeddings {max_position_embeddings}; set model.max_position_embeddings "
                f"to at least {self.seq_len}"
            )
        if self.vocab_size is not None and self.vocab_size > vocab_size:
            raise UserError(
                f"shards in {self.directory} were built with a vocab of {self.vocab_size} tokens but the "
                f"model's vocab_size is {vocab_size}; set model.vocab_size to at least "
                f"{self.vocab_size} (or leave it unset to take it from the data)"
            )
        self.check_rows(vocab_size)

    def check_datasets(self) -> None:
        """A UserError naming the first shard that lacks a dataset the loader reads for this kind (metadata only:
        at start-up, not a KeyError at the first step)."""
        for info in self.infos:
            missing = [k for k in SCHEMAS[self.kind] if k not in info.datasets and k not in OPTIONAL_KEYS]
            if missing:
                raise UserError(
                    f"shard {info.path} has no {'/'.join(missing)} dataset, which {self.kind} shards need; {REMAKE}"
                )

    def check_rows(self, vocab_size: int) -> None:
        """`check_values` on the first SAMPLE_ROWS rows of the first shard with rows: ids beyond the model's vocab
        (shards without a manifest record none) or positions outside the row fail at start-up, at a bounded cost."""
        first = next((i.path for i in self.infos if i.rows), None)
        if first is None:
            return
        with open_shard(first) as h, reading(first):
            arrays = {k: h[k][:SAMPLE_ROWS] for k in (*ID_KEYS, *POSITION_KEYS) if k in h}
        check_values(first, arrays, 0, vocab_size)

    def check_compatible(self, other: ShardSet) -> None:
        """A UserError unless `other` (e.g. the eval shards) fits the model trained on these: same seq_len, same
        vocab. Any kind may be evaluated on any other (packed training, unpacked eval is the usual pairing)."""
        where = f"{self.directory} and {other.directory}"
        if self.seq_len != other.seq_len:
            raise UserError(
                f"shards in {where} differ in seq_len ({self.seq_len} vs {other.seq_len}); use eval "
                "shards of the same phase (data.eval_dir)"
            )
        if None not in (self.vocab_size, other.vocab_size) and self.vocab_size != other.vocab_size:
            raise UserError(
                f"shards in {where} were built with different vocabs ({self.vocab_size} vs "
                f"{other.vocab_size} tokens); rebuild the eval shards with the training vocab"
            )
        if None not in (self.vocab_sha, other.vocab_sha) and self.vocab_sha != other.vocab_sha:
            raise UserError(
                f"shards in {where} were built with different vocab files (sha256 differs); rebuild the "
                "eval shards with the training vocab"
            )

    def check_vocab(self, vocab_file: str | os.PathLike, option: str = "data.vocab") -> None:
        """A UserError unless `vocab_file` is the vocab the manifest records (its sha256; or, when that file
        still exists, the same tokens): a different one would train on ids that mean other words and ship
        the wrong vocab.txt with every checkpoint. No recorded hash: nothing to check."""
        if self.vocab_sha is None:
            return
        from bertforge.data.vocab import load_tokenizer, vocab_hash

        given = Path(vocab_file)
        home = given if given.is_dir() else given.parent
        # vocab.txt and tokenizer.json of one directory are one vocab written twice; the manifest names either
        if any(
            vocab_hash(p) == self.vocab_sha for p in {given, home / "vocab.txt", home / "tokenizer.json"} if p.is_file()
        ):
            return
        recorded = self.vocab_file
        if recorded is not None and load_tokenizer(recorded).get_vocab() == load_tokenizer(given).get_vocab():
            return
        was = recorded or self.manifest.get("vocab") or f"sha256 {self.vocab_sha[:12]}"
        raise UserError(
            f"{option} {given} is not the vocab the shards in {self.directory} were built with ({was}); "
            f"checkpoints would ship the wrong vocab.txt: set {option} to {was if recorded else 'that file'} "
            "(or leave it unset to take the manifest's), or rebuild the shards with this vocab"
        )

    # ------------------------------------------------------------------------------------ batch arithmetic
    def rows_per_update(self, global_batch: int, micro_batch: int, world_size: int) -> int:
        """Rows per update: the global batch in sequences, or for packed shards global / avg_seq_per_sample
        rows rounded to a multiple of micro x world (DESIGN §3.3: an update still sees about as many sequences)."""
        return packed_rows_per_update(global_batch, self.avg_seq_per_sample, micro_batch, world_size)


def packed_rows_per_update(global_batch: int, avg_seq_per_sample: float, micro_batch: int, world_size: int) -> int:
    """Rows per update for `global_batch` sequences: global / avg_seq_per_sample packed rows rounded to a
    multiple of micro x world (DESIGN §3.3: an update still sees about the same number of sequences)."""
    if avg_seq_per_sample <= 1.0:
        return global_batch
    unit = micro_batch * world_size
    return max(unit, round(global_batch / avg_seq_per_sample / unit) * unit)


def _stat_sig(paths: list[Path]) -> list[tuple[str, int, int, int]]:
    """(name, size, mtime, inode) of each existing file: a rewrite (atomic: a new inode) changes it."""
    out = []
    for p in paths:
        try:
            st = p.stat()
        except OSError:
            continue
        out.append((p.name, st.st_size, st.st_mtime_ns, st.st_ino))
    return out


def _check_listed(directory: Path, manifest: Mapping[str, Any], infos: tuple[ShardInfo, ...]) -> None:
    """The shards the manifest lists must be there with the rows it records (a deleted or truncated shard
    would otherwise silently shrink the data)."""
    have = {i.path.name: i for i in infos}
    entries = [(e.get("file") if isinstance(e, dict) else e, e) for e in manifest.get("shards") or []]
    listed = {name for name, _ in entries}
    if extra := sorted(set(have) - listed) if listed else []:  # read as data, it would be trained on twice
        raise UserError(
            f"shard {directory / extra[0]} is not in the manifest of {directory} (left by another run?): move it "
            "away, or re-run the command that wrote the directory"
        )
    for name, entry in entries:
        if not isinstance(name, str):
            continue
        if name not in have:
            raise UserError(
                f"shard {directory / name} is missing (listed in the manifest of {directory}); re-run "
                "the command that wrote the directory (finished shards are kept) or restore the file"
            )
        want = entry.get("instances") if isinstance(entry, dict) else None
        if want is not None and int(want) != have[name].rows:
            raise UserError(
                f"shard {directory / name} is truncated (expected {want} rows, found "
                f"{have[name].rows}); re-run `bertforge data shards` or delete the file"
            )
