"""`bertforge data shards`: documents -> pre-training instances -> HDF5 shards, streamed and parallel.

1. One streaming pass over the document files assigns every document to an output shard (a seeded draw per
   document, so the assignment is fixed by the seed and the shard count) and appends its text to that shard's
   spill file. Nothing but the current document is held in memory.
2. A bounded pool (one worker per core, `fork` where available) builds the shards: a worker reads only its
   spill file, tokenizes it in batches with HF `tokenizers` (`encode_batch_fast`), keeps the tokens as one
   int32 array, runs Google's instance algorithm (`instances.create_instance_specs`) on sentence offsets,
   then builds, masks and writes rows in blocks of `BLOCK_ROWS` (`ShardWriter`), so its memory is about
   4 bytes per token of its own shard plus a constant.
3. `manifest.json` records parameters, counts, the vocab hash and a sha256 per shard.

Each shard's generator is `numpy.random.default_rng([seed, shard_index, kind])` (distinct per shard and for
eval shards); a re-run skips shards whose file exists with the same parameter hash.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import hashlib
import itertools
import json
import os
import re
import shutil
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.data import shards as shardio
from bertforge.data.config import ShardsConfig
from bertforge.data.shardset import KIND_ATTR, natural_key, read_attrs
from bertforge.data.sources import listed_files
from bertforge.data.vocab import document_lines, vocab_rows
from bertforge.data.workers import WorkerPool, quiet_worker
from bertforge.errors import UserError
from bertforge.runtime.io import (
    check_open_files,
    file_sha256,
    files_digest,
    output_dir,
    raise_if_disk_full,
    remove_earlier,
    remove_stale,
    temp_name,
)
from bertforge.runtime.progress import Progress

BLOCK_ROWS = 4096
"""Rows built, masked and written at a time (bounds a worker's memory)."""
TOKENIZE_LINES = 8192
"""Lines per `encode_batch_fast` call."""
ASSIGN_DRAWS = 1 << 16


# ------------------------------------------------------------------------------------------- documents in
def document_files(docs: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path]:
    """Document text files: a directory (its *.txt, numerically sorted), files, or globs."""
    items = [docs] if isinstance(docs, (str, os.PathLike)) else list(docs)
    files: list[Path] = []
    for item in items:
        p = Path(item)
        if p.is_dir():
            files += _directory_documents(p)
        elif p.is_file():
            files.append(p)
        else:
            hits = sorted(glob.glob(str(item)))
            if not hits:
                raise UserError(f"documents {item} not found (a directory of .txt files, a file or a glob)")
            # `--docs 'runs/*/docs'`: a folder the glob names is read as a folder (as `data docs --source` reads
            # one); `--docs 'dir/*'`: the docs manifest is not a document
            for h in map(Path, hits):
                files += _directory_documents(h) if h.is_dir() else [h] if h.name != "manifest.json" else []
    if not files:
        raise UserError(f"no document files (*.txt) in {docs}; run `bertforge data docs` or `data wiki` first")
    return files


def _directory_documents(directory: Path) -> list[Path]:
    """The documents of a folder: those its manifest.json lists, else its *.txt files, numerically sorted;
    hidden names are temporary files of a killed `data docs` (pathlib's glob matches them)."""
    unlisted = (f for f in directory.glob("*.txt") if not f.name.startswith("."))
    return _listed_documents(directory) or sorted(unlisted, key=natural_key)


def _listed_documents(directory: Path) -> list[Path] | None:
    """The document files that the manifest.json of `data docs`/`data wiki` lists, None without one: other
    .txt files there (a vocab.txt, files of another run) are not documents."""
    listed = listed_files(directory)
    if listed is None:
        return None
    missing = [n for n in listed if not (directory / n).is_file()]
    if missing:
        raise UserError(
            f"document shard {directory / missing[0]} is missing (listed in {directory / 'manifest.json'}); re-run "
            "the `bertforge data docs` or `data wiki` command that wrote the directory"
        )
    return [directory / n for n in listed]


def iter_documents(files: Sequence[Path]) -> Iterator[str]:
    """Each document's text (sentence lines joined by newlines); a blank line ends a document."""
    for path in files:
        lines: list[str] = []
        for line in document_lines(path):
            s = line.strip()
            if s:
                lines.append(s)
            elif lines:
                yield "\n".join(lines)
                lines = []
        if lines:
            yield "\n".join(lines)


# ------------------------------------------------------------------------------------------- the worker
@dataclasses.dataclass
class Job:
    index: int
    kind: str  # "train" | "eval"
    spill: str
    out: str
    params: dict[str, Any]
    params_hash: str
    vocab: str
    lowercase: bool | None


_ASCII_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_CORPUS_CACHE: dict[int, tuple] = {}


def _corpus_tokenizers(tok) -> tuple[Any, Any, bool]:
    """(corpus tokenizer, its ASCII fast copy or None, lowercase?) of `tok`, made once per tokenizer.

    The corpus tokenizer (`vocab.corpus_tokenizer`) matches no special tokens, as Google's BasicTokenizer. For a
    BERT tokenizer the fast copy has no normalizer: BertNormalizer (clean text, CJK spacing, strip accents,
    lower-case) does nothing to printable ASCII text except lower-casing it, which Python's str.lower does
    identically for ASCII and ~40% cheaper than the normalizer pass. Lines with any non-ASCII or control
    character still go through the corpus tokenizer.
    """
    from tokenizers import Tokenizer, normalizers

    from bertforge.data.vocab import corpus_tokenizer

    cached = _CORPUS_CACHE.get(id(tok))
    if cached is not None and cached[0] is tok:  # the same object, not another one at a freed one's address
        return cached[1:]
    corpus, fast, lower = corpus_tokenizer(tok), None, False
    norm = tok.normalizer
    if isinstance(norm, normalizers.BertNormalizer) and norm.clean_text:
        fast = Tokenizer.from_str(corpus.to_str())
        fast.normalizer = None
        lower = bool(norm.lowercase)
    _CORPUS_CACHE[id(tok)] = (tok, corpus, fast, lower)
    return corpus, fast, lower


def encode_lines(tok, lines: list[str]) -> list[list[int]]:
    """Token ids of each line of corpus text: `tok`'s, with no special tokens added or matched (a literal
    "[MASK]" is text, as in Google's create_pretraining_data); faster for ASCII lines."""
    corpus, fast_tok, lower = _corpus_tokenizers(tok)
    if fast_tok is None:
        return [e.ids for e in corpus.encode_batch_fast(lines, add_special_tokens=False)]
    easy = [i for i, ln in enumerate(lines) if ln.isascii() and not _ASCII_CONTROL.search(ln)]
    if len(easy) == len(lines):
        hard: list[int] = []
    else:
        is_easy = np.zeros(len(lines), bool)
        is_easy[easy] = True
        hard = np.flatnonzero(~is_easy).tolist()
    easy_text = [lines[i].lower() if lower else lines[i] for i in easy]
    out: list[list[int]] = [[]] * len(lines)
    for i, e in zip(easy, fast_tok.encode_batch_fast(easy_text, add_special_tokens=False)):
        out[i] = e.ids
    if hard:
        for i, e in zip(hard, corpus.encode_batch_fast([lines[i] for i in hard], add_special_tokens=False)):
            out[i] = e.ids
    return out


def tokenize_spill(path: str, tok) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """Tokenize one spill file: (tokens int32, sentence offsets, doc_first, doc_count, lines)."""
    tok_chunks: list[np.ndarray] = []
    len_chunks: list[np.ndarray] = []
    doc_chunks: list[np.ndarray] = []
    lines: list[str] = []
    line_doc: list[int] = []
    doc = 0
    open_doc = False
    n_lines = 0

    def flush() -> None:
        ids = encode_lines(tok, lines)
        lens = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        tok_chunks.append(np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int32, count=int(lens.sum())))
        len_chunks.append(lens)
        doc_chunks.append(np.asarray(line_doc, dtype=np.int64))
        lines.clear()
        line_doc.clear()

    with open(path, encoding="utf-8") as f:
        for line in f:
            if line == "\n":
                if open_doc:
                    doc += 1
                    open_doc = False
                continue
            lines.append(line)
            line_doc.append(doc)
            open_doc = True
            n_lines += 1
            if len(lines) >= TOKENIZE_LINES:
                flush()
    if lines:
        flush()
    if not tok_chunks:
        empty = np.zeros(0, np.int64)
        return np.zeros(0, np.int32), np.zeros(1, np.int64), empty, empty, 0
    tokens = np.concatenate(tok_chunks)
    lens = np.concatenate(len_chunks)
    sent_doc = np.concatenate(doc_chunks)
    keep = lens > 0  # Google drops lines that tokenize to nothing (and so documents left empty)
    lens, sent_doc = lens[keep], sent_doc[keep]
    offsets = np.concatenate([[0], np.cumsum(lens)])
    starts = np.flatnonzero(np.r_[True, sent_doc[1:] != sent_doc[:-1]]) if sent_doc.size else np.zeros(0, np.int64)
    counts = np.diff(np.r_[starts, sent_doc.size])
    return tokens, offsets, starts, counts, n_lines


