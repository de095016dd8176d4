"""Raw documents -> clean documents: one sentence per line, a blank line between documents, in text shards.

Cleaning, per document: Unicode NFC normalisation; control characters dropped; runs of whitespace collapsed;
each paragraph split into sentences with Bling Fire (`blingfire.text_to_sentences`, a fast maintained
segmenter); empty documents, and those shorter than `min_doc_chars`, dropped. Document i of the stream goes to
text shard i mod num_shards, so the output is fixed by the input and the shard count.

Wikipedia (`run_wiki`): the dump is cut into chunks of whole pages (`wikidump`); worker processes
(`workers.WorkerPool`: one chunk each in flight, one read ahead) turn each chunk's wikitext into prose
(`wikiclean`, linear in the page size), clean it as above and write it as one part file `parts/part_K.txt`
(atomically: a part either is complete or is absent).
When every part is there, their documents are dealt round-robin into the text shards, which are renamed into
place together; the manifest is written last and the parts removed. A killed run, run again with the same
settings, keeps the complete parts and does only the missing ones; the documents come out the same.
`manifest.json` records the source, the counts and the settings, and a re-run with the same settings skips
the work.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import glob
import itertools
import json
import os
import re
import shutil
import time
import unicodedata
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bertforge.data import sources, wikiclean, wikidump
from bertforge.data.workers import bounded_map
from bertforge.errors import UserError
from bertforge.runtime.io import (
    check_open_files,
    commit,
    raise_if_disk_full,
    remove_earlier,
    remove_stale,
    temp_name,
    writable_dir,
    write_text,
)

if TYPE_CHECKING:
    import ctypes

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u200b-\u200f\u2028\u2029\ufeff\ufffd]")
_WIDE_SPACE_CHARS = "\t\u00a0\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u202f\u205f\u3000"
_WIDE_SPACES = re.compile(f"[{_WIDE_SPACE_CHARS}]+")
# line breaks other than "\n" (what str.splitlines() also breaks at): a lone "\r" (old Mac text, a Hugging Face
# row) kept inside a sentence is a line break to every reader of the documents (universal newlines), and "\r\r" a
# blank line, i.e. a document boundary; dropping "\x0c", "\u2028", ... instead would glue the words around them
_LINE_BREAKS = re.compile("\r\n?|[\x0b\x0c\x1c-\x1e\x85\u2028\u2029]")
BATCH = 256
"""Documents cleaned per task batch (bounds the memory of the parallel stage)."""
CHUNK_BYTES = 4 << 20
"""Uncompressed dump XML per wiki chunk (one part file, one task)."""
CLEANER = "wikiclean-1"
"""Recorded in a wiki manifest's settings: a new cleaner rebuilds documents made by an old one."""
HEADINGS = "stacked"
"""Recorded in a `--headings` wiki manifest's settings: documents written before headings were stacked as
WikiExtractor stacks them (only the innermost heading was kept) are rebuilt; runs without --headings, whose
documents did not change, are not."""
MARKUP_READERS = {"wikitext": CLEANER, "wikiextractor": "wikiextractor-2"}
"""Recorded in a docs manifest's settings for a directory or glob read out of markup (`sources.markup`): the
documents of a reader before these (raw wikitext of dumps found there, WikiExtractor's `&amp;`, its articles
with a `revid`) are rebuilt."""


