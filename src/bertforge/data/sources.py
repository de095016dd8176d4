"""Corpus readers. Each yields raw documents as `(title, text)`; `documents.py` cleans and segments them.

Sources (`SOURCE` of `bertforge data docs --source`, or `--dump` of `data wiki`):

- `F.xml` / `F.xml.bz2` (and the split `F.xml-pXpY.bz2`): a MediaWiki pages-articles dump, streamed with
  `xml.etree.ElementTree.iterparse` (bz2 decompressed on the fly; the parsed page is cleared right away, so
  memory stays flat). Article namespace (0) only; redirects skipped; wikitext -> prose by `wikitext_to_text`
  (`wikiclean`, as `data wiki`), in a directory or glob too. One dump given alone is read by `bertforge data
  wiki`'s parallel chunks instead (`wikidump`, `documents.run_wiki`); a multistream dump's index is no text.
- WikiExtractor output (files of `<doc id=... title=...>` ... `</doc>` blocks, or of its `--json` lines; `-c`'s
  `.bz2` files too), as a directory, a glob or a file: one document per block, the repeated title line dropped.
- text files, directories and globs (a folder a glob names is read as a directory is): a blank line ends a
  document (or `one_doc_per_file`); `.xz`, `.gz` and `.bz2` text files (not dumps) are decompressed as they are
  read, never whole in memory. A file in WikiText's raw
  format (first non-blank line ` = Title = `) is read as WikiText: a top-level ` = Title = ` heading starts
  a new document, ` = = Section = = ` headings are dropped, WikiText's `@-@`, `@,@`, `@.@` joiners are undone.
- `hf:NAME[:CONFIG]`: a Hugging Face dataset; a local directory saved with `save_to_disk` or a local data
  file always work; a hub name needs the network (an offline run gets a clear error). The `text` column
  (or the first string column) is used, one document per row.
- `builtin:python-docs`: the running Python's documentation topics (`pydoc_data.topics`) and the docstrings
  of its standard-library modules, classes and functions: a few MB of English prose with no download.
"""

from __future__ import annotations

import bz2
import glob
import gzip
import html
import io
import json
import lzma
import os
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

from bertforge.errors import UserError, first_line
from bertforge.runtime.io import files_signature

Doc = tuple[str, str]

WIKITEXT_HEADING = re.compile(r"^ ?= (?!=)(.*) = ?$")
WIKITEXT_SUBHEADING = re.compile(r"^ ?(= ){2,}.*( =){2,} ?$")
WIKITEXT_JOINERS = ((" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", "."))


def iter_source(source: str, one_doc_per_file: bool = False) -> Iterator[Doc]:
    """Raw documents of any supported source (see the module docstring)."""
    if source.startswith("builtin:"):
        name = source.partition(":")[2]
        if name != "python-docs":
            raise UserError(f"unknown built-in corpus {source!r}; the built-in corpus is builtin:python-docs")
        return iter_python_docs()
    if source.startswith("hf:"):
        return iter_hf(source[3:])
    path = Path(source)
    if path.is_file():
        return _iter_files([path], one_doc_per_file)
    if not path.is_dir() and not glob.glob(source, recursive=True):
        raise UserError(
            f"corpus source {source!r} not found: give a file, a glob, a directory, a .xml[.bz2] dump, "
            "hf:NAME[:CONFIG] or builtin:python-docs"
        )
    return _iter_files(_corpus_files(source), one_doc_per_file)


_DUMP_NAME = re.compile(r"\.xml(-p\d+p\d+)?(\.bz2)?$")  # Wikimedia's split dumps: ...articles1.xml-p1p41242.bz2
_DUMP_INDEX = re.compile(r"multistream\d*-index\d*\.txt")


def is_wiki_dump(name: str | os.PathLike) -> bool:
    """A pages-articles dump's file name: .xml, .xml.bz2, or a split dump's .xml-pXpY.bz2."""
    return bool(_DUMP_NAME.search(os.fspath(name)))


