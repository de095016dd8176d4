"""Reading a MediaWiki pages-articles dump in chunks of whole pages, for `bertforge data wiki`.

A dump is cut into chunks at page boundaries fixed by its content alone (so a resumed run cuts the same chunks):

- `.xml` / `.xml.bz2` (one bz2 stream): the main process decompresses and cuts a chunk at the first `</page>` that
  ends at or after `chunk_bytes` of XML; the chunk's bytes go to a worker.
- `...-multistream.xml.bz2` with its index (`...-multistream-index.txt.bz2`, found beside the dump or given): the
  index lists the byte offset of every bz2 stream of ~100 pages; a chunk is a run of whole streams whose
  compressed size reaches `chunk_bytes / 4`, and the worker reads and decompresses its own byte range — the
  decompression runs on every core, which is what that format is for.

Workers turn a chunk's XML into pages with string scanning (`parse_pages`): the dump's writer always emits the
same element layout, so no general XML parser is needed; entities are decoded.
"""

from __future__ import annotations

import bz2
import itertools
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bertforge.errors import UserError

_NAMESPACE = re.compile(rb'<namespace key="(-?\d+)"[^>]*?(?:/>|>([^<]*)</namespace>)')
_TITLE = re.compile(r"<title>([^<]*)</title>")
_NS = re.compile(r"<ns>\s*(-?\d+)\s*</ns>")
# what MediaWiki's XML writer escapes; anything else (&#039;) is left for the cleaner's HTML entity decoding
_XML_ENTITIES = (("&lt;", "<"), ("&gt;", ">"), ("&quot;", '"'))


@dataclass(frozen=True)
class Page:
    ns: int
    title: str
    text: str
    redirect: bool


@dataclass(frozen=True)
class Dump:
    path: Path
    compressed: bool
    index: Path | None  # a multistream dump's index: chunks are read and decompressed by the workers
    size: int  # bytes on disk, for progress and ETA


def open_dump(path: str | os.PathLike, index: str | os.PathLike | None = None) -> Dump:
    """Check the dump (and find a multistream dump's index beside it) before any work starts."""
    p = Path(path)
    if p.is_dir():
        raise UserError(
            f"Wikipedia dump {p} is a directory; pass the pages-articles .xml or .xml.bz2 file (WikiExtractor "
            "output and text files go to `bertforge data docs --source`)"
        )
    if not p.is_file():
        raise UserError(f"Wikipedia dump {p} does not exist")
    compressed = p.name.endswith(".bz2")
    if index is None and compressed and "multistream" in p.name:
        guess = p.with_name(p.name.replace("multistream.xml", "multistream-index.txt"))
        index = guess if guess != p and guess.is_file() else None
    if index is not None and not Path(index).is_file():
        raise UserError(f"multistream index {index} does not exist")
    dump = Dump(p, compressed, Path(index) if index else None, p.stat().st_size)
    if dump.index is not None:
        _check_index(dump)
    return dump


def _check_index(dump: Dump, streams: int = 3) -> None:
    """The index's first offsets must start bz2 streams of this dump: another dump's index (another month's, or
    another wiki's) would otherwise fail chunks into the run as if the dump were corrupt."""
    assert dump.index is not None
    try:
        offsets = list(itertools.islice(_index_offsets(dump.index), streams))
    except (OSError, EOFError) as e:
        raise UserError(f"multistream index {dump.index} is corrupt or truncated ({e})") from e
    if not offsets:
        raise UserError(
            f"multistream index {dump.index} lists no streams (offset:page_id:title lines); give the dump's own "
            "index with --index"
        )
    with open(dump.path, "rb") as f:
        for off in offsets:
            f.seek(off)
            if off >= dump.size or f.read(3) != b"BZh":
                raise _not_its_index(dump, off)


def _not_its_index(dump: Dump, offset: int) -> UserError:
    return UserError(
        f"multistream index {dump.index} does not fit dump {dump.path}: its offset {offset} is not the start of a "
        f"bz2 stream in the dump's {dump.size} bytes; give the dump's own index with --index"
    )


def _unescape(s: str) -> str:
    if "&" not in s:
        return s
    for a, b in _XML_ENTITIES:
        s = s.replace(a, b)
    return s.replace("&amp;", "&")  # last: "&amp;lt;" is the wikitext "&lt;", decoded later by the cleaner


def parse_pages(xml: str) -> Iterator[Page]:
    """The `<page>` elements of a piece of dump XML (whole pages; text before the first one is ignored)."""
    for piece in xml.split("</page>")[:-1]:  # what follows the last </page> is no whole page
        start = piece.find("<page>")
        if start < 0:
            continue
        t, n = _TITLE.search(piece, start), _NS.search(piece, start)
        i = piece.find("<text", start)
        text = ""
        if i >= 0:
            j = piece.find(">", i)
            if piece[j - 1] != "/":
                k = piece.rfind("</text>")
                text = _unescape(piece[j + 1 : k if k > j else len(piece)])
        redirect = "<redirect" in piece or text[:9].lower() == "#redirect"
        yield Page(int(n.group(1)) if n else 0, _unescape(t.group(1)) if t else "", text, redirect)