def build_shard(job: Job) -> dict[str, Any]:
    """Build one shard from its spill file; returns its manifest entry."""
    from bertforge.data.vocab import continuation_table, load_tokenizer, special_ids

    t0 = time.perf_counter()
    p = ShardsConfig(**job.params)
    out = Path(job.out)
    if out.is_file():
        try:
            done = read_attrs(out)
        except UserError:
            done = {}
        if done.get("bertforge_params") == job.params_hash:
            return _entry(out, job, int(done.get("documents", 0)), int(done.get("tokens", 0)), skipped=True)
    tok = load_tokenizer(job.vocab, job.lowercase, cache=True)  # once per worker process
    sp = special_ids(tok, job.vocab)
    tokens, offsets, doc_first, doc_count, _ = tokenize_spill(job.spill, tok)
    corpus = _Corpus(tokens, offsets, doc_first, doc_count)
    kind_code = 0 if job.kind == "train" else 1
    rng = np.random.default_rng([p.seed, job.index, kind_code])  # distinct stream per shard
    attrs: dict[str, Any] = {
        "bertforge_params": job.params_hash,
        "documents": int(doc_first.size),
        "tokens": int(tokens.size),
        "vocab_size": vocab_rows(tok),
        "max_pred": p.max_pred,
        "masked_lm_prob": p.masked_lm_prob,
        "cls_id": sp["cls"],
        "sep_id": sp["sep"],
        "pad_id": sp.get("pad", 0),
        "mask_id": sp["mask"],
        "wwm": p.wwm,
    }
    cont = continuation_table(tok) if p.wwm else None
    write = _write_mlm_rows if p.objective == "mlm" else _write_pair_rows
    write(out, p, attrs, corpus, rng, cont)
    return _entry(out, job, int(doc_first.size), int(tokens.size), seconds=time.perf_counter() - t0)