def _corpus_files(source: str) -> list[Path]:
    """The files a directory (recursively, hidden ones aside) or a glob names, sorted; a multistream dump's index
    (offset:id:title lines) is left out: it is no text."""
    path = Path(source)
    if path.is_dir():
        found = _dir_files(path)
    else:
        # a folder the glob names is read as a folder given alone ('text/*' of WikiExtractor's text/AA, text/AB;
        # 'runs/*/docs'): its files were skipped without a word; a recursive glob names a file more than once
        hits = (Path(h) for h in sorted(glob.glob(source, recursive=True)))
        found = list(
            dict.fromkeys(f for h in hits for f in (_dir_files(h) if h.is_dir() else [h] if h.is_file() else []))
        )
    return [p for p in found if not _DUMP_INDEX.search(p.name) and not _is_docs_manifest(p)]


def _dir_files(path: Path) -> list[Path]:
    """The files under a directory, sorted; nothing under a hidden folder either: `.ipynb_checkpoints/` holds a
    second copy of each notebook's text files, `.git/` binary objects."""
    return sorted(
        p
        for p in path.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)
    )


def _is_docs_manifest(path: Path) -> bool:
    """The manifest.json of `data docs`/`data wiki`: no text. Documents read back as a corpus (to re-deal them into
    other --shards, or filter them with another --min-doc-chars) took it for one more document."""
    return path.name == "manifest.json" and listed_files(path.parent) is not None


def listed_files(directory: Path) -> list[str] | None:
    """The document file names that the manifest.json of `data docs`/`data wiki` in `directory` lists; None
    without one (or with a manifest that is not ours)."""
    try:
        listed = json.loads((directory / "manifest.json").read_text(encoding="utf-8")).get("files")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(listed, list) or not all(isinstance(n, str) for n in listed):
        return None
    return listed


def markup(source: str) -> str | None:
    """The markup `iter_source` reads a local file, directory or glob's documents out of: "wikiextractor" (its
    HTML-escaped output, told by the first file), "wikitext" (dumps among the files; one dump file goes to
    `data wiki`'s path), or None."""
    if source.startswith(("hf:", "builtin:")):
        return None
    files = [Path(source)] if Path(source).is_file() else _corpus_files(source)
    if files and _text_format(files[0]) in WIKIEXTRACTOR_FORMATS:
        return "wikiextractor"
    if Path(source).is_file():
        return None
    return "wikitext" if any(is_wiki_dump(p.name) for p in files) else None


def local_files(source: str) -> list[Path]:
    """The local paths a source names, unread: a directory, a file, or a glob's hits; for hf: the local file or
    `save_to_disk` directory it names (none for a hub name or builtin:)."""
    if source.startswith("builtin:"):
        return []
    if source.startswith("hf:"):  # an edited local file must rebuild the documents made from it
        local = Path(source[3:].partition(":")[0])
        return [local] if source[3:] and local.exists() else []
    path = Path(source)
    if path.is_dir() or path.is_file():
        return [path]
    return [Path(h) for h in sorted(glob.glob(source, recursive=True))]


def signature(source: str) -> str:
    """The local files a source reads, as `runtime.io.files_signature` ("" hashed for a hub name and builtin:)."""
    return files_signature(local_files(source))


# ------------------------------------------------------------------------------------------- text files
# a compressed text file's suffix -> its streaming opener (text mode)
_COMPRESSED = {".xz": lzma.open, ".gz": gzip.open, ".bz2": bz2.open}
# what a cut-off or corrupt compressed file raises while it is read
_DECOMPRESS_ERRORS = (lzma.LZMAError, gzip.BadGzipFile, EOFError, OSError)


def open_text(path: Path, errors: str = "strict") -> io.TextIOBase:
    """A text file for reading as UTF-8, decompressed on the fly when it ends in .xz, .gz or .bz2. A leading
    byte-order mark (Windows editors write one) is dropped: it would hide a WikiText heading or a WikiExtractor
    `<doc>` line that the file's first line is checked for."""
    opener = _COMPRESSED.get(path.suffix.lower())
    if opener is None:
        return open(path, encoding="utf-8-sig", errors=errors)
    return opener(path, "rt", encoding="utf-8-sig", errors=errors)  # type: ignore[operator]


