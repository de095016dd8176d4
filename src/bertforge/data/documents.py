"""Raw documents -> clean documents: one sentence per line, a blank line between documents, in text shards.

Cleaning, per document: Unicode NFC normalisation; control characters dropped; runs of whitespace collapsed;
each paragraph split into sentences with Bling Fire (`blingfire.text_to_sentences`, a fast maintained
segmenter); documents shorter than `min_doc_chars` dropped. Document i of the stream goes to text shard
i mod num_shards, so the output is fixed by the input and the shard count.

Wikipedia wikitext is converted to prose (mwparserfromhell, `sources.wikitext_to_text`) in a pool of worker
processes, a bounded batch of pages at a time. Shards are written under temporary names and renamed at the
end; `manifest.json` records the source, the counts and the settings, and a re-run with the same settings
skips the work.
"""

from __future__ import annotations

import functools
import json
import multiprocessing as mp
import os
import re
import time
import unicodedata
from pathlib import Path
from typing import Callable, Iterable, Iterator

from bertforge.data import sources
from bertforge.errors import UserError
from bertforge.runtime.io import commit, temp_name, write_text

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u200b-\u200f\u2028\u2029\ufeff\ufffd]")
_SPACES = re.compile(r"[ \t\u00a0\u2000-\u200a\u202f\u205f\u3000]+")
BATCH = 256
"""Documents cleaned per task batch (bounds the memory of the parallel stage)."""


def clean_document(text: str) -> list[str]:
    """One raw document -> its sentences (already stripped, no empty ones)."""
    import blingfire

    text = unicodedata.normalize("NFC", text)
    text = _CONTROL.sub("", text)
    out: list[str] = []
    for para in re.split(r"\n\s*\n|\n", text):
        para = _SPACES.sub(" ", para).strip()
        if not para:
            continue
        for sent in blingfire.text_to_sentences(para).split("\n"):
            sent = sent.strip()
            if sent:
                out.append(sent)
    return out


def _clean_wiki(item: tuple[str, str], drop_prefixes: tuple[str, ...] = ()) -> list[str]:
    return clean_document(sources.wikitext_to_text(item[1], drop_prefixes))


def _clean_plain(item: tuple[str, str]) -> list[str]:
    return clean_document(item[1])


def _batches(it: Iterable, n: int) -> Iterator[list]:
    batch = []
    for x in it:
        batch.append(x)
        if len(batch) >= n:
            yield batch
            batch = []
    if batch:
        yield batch


def write_documents(
    docs: Iterable[tuple[str, str]],
    out_dir: str | os.PathLike,
    num_shards: int = 8,
    min_doc_chars: int = 200,
    wikitext: bool = False,
    workers: int | None = None,
    source: str = "",
    log: Callable[[str], None] = print,
    drop_prefixes: tuple[str, ...] = (),
) -> dict:
    """Clean `docs` ((title, text) pairs) and write docs_{i}.txt shards + manifest.json into out_dir."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise UserError(f"output directory {out} is not writable ({e.strerror}); choose another --out") from e
    if num_shards < 1:
        raise UserError(f"--shards must be at least 1, got {num_shards}")
    settings = {"source": source, "num_shards": num_shards, "min_doc_chars": min_doc_chars}
    manifest_path = out / "manifest.json"
    if manifest_path.is_file():
        try:
            old = json.loads(manifest_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            old = {}
        if old.get("settings") == settings and all((out / f).is_file() for f in old.get("files", [])):
            log(f"data docs: {out} is up to date ({old.get('documents')} documents); delete it to rebuild")
            return old
    names = [f"docs_{i}.txt" for i in range(num_shards)]
    tmps = [temp_name(out / n) for n in names]
    handles = [open(t, "w", encoding="utf-8") for t in tmps]
    fn = functools.partial(_clean_wiki, drop_prefixes=drop_prefixes) if wikitext else _clean_plain
    n_workers = max(1, min(workers or (os.cpu_count() or 1), 32))
    counts = {"documents": 0, "sentences": 0, "chars": 0, "dropped_short": 0, "raw_documents": 0}
    t0 = time.perf_counter()
    last = t0
    pool = None
    try:
        if n_workers > 1:
            pool = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn").Pool(n_workers)
        for batch in _batches(docs, BATCH):
            counts["raw_documents"] += len(batch)
            results = pool.map(fn, batch, chunksize=8) if pool else [fn(b) for b in batch]
            for sents in results:
                chars = sum(len(s) for s in sents)
                if chars < min_doc_chars:
                    counts["dropped_short"] += 1
                    continue
                h = handles[counts["documents"] % num_shards]
                h.write("\n".join(sents))
                h.write("\n\n")
                counts["documents"] += 1
                counts["sentences"] += len(sents)
                counts["chars"] += chars
            now = time.perf_counter()
            if now - last > 5:
                last = now
                log(f"  {counts['raw_documents']} documents read | {counts['raw_documents'] / (now - t0):,.0f} docs/s")
        for h in handles:
            h.close()
        if counts["documents"] == 0:
            raise UserError(
                f"the corpus {source or '(input)'} gave no documents of at least {min_doc_chars} characters "
                f"({counts['raw_documents']} read): it is empty or too short"
            )
        for t, n in zip(tmps, names):
            commit(t, out / n)
    finally:
        if pool is not None:
            pool.terminate()
        for h in handles:
            h.close()
        for t in tmps:
            t.unlink(missing_ok=True)
    wall = time.perf_counter() - t0
    manifest = dict(counts, settings=settings, files=names, seconds=round(wall, 2))
    write_text(manifest_path, json.dumps(manifest, indent=2) + "\n")
    log(f"data docs: {counts['documents']} documents, {counts['sentences']} sentences, "
        f"{counts['chars'] / 1e6:.1f} M chars -> {out} in {wall:.1f}s "
        f"({counts['raw_documents'] / max(wall, 1e-9):,.0f} docs/s)")
    return manifest


def run_docs(source: str, out_dir: str | os.PathLike, num_shards: int = 8, min_doc_chars: int = 200,
             one_doc_per_file: bool = False, workers: int | None = None, log=print) -> dict:
    """`bertforge data docs`: any source except dumps' wikitext cleaning is plain text cleaning."""
    is_dump = source.endswith((".xml", ".xml.bz2"))
    if is_dump:
        return run_wiki(source, out_dir, num_shards, min_doc_chars, workers, log)
    docs = sources.iter_source(source, one_doc_per_file=one_doc_per_file)
    return write_documents(docs, out_dir, num_shards, min_doc_chars, False, workers, source, log)


def run_wiki(dump: str | os.PathLike, out_dir: str | os.PathLike, num_shards: int = 8, min_doc_chars: int = 200,
             workers: int | None = None, log=print) -> dict:
    """`bertforge data wiki`: a pages-articles dump -> clean documents (wikitext parsed in worker processes)."""
    prefixes = sources.non_article_prefixes(sources.dump_namespaces(dump)) if Path(dump).is_file() else ()
    return write_documents(sources.iter_wiki_dump(dump), out_dir, num_shards, min_doc_chars, True, workers,
                           str(dump), log, drop_prefixes=prefixes)