class _Sentences:
    """Bling Fire's sentence splitter called through its C entry point with one reused output buffer: the same
    output as `blingfire.text_to_sentences`, without a fresh zeroed buffer per paragraph (40% of its time on
    Wikipedia's short paragraphs)."""

    def __init__(self) -> None:
        import ctypes
        import importlib.util

        spec = importlib.util.find_spec("blingfire")
        if spec is None:  # a broken install: say so once, before any worker starts (not a worker's traceback)
            raise UserError(
                "the sentence splitter needs blingfire, a bertforge dependency not installed here: "
                "pip install blingfire"
            )
        lib = Path(next(iter(spec.submodule_search_locations or []), "")) / "libblingfiretokdll.so"
        if lib.is_file():  # the library alone: `import blingfire` also imports numpy (60 ms)
            self.fn = ctypes.CDLL(str(lib)).TextToSentences
        else:  # other platforms' library names: let the package find it
            import blingfire

            self.fn = blingfire.blingfire.TextToSentences
        self.ctypes, self.size = ctypes, 0
        self.buf: ctypes.Array[ctypes.c_char] | None = None

    def __call__(self, text: str) -> str:
        data = text.encode("utf-8")
        need = 2 * len(data) + 16
        buf = self.buf
        if buf is None or need > self.size:  # None only before the first call (size 0)
            self.size = max(need, 1 << 16)
            buf = self.buf = self.ctypes.create_string_buffer(self.size)
        n = self.fn(data, len(data), buf, self.size)
        if n <= 0 or n > self.size:
            return ""
        return self.ctypes.string_at(buf, n - 1).decode("utf-8")  # n counts the terminating NUL


@functools.lru_cache(maxsize=1)
def _splitter() -> _Sentences:
    return _Sentences()


def clean_document(text: str) -> list[str]:
    """One raw document -> its sentences (already stripped, no empty ones)."""
    split = _splitter()
    if any(c in text for c in "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"):
        text = _LINE_BREAKS.sub("\n", text)
    text = _CONTROL.sub("", unicodedata.normalize("NFC", text))
    # runs of spaces -> one space: wide spaces (rare) by a regex, then plain ones by C string passes (a regex
    # visiting every space costs 5x more)
    if any(c in text for c in _WIDE_SPACE_CHARS):  # one C scan per character: 6x faster than a regex search
        text = _WIDE_SPACES.sub(" ", text)
    while "  " in text:
        text = text.replace("  ", " ")
    out: list[str] = []
    for para in text.split("\n"):
        para = para.strip()
        if not para:
            continue
        for sent in split(para).split("\n"):
            sent = sent.strip()
            if sent:
                out.append(sent)
    return out


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


def _map_batch(fn: Callable, batch: list) -> list:
    return [fn(x) for x in batch]


class ShardWriter:
    """Documents dealt round-robin into `num_shards` text shards written under temporary names; `commit` renames
    them all into place, and leaving the `with` block without committing removes them."""

    def __init__(self, out: Path, num_shards: int):
        self.names = [f"docs_{i}.txt" for i in range(num_shards)]
        self.out, self.tmps = out, [temp_name(out / n) for n in self.names]
        self.handles = [open(t, "w", encoding="utf-8") for t in self.tmps]
        self.count = 0

    def write(self, doc: str) -> None:
        """One document: its sentences, one per line, no blank line inside."""
        h = self.handles[self.count % len(self.handles)]
        h.write(doc)
        h.write("\n\n")
        self.count += 1

    def commit(self) -> None:
        for h in self.handles:
            h.close()
        for t, n in zip(self.tmps, self.names):
            commit(t, self.out / n)

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        for h in self.handles:
            with contextlib.suppress(OSError):  # closing flushes: on a full disk it fails again
                h.close()
        for t in self.tmps:
            t.unlink(missing_ok=True)
        if exc is not None:
            raise_if_disk_full(exc, self.out)


def _output_dir(out_dir: str | os.PathLike, num_shards: int, source: str = "") -> Path:
    if num_shards < 1:
        raise UserError(f"--shards must be at least 1, got {num_shards}")
    check_open_files(num_shards)  # one file open per shard while documents are written
    _check_outside(Path(out_dir), source)
    out = writable_dir(out_dir, "--out")
    _check_foreign(out)
    remove_stale(out)  # temporary shards of a killed run (hidden, but `*.txt` globs would see them)
    return out


_SHARD_NAME = re.compile(r"docs_\d+\.txt")