@dataclasses.dataclass
class _Corpus:
    """One shard's tokenized documents: sentence k is tokens[offsets[k]:offsets[k+1]], document d is sentences
    doc_first[d] .. doc_first[d] + doc_count[d] - 1."""

    tokens: np.ndarray
    offsets: np.ndarray
    doc_first: np.ndarray
    doc_count: np.ndarray


def _write_pair_rows(
    out: Path, p: ShardsConfig, attrs: dict[str, Any], c: _Corpus, rng: np.random.Generator, cont: np.ndarray | None
) -> None:
    """Google BERT's sentence pairs with NSP labels: masked here (NVIDIA schema) or, with dynamic masking, not."""
    from bertforge.data.instances import build_rows, create_instance_specs, mask_batch

    specs = create_instance_specs(
        c.doc_first.tolist(), c.doc_count.tolist(), c.offsets.tolist(), rng, p.seq_len, p.short_seq_prob, p.dupe_factor
    )
    n = int(specs["label"].shape[0])
    S, P = p.seq_len, p.max_pred
    cls_id, sep_id, mask_id = attrs["cls_id"], attrs["sep_id"], attrs["mask_id"]
    layout: dict[str, tuple[tuple[int, ...], Any]] = {
        "input_ids": ((n, S), np.int32),
        "input_mask": ((n, S), np.int8),
        "segment_ids": ((n, S), np.int8),
    }
    if p.dynamic_masking:
        attrs[KIND_ATTR] = "dynamic"
        if cont is not None:
            layout["word_starts"] = ((n, S), np.int8)
    else:
        layout["masked_lm_positions"] = ((n, P), np.int32)
        layout["masked_lm_ids"] = ((n, P), np.int32)
    layout["next_sentence_labels"] = ((n,), np.int8)
    specials = (attrs["pad_id"], cls_id, sep_id)
    with shardio.ShardWriter(out, layout, attrs, chunk_rows=BLOCK_ROWS) as w:
        for start in range(0, n, BLOCK_ROWS):
            block = {k: v[start : start + BLOCK_ROWS] for k, v in specs.items()}
            rows = build_rows(c.tokens, block, S, cls_id, sep_id)  # (b, S) each
            starts = None
            if cont is not None:
                starts = ~cont[rows["input_ids"]]  # (b, S): 1 where a token starts a word
            if p.dynamic_masking:
                if starts is not None:
                    rows["word_starts"] = starts.astype(np.int8)
            else:
                lengths = rows["input_mask"].sum(axis=1, dtype=np.int64)
                ids, pos, lab = mask_batch(
                    rows["input_ids"], lengths, rng, attrs["vocab_size"], P, p.masked_lm_prob, specials, mask_id, starts
                )
                rows.update(input_ids=ids, masked_lm_positions=pos, masked_lm_ids=lab)
            rows["next_sentence_labels"] = block["label"]
            w.write(start, rows)


