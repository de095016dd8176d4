"""Wikipedia extraction benchmarks: `bertforge data wiki` vs WikiExtractor on the same dump and processes.

Inputs (built under the bench cache directory at run time, never committed):

- `en`: ../shared/data/wikipedia_dump_sample/enwiki-table-markup.xml.bz2 with a `<siteinfo>` header put in
  front (the sample has none, and WikiExtractor reads every line looking for one without it: zero articles);
- `vi`: the Vietnamese pages-articles head wikiextractor_vi_pair/test.xml, as it is (plain XML, cut off);
- `big_xN`: the real pages of both samples' English file repeated with new page ids until the XML reaches
  N x 110 MB, written as a multistream dump (100 pages per bz2 stream) with its index — what
  dumps.wikimedia.org publishes; WikiExtractor reads it as one bz2 file (Python's bz2 reads every stream);
- `big_xN_plain`: the same XML as one bz2 stream (`pages-articles.xml.bz2`): ours decompresses it in the main
  process then, as WikiExtractor does.

WikiExtractor (PyPI `wikiextractor`) is installed with `pip install --target` into the cache, never into the
running environment. Each side runs as a child process (`bench.data.run_measured`: wall, CPU seconds of all its
processes, peak summed RSS); `cpu_s_per_mb` is CPU seconds per MB of the dump file as given. Output quality:
`leak_*` counts each markup marker in the text out (`leaks` their sum), `prose_chars` its characters (no
newlines, no WikiExtractor `<doc>` lines or repeated titles).
"""

from __future__ import annotations

import bz2
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bertforge.bench.data import SHARED, _cache_dir, run_measured
from bertforge.runtime.io import atomic_path

SAMPLES = SHARED / "wikipedia_dump_sample"
WIKIEXTRACTOR = "wikiextractor==3.1.0"
MARKERS = {
    "template": r"\{\{|\}\}",
    "link": r"\[\[|\]\]",
    "table": r"\{\||\|\}",
    "ref": r"<ref|</ref",
    "external_link": r"\[(?:https?:)?//",
    "html_tag": r"</?[a-zA-Z][a-zA-Z0-9]*[\s/>]",
    "comment": r"<!--|-->",
    "entity": r"&(?:[a-z]+|#\d+);",
    "magic_word": r"__[A-Z]{3,}__",
    "file_link": r"(?:File|Image|Category):",
    "thumb": r"\bthumb\|",
    "quotes": r"'''|''",
}
_MARKERS = {name: re.compile(p) for name, p in MARKERS.items()}
_SITEINFO = """
  <siteinfo>
    <sitename>Wikipedia</sitename>
    <dbname>enwiki</dbname>
    <base>https://en.wikipedia.org/wiki/Main_Page</base>
    <generator>MediaWiki 1.31.0-wmf.5</generator>
    <case>first-letter</case>
    <namespaces>
      <namespace key="-2" case="first-letter">Media</namespace>
      <namespace key="0" case="first-letter" />
      <namespace key="1" case="first-letter">Talk</namespace>
      <namespace key="2" case="first-letter">User</namespace>
      <namespace key="4" case="first-letter">Wikipedia</namespace>
      <namespace key="6" case="first-letter">File</namespace>
      <namespace key="10" case="first-letter">Template</namespace>
      <namespace key="14" case="first-letter">Category</namespace>
    </namespaces>
  </siteinfo>
"""
_ID = re.compile(r"(<page>.*?<id>)\d+(</id>)", re.S)
_TITLE = re.compile(r"<title>(.*?)</title>")


def wikiextractor_path() -> Path:
    """A `pip install --target` directory holding WikiExtractor, made once in the bench cache."""
    target = _cache_dir() / "wikiextractor-pkg"
    if not (target / "wikiextractor" / "WikiExtractor.py").is_file():
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(target), WIKIEXTRACTOR], check=True
        )
    return target


def _en_xml() -> str:
    """The English sample's XML with a <siteinfo> header after the opening <mediawiki ...> tag."""
    with bz2.open(SAMPLES / "enwiki-table-markup.xml.bz2", "rt", encoding="utf-8") as f:
        xml = f.read()
    at = xml.index(">") + 1
    return xml[:at] + _SITEINFO + xml[at:]


def dump_path(name: str) -> Path:
    """The benchmark input `name` (see the module docstring), built once in the cache."""
    if name == "vi":
        return SAMPLES / "wikiextractor_vi_pair" / "test.xml"
    cache = _cache_dir()
    if name == "en":
        path = cache / "enwiki-sample-siteinfo.xml.bz2"
        if not path.is_file():
            path.write_bytes(bz2.compress(_en_xml().encode("utf-8")))
        return path
    if name.endswith("_plain"):  # the same XML as one bz2 stream, as `pages-articles.xml.bz2` ships
        path = cache / f"enwiki-repeated-{name}-pages-articles.xml.bz2"
        if not path.is_file():
            with (
                atomic_path(path) as tmp,
                bz2.open(dump_path(name.removesuffix("_plain")), "rb") as src,
                bz2.open(tmp, "wb") as dst,
            ):
                shutil.copyfileobj(src, dst, 1 << 24)
        return path
    times = int(name.removeprefix("big_x"))
    path = cache / f"enwiki-repeated-x{times}-pages-articles-multistream.xml.bz2"
    if not path.is_file():
        build_multistream(path, times * 110 * 10**6)
    return path