def _check_outside(out: Path, source: str) -> None:
    """--out where --source would find its documents on the next run (inside the directory it reads, holding
    files its glob matches, or under a recursive glob's folder): each re-run would add the last one's documents
    and manifest to the corpus again."""
    if not source or source.startswith(("hf:", "builtin:")):
        return
    here, src = out.resolve(), Path(source)
    if src.is_dir():
        inside = here == src.resolve() or src.resolve() in here.parents
    elif src.is_file():  # reads only that file, whatever --out holds beside it
        inside = False
    else:  # a glob
        named = [h.resolve() for h in sources.local_files(source)]
        folders = [h for h in named if h.is_dir()]  # read whole, as a directory source
        base = Path(*itertools.takewhile(lambda part: not glob.has_magic(part), src.parts)).resolve()
        inside = (
            any(here in h.parents for h in named if h.is_file())
            or any(here == d or d in here.parents for d in folders)
            or _glob_names(Path(os.path.abspath(out)), source)  # a new --out the glob names on the next run
            or ("**" in source and (here == base or base in here.parents))
        )
    if inside:
        raise UserError(
            f"--out {out} is inside what --source {source} reads: the next run would read these documents as its "
            "corpus; choose an --out outside it"
        )


def _glob_names(path: Path, pattern: str) -> bool:
    """Whether a non-recursive glob names `path` or a folder above it, existing or not (glob's `*` skips hidden
    names)."""
    pat = Path(os.path.abspath(pattern)).parts
    return any(
        len(p.parts) == len(pat)
        and all(
            fnmatch.fnmatchcase(a, b) and (b.startswith(".") or not a.startswith(".")) for a, b in zip(p.parts, pat)
        )
        for p in (path, *path.parents)
    )


def _check_foreign(out: Path) -> None:
    """docs_N.txt files in `out` that its manifest.json does not list were not written by this command: a run
    would replace them (or remove them as an earlier run's), so it is refused before any work."""
    if (out / "manifest.json").is_file() and sources.listed_files(out) is None:  # shards' (or another tool's) manifest
        raise UserError(
            f"--out {out} holds a manifest.json that `data docs` did not write (shards?): choose an empty --out"
        )
    listed = set(sources.listed_files(out) or [])
    foreign = [p.name for p in out.iterdir() if _SHARD_NAME.fullmatch(p.name) and p.name not in listed]
    foreign.sort(key=lambda n: (len(n), n))
    if foreign:
        more = f" and {len(foreign) - 2} more" if len(foreign) > 2 else ""
        raise UserError(
            f"--out {out} holds {', '.join(foreign[:2])}{more}, which no manifest.json of `bertforge data` lists "
            "(files of your own?): this run would replace them; choose an empty --out, or move them away"
        )


def _up_to_date(out: Path, settings: dict, log: Callable[[str], None], command: str = "data docs") -> dict | None:
    """The manifest of an earlier run with the same settings whose files are all there, else None."""
    manifest_path = out / "manifest.json"
    if not manifest_path.is_file():
        return None
    try:
        old = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if old.get("settings") == settings and all((out / f).is_file() for f in old.get("files", [])):
        log(f"{command}: {out} is up to date ({old.get('documents')} documents); delete it to rebuild")
        return old
    return None


def _finish(out: Path, writer: ShardWriter, counts: dict, settings: dict, t0: float, log) -> dict:
    """Commit the shards (refusing an empty corpus) and write the manifest last."""
    if counts["documents"] == 0:
        shutil.rmtree(out / "parts", ignore_errors=True)  # `data wiki`'s resumable parts: nothing to resume
        raise UserError(
            f"the corpus {settings['source'] or '(input)'} gave no documents of at least {settings['min_doc_chars']} "
            f"characters ({counts['raw_documents']} read): it is empty or too short"
        )
    writer.commit()
    wall = time.perf_counter() - t0
    manifest = dict(counts, settings=settings, files=writer.names, seconds=round(wall, 2))
    write_text(out / "manifest.json", json.dumps(manifest, indent=2) + "\n")
    if gone := remove_earlier(out, "docs_", ".txt", writer.names):
        log(f"data docs: removed {', '.join(gone)}, written by an earlier run with more --shards")
    log(
        f"data docs: {counts['documents']} documents, {counts['sentences']} sentences, "
        f"{counts['chars'] / 1e6:.1f} M chars -> {out} in {wall:.1f}s "
        f"({counts['raw_documents'] / max(wall, 1e-9):,.0f} docs/s)"
    )
    return manifest