def _write_mlm_rows(
    out: Path, p: ShardsConfig, attrs: dict[str, Any], c: _Corpus, rng: np.random.Generator, cont: np.ndarray | None
) -> None:
    """MLM-only full rows (`instances.full_sentence_rows`), unmasked: the loader masks them (kind "mlm")."""
    from bertforge.data.instances import full_sentence_rows, mlm_row_count

    n = mlm_row_count(int(c.tokens.size), int(c.doc_first.size), p.dupe_factor, p.seq_len)
    S = p.seq_len
    attrs[KIND_ATTR] = "mlm"
    attrs["max_pred"] = slot_count(p)
    layout: dict[str, tuple[tuple[int, ...], Any]] = {
        "input_ids": ((n, S), np.int32),
        "input_mask": ((n, S), np.int8),
        "segment_ids": ((n, S), np.int8),
    }
    if cont is not None:
        layout["word_starts"] = ((n, S), np.int8)
    blocks = full_sentence_rows(
        c.tokens,
        c.offsets,
        c.doc_first,
        c.doc_count,
        rng,
        S,
        p.dupe_factor,
        attrs["cls_id"],
        attrs["sep_id"],
        BLOCK_ROWS,
    )
    with shardio.ShardWriter(out, layout, attrs, chunk_rows=BLOCK_ROWS) as w:
        start = 0
        for rows in blocks:
            if cont is not None:
                rows["word_starts"] = (~cont[rows["input_ids"]]).astype(np.int8)  # (b, S) 1 = starts a word
            w.write(start, rows)
            start += rows["input_ids"].shape[0]
        if start != n:  # inside the writer: the unfinished file is removed
            raise RuntimeError(f"MLM-only rows of {out}: wrote {start}, expected {n}")


def slot_count(p: ShardsConfig) -> int:
    """Masked-LM slots per row: --max-pred, and for MLM-only rows at least a full row's round(seq_len x rate),
    so the rate is never capped (the loader widens the slots again for a higher data.mlm_probability)."""
    from bertforge.data.instances import num_to_predict

    if p.objective != "mlm":
        return p.max_pred
    return max(p.max_pred, int(num_to_predict(p.seq_len, p.seq_len, p.masked_lm_prob)))


def _entry(out: Path, job: Job, docs: int, tokens: int, skipped: bool = False, seconds: float = 0.0) -> dict[str, Any]:
    import h5py

    with h5py.File(out, "r") as f:
        n = int(f["input_ids"].shape[0])
        has_nsp = n and "next_sentence_labels" in f  # MLM-only rows have no NSP label
        nsp = int(np.asarray(f["next_sentence_labels"][()], dtype=np.int64).sum()) if has_nsp else 0
    return {
        "file": out.name,
        "kind": job.kind,
        "index": job.index,
        "instances": n,
        "random_next": nsp,
        "documents": docs,
        "tokens": tokens,
        "sha256": file_sha256(out),
        "skipped": skipped,
        "seconds": round(seconds, 3),
    }