def header_namespaces(header: bytes) -> dict[int, str]:
    """Namespace key -> local name (e.g. 6: "Tập tin" in Vietnamese) from the bytes before the first page."""
    return {int(k): _unescape(v.decode("utf-8", "replace")).strip() for k, v in _NAMESPACE.findall(header)}


def _corrupt(dump: Dump, e: BaseException) -> UserError:
    return UserError(f"Wikipedia dump {dump.path} is corrupt or truncated ({e}); download it again")


def read_header(dump: Dump, limit: int = 1 << 24) -> bytes:
    """The dump's bytes before its first `<page>` (its `<siteinfo>`), at most `limit` of them."""
    head = b""
    try:
        with bz2.open(dump.path, "rb") if dump.compressed else open(dump.path, "rb") as f:
            while b"<page>" not in head and len(head) < limit:
                block = f.read(1 << 16)
                if not block:
                    break
                head += block
    except (OSError, EOFError, ValueError) as e:
        raise _corrupt(dump, e) from e
    if b"<mediawiki" not in head[:4096]:  # a dump opens with it; a text file would give "no documents" later
        raise UserError(
            f"{dump.path} is not a MediaWiki XML dump (no <mediawiki> element at its start); pass a pages-articles "
            "dump, or read text files with `bertforge data docs --source`"
        )
    at = head.find(b"<page>")
    return head[:at] if at >= 0 else head


def plain_chunks(dump: Dump, chunk_bytes: int, warn=print) -> Iterator[tuple[bytes, int]]:
    """(XML of whole pages, compressed bytes read so far) in order; a chunk ends at the first `</page>` that ends
    at or after `chunk_bytes` of XML, wherever the reads fell, so the cuts depend on the dump alone."""
    raw = open(dump.path, "rb")
    f = bz2.BZ2File(raw) if dump.compressed else raw
    blocks: list[bytes] = []
    size, started, pre = 0, False, b""
    try:
        while True:
            block = f.read(1 << 20)
            if not started:  # the header ends before the first page (read by `read_header`)
                pre += block
                at = pre.find(b"<page>")
                block, started, pre = (pre[at:], True, b"") if at >= 0 else (b"", not block, pre[-8:])
            blocks.append(block)
            size += len(block)
            while size >= chunk_bytes:
                buf = b"".join(blocks)
                cut = buf.find(b"</page>", chunk_bytes - 7)
                if cut < 0:
                    blocks = [buf]
                    break
                yield buf[: cut + 7], raw.tell()
                blocks, size = [buf[cut + 7 :]], len(buf) - cut - 7
            if not block:
                break
        buf = b"".join(blocks)
        if b"</mediawiki>" not in buf[-64:]:
            warn(
                f"  note: {dump.path} ends without </mediawiki> (cut off?): pages after the last complete one are lost"
            )
        if b"</page>" in buf:
            yield buf, raw.tell()
    except (OSError, EOFError) as e:
        raise _corrupt(dump, e) from e
    finally:
        raw.close()


def _index_offsets(index: Path) -> Iterator[int]:
    """The distinct stream offsets of a multistream index (`offset:page_id:title` lines), in file order."""
    last = -1
    with bz2.open(index, "rb") if index.name.endswith(".bz2") else open(index, "rb") as f:
        for line in f:
            head = line.split(b":", 1)[0]
            if head.strip().isdigit() and int(head) != last:
                last = int(head)
                yield last


def stream_chunks(dump: Dump, chunk_bytes: int) -> Iterator[tuple[tuple[int, int], int]]:
    """((start, end) byte range of whole bz2 streams, end) in order: the page streams of a multistream dump."""
    assert dump.index is not None
    try:
        start = prev = None
        for off in _index_offsets(dump.index):
            if off >= dump.size:  # the first offsets were checked at open; the last may run past a shorter dump
                raise _not_its_index(dump, off)
            if start is None:
                start = off
            elif off - start >= chunk_bytes // 4:
                yield (start, off), off
                start = off
            prev = off
        if start is not None and prev is not None:
            yield (start, dump.size), dump.size  # the last stream runs to the end (with the closing tag)
    except (OSError, EOFError) as e:
        raise UserError(f"multistream index {dump.index} is corrupt or truncated ({e})") from e


def chunk_xml(dump: Dump, payload: bytes | tuple[int, int]) -> str:
    """A chunk's XML text: the bytes the main process read, or a byte range of bz2 streams read here."""
    if isinstance(payload, tuple):
        with open(dump.path, "rb") as f:
            f.seek(payload[0])
            data = f.read(payload[1] - payload[0])
        try:
            payload = bz2.decompress(data)
        except (OSError, EOFError, ValueError) as e:
            raise _corrupt(dump, e) from e
    return payload.decode("utf-8", "replace")