def _workers(workers: int | None) -> int:
    return max(1, min(workers or (os.cpu_count() or 1), 32))


def write_documents(
    docs: Iterable[tuple[str, str]],
    out_dir: str | os.PathLike,
    num_shards: int = 8,
    min_doc_chars: int = 200,
    workers: int | None = None,
    source: str = "",
    log: Callable[[str], None] = print,
    reading: dict | None = None,
) -> dict:
    """Clean `docs` ((title, text) pairs) and write docs_{i}.txt shards + manifest.json into out_dir; `reading`:
    how the source was read, recorded with the settings (a re-run reading it otherwise rebuilds)."""
    out = _output_dir(out_dir, num_shards, source)
    settings = {"source": source, "num_shards": num_shards, "min_doc_chars": min_doc_chars, **(reading or {})}
    old = _up_to_date(out, settings, log)
    if old is not None:
        return old
    counts = {"documents": 0, "sentences": 0, "chars": 0, "dropped_short": 0, "raw_documents": 0}
    _splitter()  # Bling Fire loaded once here, shared by the forked workers
    t0 = last = time.perf_counter()
    with ShardWriter(out, num_shards) as writer:
        for sents_batch in bounded_map(
            functools.partial(_map_batch, _clean_plain), _batches(docs, BATCH), _workers(workers)
        ):
            for sents in sents_batch:
                counts["raw_documents"] += 1
                chars = sum(len(s) for s in sents)
                # an empty document (a blank row, an article of templates alone) is none, --min-doc-chars 0 too:
                # written, it was a counted document that is only more blank lines in the text shard
                if not sents or chars < min_doc_chars:
                    counts["dropped_short"] += 1
                    continue
                writer.write("\n".join(sents))
                counts["documents"] += 1
                counts["sentences"] += len(sents)
                counts["chars"] += chars
            now = time.perf_counter()
            if now - last > 5:
                last = now
                log(f"  {counts['raw_documents']} documents read | {counts['raw_documents'] / (now - t0):,.0f} docs/s")
        return _finish(out, writer, counts, settings, t0, log)


def run_docs(
    source: str,
    out_dir: str | os.PathLike,
    num_shards: int = 8,
    min_doc_chars: int = 200,
    one_doc_per_file: bool = False,
    workers: int | None = None,
    log=print,
) -> dict:
    """`bertforge data docs`: one dump is `data wiki`'s (parallel chunks); any other source is read by `sources`
    (the dumps of a directory or glob cleaned there, as `data wiki` cleans them) and cleaned as plain text."""
    one_dump = sources.is_wiki_dump(source) or (source.endswith(".bz2") and "multistream" in source)
    if one_dump and not glob.has_magic(source):
        return run_wiki(source, out_dir, num_shards, min_doc_chars, workers, log)
    docs = sources.iter_source(source, one_doc_per_file=one_doc_per_file)
    reading = {"one_doc_per_file": one_doc_per_file, "inputs": sources.signature(source)}
    if kind := sources.markup(source):
        reading["cleaner"] = MARKUP_READERS[kind]
    if not Path(source).exists() and any(p.is_dir() for p in sources.local_files(source)):
        # a glob naming folders: the documents of a version that skipped the folders' files are rebuilt
        reading["glob_folders"] = "read"
    return write_documents(docs, out_dir, num_shards, min_doc_chars, workers, source, log, reading)


# ------------------------------------------------------------------------------------------- Wikipedia
_PART_KEYS = (
    "pages",
    "redirects",
    "other_namespaces",
    "raw_documents",
    "dropped_short",
    "documents",
    "sentences",
    "chars",
)