def _utf8_error_offset(path: Path) -> int | None:
    """The file offset (decompressed) of its first byte that is not UTF-8: the UnicodeDecodeError of a text file
    counts from the start of the block being decoded, not of the file."""
    import codecs

    opener = _COMPRESSED.get(path.suffix.lower(), open)
    decoder, done = codecs.getincrementaldecoder("utf-8")(), 0
    try:
        with opener(path, "rb") as f:  # type: ignore[operator]
            for block in iter(lambda: f.read(1 << 20), b""):
                try:
                    decoder.decode(block)
                except UnicodeDecodeError as e:  # e.start counts from the bytes the decoder kept back, then block
                    return done - len(decoder.getstate()[0]) + e.start
                done += len(block)
            decoder.decode(b"", final=True)
    except UnicodeDecodeError as e:  # cut off inside a character at the end
        return done - len(e.object) + e.start
    except (OSError, EOFError, lzma.LZMAError):
        return None
    return None


def _read_text(path: Path) -> Iterator[str]:
    try:
        with open_text(path) as f:
            yield from f
    except _DECOMPRESS_ERRORS as e:
        if isinstance(e, FileNotFoundError) or path.suffix.lower() not in _COMPRESSED:
            raise
        raise UserError(f"{path} is not a complete {path.suffix} file ({type(e).__name__}: {e})") from None
    except UnicodeDecodeError as e:
        at = _utf8_error_offset(path)
        where = f"byte {at}: " if at is not None else ""
        raise UserError(
            f"{path} is not valid UTF-8 ({where}{e.reason}); convert it, e.g. `iconv -f latin1 -t utf-8`"
        ) from e


def _iter_files(files: list[Path], one_doc_per_file: bool) -> Iterator[Doc]:
    for path in files:
        if is_wiki_dump(path.name):
            yield from iter_wiki_articles(path)
        elif (fmt := _text_format(path)) in WIKIEXTRACTOR_FORMATS:  # a document per article, whatever one_doc_per_file
            yield from _iter_wikiextractor_file(path, fmt)
        elif fmt == "wikitext":
            yield from iter_wikitext(path)
        elif fmt == "jsonl":  # read as text, the whole file was one document of JSON syntax
            raise UserError(
                f'{path} holds JSON lines ({{"text": ...}} objects), not plain text: read it with --source hf:{path}'
            )
        elif one_doc_per_file:
            text = "".join(_read_text(path))
            if text.strip():
                yield path.stem, text
        else:
            lines: list[str] = []
            for line in _read_text(path):
                if line.strip():
                    lines.append(line)
                elif lines:
                    yield path.stem, "".join(lines)
                    lines = []
            if lines:
                yield path.stem, "".join(lines)


def iter_wikitext(path: Path) -> Iterator[Doc]:
    """WikiText raw format: ` = Title = ` starts an article; sub-headings dropped; paragraphs kept."""
    title = ""
    paras: list[str] = []
    for line in _read_text(path):
        s = line.rstrip("\n")
        if WIKITEXT_SUBHEADING.match(s):
            continue
        m = WIKITEXT_HEADING.match(s)
        if m:
            if paras:
                yield title, "\n\n".join(paras)
            title, paras = m.group(1).strip(), []
            continue
        s = s.strip()
        if s:
            for a, b in WIKITEXT_JOINERS:
                s = s.replace(a, b)
            paras.append(s)
    if paras:
        yield title, "\n\n".join(paras)


# ------------------------------------------------------------------------------------------- WikiExtractor
# `<doc id=".." url=".." title="..">`, with `revid=".."` before url under WikiExtractor's --revision; the title is
# written unescaped by some versions (a `"` in it), so it runs to the last `"` before the closing `>` or before
# other tools' attributes after it
_DOC_OPEN = re.compile(r'^<doc id="[^"]*"(?: [a-z]+="[^"]*")*? title="(.*?)"(?: [a-z]+="[^"]*")*>\s*$')


WIKIEXTRACTOR_FORMATS = ("doc", "json")