def build_multistream(path: Path, xml_bytes: int, pages_per_stream: int = 100) -> None:
    """A multistream dump of the English sample's pages repeated with new ids up to `xml_bytes` of XML, and its
    index (`offset:id:title` per page) beside it."""
    xml = _en_xml()
    head, pages = xml[: xml.index("<page>")], re.findall(r"<page>.*?</page>", xml, re.S)
    index_path = path.with_name(path.name.replace("multistream.xml", "multistream-index.txt"))
    size, page_id = 0, 0
    with (
        atomic_path(path) as tmp,
        atomic_path(index_path) as tmp_index,
        open(tmp, "wb") as out,
        bz2.open(tmp_index, "wt", encoding="utf-8") as index,
    ):
        out.write(bz2.compress(head.encode("utf-8")))
        while size < xml_bytes:
            offset, group = out.tell(), []
            for _ in range(pages_per_stream):
                page = pages[page_id % len(pages)]
                page_id += 1
                group.append("  " + _ID.sub(rf"\g<1>{page_id}\g<2>", page, count=1) + "\n")
                found = _TITLE.search(page)
                if found is None:  # every page of the sample has one; the index line needs it
                    raise ValueError(f"a <page> of the English sample has no <title>: {page[:200]!r}")
                title = found.group(1)
                index.write(f"{offset}:{page_id}:{title}\n")
            data = "".join(group).encode("utf-8")
            size += len(data)
            out.write(bz2.compress(data))
        out.write(bz2.compress(b"</mediawiki>\n"))


def quality(texts: list[str]) -> dict[str, float]:
    """Leak counts per marker and characters of prose (newlines not counted) of the text out."""
    out = {f"leak_{name}": float(sum(len(p.findall(t)) for t in texts)) for name, p in _MARKERS.items()}
    out["leaks"] = sum(out.values())
    out["prose_chars"] = float(sum(len(t) - t.count("\n") for t in texts))
    return out


def wikiextractor_texts(out: Path) -> list[str]:
    """WikiExtractor's output files, without the `<doc ...>`/`</doc>` lines and the title line after each."""
    texts = []
    for f in sorted(out.rglob("wiki_*")):
        lines, skip_title = [], False
        for line in f.read_text(encoding="utf-8").split("\n"):
            if line.startswith("<doc "):
                skip_title = True
            elif line == "</doc>":
                continue
            elif skip_title:
                skip_title = False
            else:
                lines.append(line)
        texts.append("\n".join(lines))
    return texts


def extract(tool: str = "ours", dump: str = "en", processes: int = 2) -> dict[str, float]:
    """One extraction of the dump `dump` by `tool` ("ours" or "wikiextractor") with `processes` workers."""
    path = dump_path(dump)
    out = Path(tempfile.mkdtemp(prefix=f"bertforge-bench-wiki-{tool}-"))
    try:
        if tool == "ours":
            cmd = [
                sys.executable,
                "-m",
                "bertforge",
                "data",
                "wiki",
                "--dump",
                str(path),
                "--out",
                str(out / "docs"),
                "--workers",
                str(processes),
                "--shards",
                "1",
            ]
            env = None
        else:
            cmd = [
                sys.executable,
                "-m",
                "wikiextractor.WikiExtractor",
                str(path),
                "-o",
                str(out / "text"),
                "--processes",
                str(processes),
                "--quiet",
            ]
            env = {"PYTHONPATH": str(wikiextractor_path())}
        m = run_measured(cmd, env=env)
        texts = (
            [f.read_text(encoding="utf-8") for f in sorted((out / "docs").glob("docs_*.txt"))]
            if tool == "ours"
            else wikiextractor_texts(out / "text")
        )
        mb = path.stat().st_size / 1e6
        m.update(quality(texts), dump_mb=mb, cpu_s_per_mb=m["cpu_s"] / mb, wall_s_per_mb=m["shards_wall_s"] / mb)
        m["extract_wall_s"] = m.pop("shards_wall_s")
        return m
    finally:
        shutil.rmtree(out, ignore_errors=True)


def chain(dump: str = "big_x1", processes: int = 2, dupe_factor: int = 5) -> dict[str, float]:
    """The whole chain on `dump`: `data wiki`, then phase-1 (seq 128, 20 predictions) and phase-2 (seq 512, 80)
    NVIDIA-format shards with the uncased BERT vocab; wall and CPU seconds of each step, per MB of dump."""
    path = dump_path(dump)
    vocab = SHARED / "bert_vocab" / "bert-base-uncased-vocab.txt"
    out = Path(tempfile.mkdtemp(prefix="bertforge-bench-wiki-chain-"))
    bf = [sys.executable, "-m", "bertforge", "data"]
    steps = {"wiki": bf + ["wiki", "--dump", str(path), "--out", str(out / "docs"), "--workers", str(processes)]}
    for phase, seq, pred in (("phase1", 128, 20), ("phase2", 512, 80)):
        steps[phase] = bf + [
            "shards",
            "--docs",
            str(out / "docs"),
            "--vocab",
            str(vocab),
            "--out",
            str(out / phase),
            "--seq-len",
            str(seq),
            "--max-pred",
            str(pred),
            "--dupe-factor",
            str(dupe_factor),
            "--shards",
            "8",
            "--workers",
            str(processes),
        ]
    try:
        mb, m = path.stat().st_size / 1e6, {}
        for name, cmd in steps.items():
            r = run_measured(cmd)
            m.update(
                {
                    f"{name}_wall_s": r["shards_wall_s"],
                    f"{name}_cpu_s": r["cpu_s"],
                    f"{name}_peak_rss_mb": r["peak_rss_mb"],
                }
            )
        m["chain_wall_s"] = sum(m[f"{s}_wall_s"] for s in steps)
        m["chain_cpu_s"] = sum(m[f"{s}_cpu_s"] for s in steps)
        m["chain_cpu_s_per_mb"] = m["chain_cpu_s"] / mb
        m["dump_mb"] = mb
        return m
    finally:
        shutil.rmtree(out, ignore_errors=True)