@dataclass(frozen=True)
class _WikiJob:
    dump: wikidump.Dump
    parts: Path
    prefixes: tuple[str, ...]
    min_doc_chars: int
    headings: bool


def _part_counts(path: Path) -> dict | None:
    """The counts a complete part file starts with, or None when it is absent (or not ours)."""
    try:
        with open(path, encoding="utf-8") as f:
            head = json.loads(f.readline())
    except (OSError, ValueError):
        return None
    return head if isinstance(head, dict) and set(_PART_KEYS) <= set(head) else None


def _wiki_chunk(job: _WikiJob, item: tuple[int, bytes | tuple[int, int], int]) -> dict:
    """One chunk of the dump -> one part file (counts on its first line, then its documents); returns the counts
    and how far into the dump (compressed bytes) the chunk ends. A part already complete is not redone."""
    k, payload, pos = item
    path = job.parts / f"part_{k:06d}.txt"
    counts = _part_counts(path)
    resumed = counts is not None
    if counts is None:
        counts = dict.fromkeys(_PART_KEYS, 0)
        docs = []
        for page in wikidump.parse_pages(wikidump.chunk_xml(job.dump, payload)):
            counts["pages"] += 1
            if page.redirect or page.ns != 0:
                counts["redirects" if page.redirect else "other_namespaces"] += 1
                continue
            counts["raw_documents"] += 1
            sents = clean_document(wikiclean.clean_wikitext(page.text, job.prefixes, job.headings))
            chars = sum(map(len, sents))
            if not sents or chars < job.min_doc_chars:  # an empty article is none, --min-doc-chars 0 too
                counts["dropped_short"] += 1
                continue
            docs.append("\n".join(sents) + "\n\n")
            counts["documents"] += 1
            counts["sentences"] += len(sents)
            counts["chars"] += chars
        write_text(path, json.dumps(counts) + "\n" + "".join(docs))
    return dict(counts, done=k, pos=pos, resumed=resumed)


class _Progress:
    """A line every `every` seconds: pages/s, MB/s of the (compressed) dump, ETA from the dump's size."""

    def __init__(self, total: int, log: Callable[[str], None], every: float = 5.0):
        self.total, self.log, self.every = total, log, every
        self.t0 = self.last = time.perf_counter()
        self.pos0 = self.pages = 0

    def update(self, pos: int, pages: int, resumed: bool = False) -> None:
        if resumed:  # parts kept from a killed run: not speed
            if not self.pages:
                self.pos0, self.t0 = pos, time.perf_counter()
            return
        self.pages += pages
        now = time.perf_counter()
        if now - self.last < self.every:
            return
        self.last = now
        rate = (pos - self.pos0) / max(now - self.t0, 1e-9)
        eta = (self.total - pos) / rate if rate > 0 else float("inf")
        self.log(
            f"  {pos / 1e6:,.0f}/{self.total / 1e6:,.0f} MB | {self.pages / (now - self.t0):,.0f} pages/s | "
            f"{rate / 1e6:.2f} MB/s | ETA {eta / 60:,.1f} min"
        )


def _extract_parts(job: _WikiJob, chunk_bytes: int, workers: int, log) -> dict:
    """Every part file of the dump, done in worker processes (complete ones from an earlier run kept)."""
    d = job.dump
    chunks = wikidump.stream_chunks(d, chunk_bytes) if d.index else wikidump.plain_chunks(d, chunk_bytes, log)
    items = ((k, payload, pos) for k, (payload, pos) in enumerate(chunks))
    counts = dict.fromkeys(_PART_KEYS, 0)
    progress = _Progress(d.size, log)
    for res in bounded_map(functools.partial(_wiki_chunk, job), items, workers):
        for key in _PART_KEYS:
            counts[key] += res[key]
        progress.update(res["pos"], res["pages"], res["resumed"])
        counts["parts"] = res["done"] + 1
    return counts