def _text_format(path: Path) -> str | None:
    """What a text file holds, told by its first non-blank line (one read): "doc" for WikiExtractor's `<doc ...>`
    blocks, "json" for its `--json` lines ({"id", "title", "text", ...}), "wikitext" for WikiText's raw format,
    "jsonl" for other JSON lines of {"text": ...} objects (C4, the Pile), None for plain text (or an unreadable
    file: reading says why)."""
    try:
        with open_text(path, errors="replace") as f:
            line = next((ln for ln in f if ln.strip()), "")
    except _DECOMPRESS_ERRORS:
        return None
    if _DOC_OPEN.match(line):
        return "doc"
    if WIKITEXT_HEADING.match(line.rstrip("\n")):
        return "wikitext"
    if not line.lstrip().startswith("{") or '"text"' not in line:
        return None
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
        return None
    return "json" if line.startswith("{") and "title" in obj else "jsonl"


def _unescape(text: str) -> str:
    return html.unescape(text) if "&" in text else text


def _drop_title_line(title: str, body: list[str]) -> list[str]:
    """WikiExtractor repeats the title as the first line of the body (its --json text too, before version 3)."""
    return body[1:] if body and body[0].strip() == title.strip() else body


def _iter_wikiextractor_file(path: Path, fmt: str) -> Iterator[Doc]:
    """`<doc id=.. url=.. title=..>` blocks ("doc") or `--json` lines ("json") of one WikiExtractor output file;
    the title line that starts an article's text is dropped.

    WikiExtractor's default `--html-safe` writes the text through `html.escape(text, quote=False)`, so body lines
    are unescaped (else `&amp;` reaches the tokenizer as `&`, `amp`, `;`), and the title too: it must still
    match the body's first line."""
    if fmt == "json":
        for n, line in enumerate(_read_text(path), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                title, text = _unescape(str(obj.get("title", ""))), _unescape(obj["text"])
            except (ValueError, KeyError, TypeError, AttributeError):
                raise UserError(
                    f'{path} line {n} is not a WikiExtractor --json article ({{"title": ..., "text": ...}}); '
                    "the file was cut off, or is not WikiExtractor output"
                ) from None
            yield title, "\n".join(_drop_title_line(title, text.split("\n")))
        return
    title, inside = "", False
    body: list[str] = []
    for line in _read_text(path):
        m = _DOC_OPEN.match(line)
        if m:
            if inside:  # the article before it has no </doc> (files cut and joined by hand): its text is kept
                yield title, "".join(_drop_title_line(title, body))
            title, body, inside = _unescape(m.group(1)), [], True
        elif line.startswith("</doc>"):
            if inside:
                yield title, "".join(_drop_title_line(title, body))
            inside = False
        elif inside:
            body.append(_unescape(line))
    if inside:  # a file cut off inside its last article keeps the lines written, as a cut-off dump keeps its pages
        yield title, "".join(_drop_title_line(title, body))


# ------------------------------------------------------------------------------------------- Wikipedia dumps
def _local(tag: str) -> str:
    return tag.rpartition("}")[2]


def iter_wiki_dump(path: str | os.PathLike) -> Iterator[tuple[str, str]]:
    """(title, wikitext) of article pages (namespace 0, not redirects) of a .xml or .xml.bz2 dump, streamed."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"Wikipedia dump {path} does not exist")
    raw: io.BufferedIOBase = bz2.open(path, "rb") if path.suffix == ".bz2" else open(path, "rb")
    try:
        context = ET.iterparse(raw, events=("start", "end"))
        root = None
        for event, elem in context:
            if root is None:
                root = elem
            if event != "end" or _local(elem.tag) != "page":
                continue
            ns = title = text = None
            redirect = False
            for child in elem.iter():
                name = _local(child.tag)
                if name == "ns":
                    ns = (child.text or "").strip()
                elif name == "title" and title is None:
                    title = child.text or ""
                elif name == "redirect":
                    redirect = True
                elif name == "text":
                    text = child.text or ""
            if ns in ("0", None) and not redirect and text and not text.lstrip().lower().startswith("#redirect"):
                yield title or "", text
            elem.clear()
            root.clear()  # drop finished pages from the tree: memory stays flat
    except (OSError, EOFError) as e:
        raise UserError(f"Wikipedia dump {path} is corrupt or truncated ({e}); download it again") from e
    except ET.ParseError as e:
        raise UserError(f"Wikipedia dump {path} is not valid XML ({e}); is it a pages-articles dump?") from e
    finally:
        raw.close()


def iter_wiki_articles(path: Path) -> Iterator[Doc]:
    """(title, prose) of a dump's articles: their wikitext cleaned as `data wiki` cleans it, links into the
    dump's own (localized) namespaces dropped."""
    prefixes = non_article_prefixes(dump_namespaces(path))
    for title, wikitext in iter_wiki_dump(path):
        yield title, wikitext_to_text(wikitext, prefixes)


def dump_namespaces(path: str | os.PathLike) -> dict[int, str]:
    """Namespace key -> local name (e.g. 6: "Tập tin" in Vietnamese) from a dump's <siteinfo> header."""
    from bertforge.data import wikidump

    return wikidump.header_namespaces(wikidump.read_header(wikidump.open_dump(path)))


def non_article_prefixes(namespaces: dict[int, str]) -> tuple[str, ...]:
    """Lower-case "name:" prefixes of every namespace but articles (links to files, categories, ...)."""
    return tuple(f"{n.lower()}:" for k, n in namespaces.items() if k != 0 and n)


def wikitext_to_text(wikitext: str, drop_prefixes: tuple[str, ...] = ()) -> str:
    """Wikitext -> plain prose (`wikiclean.clean_wikitext`, linear in the page size): templates, tables,
    references, files, categories, HTML, headings, list items and comments removed; links replaced by their
    text; one paragraph per line.

    `drop_prefixes`: extra lower-case link prefixes to drop — a dump's localized namespace names
    (`non_article_prefixes(dump_namespaces(dump))`, e.g. "tập tin:" for files in Vietnamese); links to media
    files are dropped whatever their prefix."""
    from bertforge.data.wikiclean import clean_wikitext

    return clean_wikitext(wikitext, drop_prefixes)


# ------------------------------------------------------------------------------------------- Hugging Face
def iter_hf(spec: str) -> Iterator[Doc]:
    """Rows of a Hugging Face dataset: a save_to_disk dir, a local data file, or a hub name (online)."""
    name, _, config = spec.partition(":")
    if not name:
        raise UserError("hf: names no dataset; use hf:NAME[:CONFIG], a save_to_disk directory or a local data file")
    try:
        import datasets
    except ImportError as e:  # pragma: no cover - datasets is a dependency
        raise UserError("hf: sources need the `datasets` package") from e
    p = Path(name)
    try:
        if p.is_dir() and ((p / "dataset_info.json").is_file() or (p / "dataset_dict.json").is_file()):
            ds = datasets.load_from_disk(str(p))
        elif p.is_file():
            formats = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet", ".txt": "text"}
            # datasets decompresses .gz/.bz2/.xz data files itself: C4 ships as .json.gz
            suffix = Path(p.stem).suffix if p.suffix.lower() in _COMPRESSED else p.suffix
            fmt = formats.get(suffix.lower())
            if fmt is None:
                raise UserError(
                    f"hf:{name}: cannot tell the format of {p} (use .json/.jsonl/.csv/.parquet/.txt, "
                    "or one of them .gz/.bz2/.xz)"
                )
            ds = datasets.load_dataset(fmt, data_files=str(p), split="train")
        else:
            ds = datasets.load_dataset(name, config or None, split="train")
    except UserError:
        raise
    except Exception as e:  # datasets raises many types (ConnectionError, FileNotFoundError, DatasetNotFoundError)
        if p.exists():  # a local file or directory: what is wrong is in it, not the network
            cause = e.__cause__ or e  # DatasetGenerationError wraps the parser's error
            raise UserError(f"hf:{name}: cannot read {p}: {type(cause).__name__}: {first_line(cause)}") from e
        offline = os.environ.get("HF_DATASETS_OFFLINE") == "1" or os.environ.get("HF_HUB_OFFLINE") == "1"
        hint = " (offline: HF_HUB_OFFLINE/HF_DATASETS_OFFLINE is set; use a local dir or file)" if offline else ""
        raise UserError(f"cannot load Hugging Face dataset {name!r}{hint}: {type(e).__name__}: {first_line(e)}") from e
    if isinstance(ds, datasets.DatasetDict):
        ds = ds["train"] if "train" in ds else ds[next(iter(ds))]
    columns = [c for c, f in ds.features.items() if getattr(f, "dtype", None) in ("string", "large_string")]
    if not columns:
        raise UserError(f"hf:{name} has no text column (columns: {', '.join(ds.column_names)})")
    col = "text" if "text" in columns else columns[0]
    title_col = "title" if "title" in ds.column_names else None
    for i, row in enumerate(ds):
        yield (str(row[title_col]) if title_col else f"{name}-{i}"), row[col] or ""


# ------------------------------------------------------------------------------------------- built-in
# modules with side effects on import, or GUI/test packages with no prose worth having
_SKIP_MODULES = {
    "antigravity",
    "this",
    "idlelib",
    "tkinter",
    "turtle",
    "turtledemo",
    "__main__",
    "lib2to3",
    "test",
    "ensurepip",
    "venv",
    "pydoc_data",
    "xxsubtype",
    "xxlimited",
    "_xxtestfuzz",
    "msilib",
    "winreg",
    "winsound",
}


def _prose_paragraphs(doc: str) -> list[str]:
    """Docstring -> prose paragraphs: code (>>>, indented blocks), option tables and short labels dropped."""
    import inspect

    out = []
    for para in re.split(r"\n\s*\n", inspect.cleandoc(doc)):
        lines = [ln for ln in para.split("\n") if ln.strip()]
        if not lines or any(ln.lstrip().startswith((">>>", "...", "$ ", "%")) for ln in lines):
            continue
        if sum(ln.startswith((" ", "\t")) for ln in lines) > len(lines) // 2:
            continue  # an indented block: code or a table
        text = " ".join(ln.strip() for ln in lines)
        letters = sum(c.isalpha() or c == " " for c in text)
        if len(text) < 40 or letters < 0.75 * len(text):
            continue
        out.append(text)
    return out


def _object_paragraphs(mod) -> list[str]:
    """Prose of a module's docstring and of its public classes, functions and methods (C ones included)."""
    import inspect

    paras = _prose_paragraphs(mod.__doc__ or "")
    for attr, obj in sorted(vars(mod).items()):
        if attr.startswith("_") or getattr(obj, "__module__", None) != mod.__name__:
            continue
        if inspect.isclass(obj) or inspect.isroutine(obj):
            paras += _prose_paragraphs(getattr(obj, "__doc__", None) or "")
            if inspect.isclass(obj):
                for mname, meth in sorted(vars(obj).items()):
                    if not mname.startswith("_") and inspect.isroutine(meth):
                        paras += _prose_paragraphs(getattr(meth, "__doc__", None) or "")
    return paras


def _python_modules() -> list[str]:
    """The standard library's public modules and their public submodules (no test/GUI/side-effect ones)."""
    import pkgutil
    import sys

    names = []
    for top in sorted(getattr(sys, "stdlib_module_names", ())):
        if top in _SKIP_MODULES or top.startswith("_"):
            continue
        names.append(top)
        spec = importlib_util_find_spec(top)
        if spec is not None and spec.submodule_search_locations:
            for info in pkgutil.walk_packages(list(spec.submodule_search_locations), prefix=top + "."):
                parts = info.name.split(".")
                if not any(p.startswith("_") or p in _SKIP_MODULES or p.startswith("test") for p in parts):
                    names.append(info.name)
    return names


def importlib_util_find_spec(name: str):
    import importlib.util

    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None


def iter_python_docs() -> Iterator[Doc]:
    """Documentation topics and standard-library docstrings of the running Python, one document each."""
    import contextlib
    import importlib
    import warnings
    from pydoc_data.topics import topics

    for name in sorted(topics):
        paras = _prose_paragraphs(topics[name])
        if paras:
            yield f"topic:{name}", "\n\n".join(paras)
    for modname in _python_modules():
        try:
            with (
                warnings.catch_warnings(),
                contextlib.redirect_stdout(io.StringIO()),
                contextlib.redirect_stderr(io.StringIO()),
            ):
                warnings.simplefilter("ignore")
                mod = importlib.import_module(modname)
        except BaseException:  # noqa: BLE001 - platform-specific modules fail to import in many ways
            continue
        paras = _object_paragraphs(mod)
        if paras:
            yield f"module:{modname}", "\n\n".join(paras)