# ------------------------------------------------------------------------------------------- the driver
def params_hash(
    params: ShardsConfig, vocab_sha: str, docs_sig: str, lowercase: bool | None = None, casing: str | None = None
) -> str:
    """`casing`: `casing_beyond_hash`'s, the casing of a tokenizer.json that the vocab.txt's hash does not cover."""
    what: dict[str, Any] = {"params": params.content(), "vocab": vocab_sha, "docs": docs_sig}
    if lowercase is not None:  # --cased/--uncased over the vocab's own casing (None: the vocab's; hashes unchanged)
        what["lowercase"] = lowercase
    if casing is not None:  # None where the vocab.txt alone gives the same: hashes unchanged
        what["casing"] = casing
    blob = json.dumps(what, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _docs_signature(files: Sequence[Path]) -> str:
    """A hash of the documents' names and bytes, not their paths or mtimes: it is stored in every shard, and
    `data prepare` run again from scratch (new document files, same text) must write the same bytes."""
    return files_digest(files)


def run_shards(
    docs: str | os.PathLike | Sequence[str | os.PathLike],
    vocab: str | os.PathLike,
    out_dir: str | os.PathLike,
    params: ShardsConfig,
    eval_dir: str | os.PathLike | None = None,
    lowercase: bool | None = None,
    log=print,
) -> dict[str, Any]:
    """Write `params.num_shards` training shards into out_dir (and eval shards into eval_dir, when
    params.eval_fraction > 0) with `params.workers` processes (0 = one per core); returns the manifests."""
    params.validate()
    files = document_files(docs)
    out = Path(out_dir)
    ev = Path(eval_dir) if eval_dir is not None and params.eval_fraction > 0 else None
    _check_apart(files, out, ev)
    for d, option, split in ((out, "--out", "train"), (ev, "--eval-out", "eval")):
        if d is not None:
            _check_own(d, option, split)
    check_open_files(params.num_shards + (params.eval_shards if ev is not None else 0))
    with contextlib.ExitStack() as stack:
        for d, option in ((out, "--out"), (ev, "--eval-out")):
            if d is not None:
                # refused now, not after the corpus is read, when it cannot be written; removed again if this run fails
                stack.enter_context(output_dir(d, option))
                remove_stale(d)  # the spill and half-written shards of a killed run
        return _run_shards(files, vocab, out, ev, params, lowercase, log)


def _check_apart(files: Sequence[Path], out: Path, ev: Path | None) -> None:
    """--out, --eval-out and the documents in three places: one manifest.json per directory, and a reader of a
    directory takes every shard in it (eval shards in --out would be trained on)."""
    if ev is not None and ev.resolve() == out.resolve():
        raise UserError(f"--eval-out {ev} is --out: give the held-out shards a directory of their own")
    homes = {f.resolve().parent for f in files}
    for d, option in ((out, "--out"), (ev, "--eval-out")):
        if d is not None and d.resolve() in homes:
            raise UserError(f"{option} {d} holds the documents (--docs): write the shards to another directory")


def _check_own(d: Path, option: str, split: str) -> None:
    """--out/--eval-out may hold only what `data shards` wrote there for the same split: another command's
    manifest.json (documents, the other split) would be replaced, and .hdf5 files no bertforge run wrote would
    be overwritten or deleted as an earlier run's; refused before any work."""
    if not d.is_dir():
        return
    manifest = d / "manifest.json"
    if manifest.is_file():
        try:
            old = json.loads(manifest.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            old = None
        if not isinstance(old, dict) or old.get("split") != split or "params_hash" not in old:
            raise UserError(
                f"{option} {d} holds a manifest.json that `data shards` did not write for {split} shards "
                "(documents, held-out shards, or another tool's): choose an empty directory"
            )
    for f in sorted(d.glob("*.hdf5")):
        if f.name.startswith("."):  # a killed run's temporary shard: removed before this run writes
            continue
        try:
            ours = f.name.startswith(f"{split}_") and "bertforge_params" in read_attrs(f)
        except UserError:  # unreadable: not a shard this command finished
            ours = False
        if not ours:
            raise UserError(
                f"{option} {d} holds {f.name}, which `data shards` did not write there for {split} shards (files "
                "of your own, or of another step?): choose an empty directory, or move them away"
            )


def _run_shards(
    files: list[Path], vocab, out: Path, ev: Path | None, params: ShardsConfig, lowercase: bool | None, log
) -> dict[str, Any]:
    from bertforge.data.vocab import (
        casing_beyond_hash,
        load_tokenizer,
        special_ids,
        tokenizer_model,
        vocab_hash,
    )

    # load once here to fail early on a bad vocab (the workers load their own copy)
    tok = load_tokenizer(vocab, lowercase)
    vocab_sha256 = vocab_hash(vocab)
    casing = None if lowercase is not None else casing_beyond_hash(vocab, tok)  # a rewritten tokenizer.json's
    vocab_info = {
        "vocab": str(Path(vocab).resolve()),
        "vocab_sha256": vocab_sha256,
        "vocab_size": vocab_rows(tok),
        "special": special_ids(tok, vocab),
        "tokenizer_model": tokenizer_model(tok),
    }
    del tok
    phash = params_hash(params, vocab_sha256, _docs_signature(files), lowercase, casing)

    t0 = time.perf_counter()
    # hidden `.spill.tmp-PID`: the next run's remove_stale deletes it when this one is killed
    spill_dir = temp_name(out / "spill")
    spill_dir.mkdir(parents=True, exist_ok=True)
    jobs = _jobs(params, phash, out, ev, spill_dir, vocab, lowercase)
    n_workers = max(1, min(params.workers or (os.cpu_count() or 1), len(jobs)))
    try:
        # 1. stream the documents into per-shard spill files; 2. build the shards from them
        try:
            n_docs, n_chars = _spill(files, jobs, params)
        except OSError as e:
            raise_if_disk_full(e, spill_dir)
            raise
        if n_docs == 0:
            raise UserError(f"no documents in {', '.join(map(str, files[:3]))}: the corpus is empty")
        log(
            f"data shards: {n_docs} documents ({n_chars / 1e6:.1f} M chars) assigned to {len(jobs)} shards "
            f"in {time.perf_counter() - t0:.1f}s; building with {n_workers} worker(s)"
        )
        entries = _run_jobs(jobs, n_workers, log, t0)
    finally:
        shutil.rmtree(spill_dir, ignore_errors=True)
    wall = time.perf_counter() - t0
    # 3. the manifests
    result: dict[str, Any] = {"wall_s": wall}
    result.update(_write_manifests(params, phash, vocab_info, files, entries, {"train": out, "eval": ev}, log))
    total = sum(e["instances"] for e in entries)
    log(
        f"data shards: {total} instances in {len(entries)} shards, {wall:.1f}s "
        f"({n_docs / wall:,.0f} docs/s, {sum(e['tokens'] for e in entries) / wall / 1e6:.2f} M tokens/s)"
    )
    _warn_empty(entries, n_docs, log)
    return result


def _warn_empty(entries: list[dict[str, Any]], n_docs: int, log) -> None:
    """One line per split with shards that got no instances (a corpus too small for the shard count): training
    still works, but the user most likely meant fewer shards, and `--shards` is what to change."""
    # `data shards`' flag, and the key `data prepare` sets it with
    for kind, option, key in (("train", "--shards", "num_shards"), ("eval", "--eval-shards", "eval_shards")):
        mine = [e for e in entries if e["kind"] == kind]
        empty = sum(1 for e in mine if e["instances"] == 0)
        if empty:
            n = max(1, len(mine) - empty)
            log(
                f"data shards: warning: {empty} of {len(mine)} {kind} shards have no instances ({n_docs} documents "
                f"in all): use fewer shards ({option} {n}; data prepare: --set shards.{key}={n}) or a larger corpus"
            )


def _jobs(
    params: ShardsConfig,
    phash: str,
    out: Path,
    ev: Path | None,
    spill_dir: Path,
    vocab: str | os.PathLike,
    lowercase: bool | None,
) -> list[Job]:
    """One job per output shard: training shards train_I.hdf5 in out, eval shards eval_I.hdf5 in ev."""
    names = [("train", i, out / f"train_{i}.hdf5") for i in range(params.num_shards)]
    if ev is not None:
        names += [("eval", i, ev / f"eval_{i}.hdf5") for i in range(params.eval_shards)]
    return [
        Job(i, kind, str(spill_dir / f"{kind}_{i}.txt"), str(path), params.content(), phash, str(vocab), lowercase)
        for kind, i, path in names
    ]


def _write_manifests(
    params: ShardsConfig,
    phash: str,
    vocab_info: dict[str, Any],
    files: Sequence[Path],
    entries: list[dict[str, Any]],
    dirs: dict[str, Path | None],
    log=print,
) -> dict[str, Any]:
    """manifest.json of the training (and eval) directory: parameters, vocab, counts, a sha256 per shard."""
    sp = vocab_info["special"]
    kind = "mlm" if params.objective == "mlm" else "dynamic" if params.dynamic_masking else "nvidia"
    common = {
        "format": f"bertforge-{kind}" if kind != "nvidia" else "nvidia-hdf5",
        "kind": kind,
        "objective": params.objective,
        "params": params.content(),
        "seq_len": params.seq_len,
        "max_pred": slot_count(params),
        "masked_lm_prob": params.masked_lm_prob,
        "wwm": params.wwm,
        "vocab": vocab_info["vocab"],
        "vocab_sha256": vocab_info["vocab_sha256"],
        "vocab_size": vocab_info["vocab_size"],
        "tokenizer_model": vocab_info["tokenizer_model"],
        "special_ids": [sp.get("pad", 0), sp["cls"], sp["sep"]],
        "mask_id": sp["mask"],
        "params_hash": phash,
        "documents_source": [str(f.resolve()) for f in files],
    }
    result: dict[str, Any] = {}
    for kind, d in dirs.items():
        if d is None:
            continue
        mine = sorted((e for e in entries if e["kind"] == kind), key=lambda e: e["index"])
        manifest = dict(
            common,
            split=kind,
            shards=mine,
            instances=sum(e["instances"] for e in mine),
            documents=sum(e["documents"] for e in mine),
            tokens=sum(e["tokens"] for e in mine),
        )
        shardio.write_manifest(d, manifest)
        if gone := remove_earlier(d, f"{kind}_", ".hdf5", [e["file"] for e in mine]):
            log(f"data shards: removed {', '.join(gone)} in {d}, written by an earlier run with more shards")
        result[kind] = manifest
    return result


def _spill(files: Sequence[Path], jobs: Sequence[Job], params: ShardsConfig) -> tuple[int, int]:
    """Assign each document to a shard (seeded) and append it to that shard's spill file."""
    n_train = params.num_shards
    n_eval = sum(1 for j in jobs if j.kind == "eval")
    rng = np.random.default_rng([params.seed, 2**31])  # the assignment stream, separate from the shards'
    handles = [open(j.spill, "w", encoding="utf-8", buffering=1 << 20) for j in jobs]
    n_docs = n_chars = 0
    try:
        draws: Iterator[list[float]] = iter(())
        for text in iter_documents(files):
            try:
                u, v = next(draws)
            except StopIteration:
                block = rng.random((ASSIGN_DRAWS, 2))
                draws = iter(block.tolist())
                u, v = next(draws)
            if n_eval and u < params.eval_fraction:
                k = n_train + int(v * n_eval)
            else:
                k = int(v * n_train)
            handles[k].write(text)
            handles[k].write("\n\n")
            n_docs += 1
            n_chars += len(text)
    finally:
        for h in handles:
            h.close()
    return n_docs, n_chars


def _worker_init() -> None:
    # one worker per core: tokenizers' own thread pool would only oversubscribe the cores
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    quiet_worker()


def _run_jobs(jobs: Sequence[Job], n_workers: int, log, t0: float) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    done_tokens = 0
    progress = Progress("data shards", len(jobs), "shards", log, every_s=0)

    def report(e: dict[str, Any]) -> None:
        # shards a resumed run finds finished took no time here: left out of every rate (and the ETA)
        nonlocal done_tokens
        entries.append(e)
        done_tokens += 0 if e["skipped"] else e["tokens"]
        el = time.perf_counter() - t0
        docs = sum(x["documents"] for x in entries if not x["skipped"])
        progress.update(
            note=f"{e['file']}: {e['instances']} instances{' (kept, already finished)' if e['skipped'] else ''} | "
            f"{docs / el:,.0f} docs/s | {done_tokens / el / 1e6:.2f} M tokens/s",
            kept=e["skipped"],
        )

    if n_workers == 1:
        for j in jobs:
            report(build_shard(j))
        return entries
    saved = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # before forking: no tokenizer thread pool in the children
    try:
        with WorkerPool(n_workers, _worker_init) as pool:
            # largest spill first: better load balance
            order = sorted(jobs, key=lambda j: -os.path.getsize(j.spill))
            for e in pool.map(build_shard, order, ordered=False):
                report(e)
    finally:
        if saved is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = saved
    return entries