def _merge_parts(parts: Path, writer: ShardWriter, n_parts: int) -> None:
    for k in range(n_parts):
        with open(parts / f"part_{k:06d}.txt", encoding="utf-8") as f:
            f.readline()
            for doc in f.read().split("\n\n"):
                if doc:
                    writer.write(doc)


def _parts_dir(out: Path, settings: dict) -> Path:
    """out/parts, kept from a killed run with the same settings, else fresh."""
    parts = out / "parts"
    stamp = json.dumps(settings, sort_keys=True)
    if parts.is_dir() and not (
        (parts / "settings.json").is_file() and (parts / "settings.json").read_text(encoding="utf-8") == stamp
    ):
        shutil.rmtree(parts)
    parts.mkdir(exist_ok=True)
    remove_stale(parts)
    write_text(parts / "settings.json", stamp)
    return parts


def run_wiki(
    dump: str | os.PathLike,
    out_dir: str | os.PathLike,
    num_shards: int = 8,
    min_doc_chars: int = 200,
    workers: int | None = None,
    log=print,
    index: str | os.PathLike | None = None,
    chunk_bytes: int = CHUNK_BYTES,
    headings: bool = False,
) -> dict:
    """`bertforge data wiki`: a pages-articles dump (.xml, .xml.bz2, or multistream .bz2 with its index) ->
    clean documents, in parallel, resumable; the manifest carries the page counts (kept, redirects, other
    namespaces, too short)."""
    out = _output_dir(out_dir, num_shards)
    d = wikidump.open_dump(dump, index)
    settings = {
        "source": str(dump),
        "num_shards": num_shards,
        "min_doc_chars": min_doc_chars,
        "headings": headings,
        "cleaner": CLEANER,
        "inputs": sources.signature(str(d.path)),  # a dump replaced at the same path is another corpus
    }
    if headings:
        settings["heading_style"] = HEADINGS
    old = _up_to_date(out, settings, log, "data wiki")
    if old is not None:
        shutil.rmtree(out / "parts", ignore_errors=True)
        return old
    t0 = time.perf_counter()
    prefixes = sources.non_article_prefixes(wikidump.header_namespaces(wikidump.read_header(d)))
    _splitter()  # Bling Fire loaded once here, shared by the forked workers
    stat = d.path.stat()  # a different dump at the same path must not reuse the parts of the old one
    # the parts hold each chunk's cleaned documents, dealt into shards only at the merge: --shards is not theirs
    part_settings = {k: v for k, v in settings.items() if k != "num_shards"}
    parts = _parts_dir(
        out,
        dict(
            part_settings,
            chunk_bytes=chunk_bytes,
            index=str(d.index),
            dump_bytes=stat.st_size,
            dump_mtime_ns=stat.st_mtime_ns,
        ),
    )
    chunks = -(-d.size * (4 if d.compressed else 1) // chunk_bytes)  # about, from bz2's usual 4:1 and more
    n_workers = min(_workers(workers), max(1, chunks))  # no processes to start for a one-chunk dump
    log(
        f"data wiki: {d.path} ({d.size / 1e6:,.1f} MB{', multistream, ' + d.index.name if d.index else ''}) "
        f"-> {out}, {n_workers} workers"
    )
    counts = _extract_parts(_WikiJob(d, parts, prefixes, min_doc_chars, headings), chunk_bytes, n_workers, log)
    with ShardWriter(out, num_shards) as writer:
        _merge_parts(parts, writer, counts.get("parts", 0))
        manifest = _finish(out, writer, counts, settings, t0, log)
    shutil.rmtree(parts, ignore_errors=True)
    log(
        f"data wiki: {counts['pages']} pages: {counts['documents']} documents kept, {counts['redirects']} redirects "
        f"and {counts['other_namespaces']} pages of other namespaces skipped, {counts['dropped_short']} articles "
        f"dropped as shorter than {min_doc_chars} characters"
    )
    return manifest
