"""`data wiki` end to end: plain and multistream dumps give the same documents, counts and progress, and a run
killed with SIGKILL resumes from its complete parts to the documents of an uninterrupted run."""

from __future__ import annotations

import bz2
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from xml.sax.saxutils import escape

import pytest
from tests.helpers import one_line

from bertforge.data import documents, wikidump
from bertforge.errors import UserError

SITEINFO = (
    '<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/" version="0.10" xml:lang="en">\n'
    '<siteinfo><sitename>Test</sitename><namespaces><namespace key="0" case="first-letter" />'
    '<namespace key="1" case="first-letter">Talk</namespace>'
    '<namespace key="6" case="first-letter">Datei</namespace></namespaces></siteinfo>\n'
)


def _page(i: int) -> str:
    """Page i: mostly articles; every 7th a redirect, a talk page, or a stub shorter than 200 characters."""
    kind = i % 7
    title, ns, redirect = f"Page {i}", 0, ""
    text = (
        f"'''Page {i}''' is about [[topic {i}|topic number {i}]].{{{{cite|x={{{{y}}}}}}}} "
        + f"Sentence {i} has prose in it. " * 12
        + f"[[Datei:P{i}.jpg|thumb|cap]]\n== Notes ==\nEnd {i}."
    )
    if kind == 3:
        title, text, redirect = f"Old {i}", "#REDIRECT [[Page 1]]", '<redirect title="Page 1" />'
    elif kind == 5:
        title, ns = f"Talk:Page {i}", 1
    elif kind == 6:
        text = "Too short."
    return (
        f"  <page>\n    <title>{escape(title)}</title>\n    <ns>{ns}</ns>\n    <id>{i + 1}</id>\n    {redirect}"
        f'<revision><id>{i + 100}</id><text xml:space="preserve">{escape(text)}</text></revision>\n  </page>\n'
    )


def make_dumps(root: Path, n: int, per_stream: int = 10) -> tuple[Path, Path]:
    """The same pages as a plain .xml.bz2 and as a multistream dump with its index beside it."""
    pages = [_page(i) for i in range(n)]
    plain = root / "test-pages-articles.xml.bz2"
    plain.write_bytes(bz2.compress((SITEINFO + "".join(pages) + "</mediawiki>\n").encode()))
    multi = root / "test-pages-articles-multistream.xml.bz2"
    index = []
    with open(multi, "wb") as f:
        f.write(bz2.compress(SITEINFO.encode()))
        for s in range(0, n, per_stream):
            offset = f.tell()
            index += [f"{offset}:{i + 1}:Page {i}" for i in range(s, min(s + per_stream, n))]
            f.write(bz2.compress("".join(pages[s : s + per_stream]).encode()))
        f.write(bz2.compress(b"</mediawiki>\n"))
    (root / "test-pages-articles-multistream-index.txt.bz2").write_bytes(bz2.compress("\n".join(index).encode()))
    return plain, multi


def _docs(out: Path) -> list[str]:
    return [(out / f"docs_{i}.txt").read_text(encoding="utf-8") for i in range(3)]


def _docs_in(out: Path) -> list[str]:
    """Every document of a docs directory, whatever its shards."""
    return [d for f in sorted(out.glob("docs_*.txt")) for d in f.read_text(encoding="utf-8").split("\n\n") if d]


def test_plain_and_multistream_same_documents_and_counts(tmp_path):
    plain, multi = make_dumps(tmp_path, 70)
    assert wikidump.open_dump(multi).index is not None  # found beside the dump
    a = documents.run_wiki(plain, tmp_path / "a", num_shards=3, workers=2, chunk_bytes=3000, log=lambda *_: None)
    b = documents.run_wiki(multi, tmp_path / "b", num_shards=3, workers=2, chunk_bytes=3000, log=lambda *_: None)
    assert _docs(tmp_path / "a") == _docs(tmp_path / "b")
    assert a["parts"] > 5 and b["parts"] > 1  # really cut into chunks
    for m in (a, b):
        assert (m["pages"], m["redirects"], m["other_namespaces"], m["dropped_short"], m["documents"]) == (
            70,
            10,
            10,
            10,
            40,
        )
    text = "".join(_docs(tmp_path / "a"))
    assert "Page 0 is about topic number 0." in text and "End 0." in text
    for leak in ("{{", "[[", "Datei", "thumb", "Notes", "'''", "Too short", "talk"):
        assert leak not in text
    assert not (tmp_path / "a" / "parts").exists()  # parts are removed once the shards are in place


def test_an_index_of_another_dump_is_named_at_start(tmp_path):
    """--index of another dump (its offsets are not this dump's streams) is one line naming the index at open,
    not a 'corrupt dump' chunks into the run; one whose later offsets run past the dump, when chunking reaches
    them; an index without offsets is refused too."""
    _, multi = make_dumps(tmp_path, 70)
    other = tmp_path / "other"
    other.mkdir()
    make_dumps(other, 400, per_stream=7)
    index = other / "test-pages-articles-multistream-index.txt.bz2"
    with pytest.raises(UserError) as e:
        wikidump.open_dump(multi, index)
    assert one_line(str(e.value)) and f"multistream index {index} does not fit dump {multi}: its offset" in str(e.value)
    own = bz2.decompress((tmp_path / "test-pages-articles-multistream-index.txt.bz2").read_bytes()).decode()
    past = tmp_path / "past-index.txt"
    past.write_text(own + f"\n{multi.stat().st_size + 10}:999:Page far\n")  # the dump's streams, then one past its end
    dump = wikidump.open_dump(multi, past)
    with pytest.raises(UserError, match=f"its offset {multi.stat().st_size + 10} is not the start"):
        list(wikidump.stream_chunks(dump, 3000))
    empty = tmp_path / "empty-index.txt"
    empty.write_text("not an index\n")
    with pytest.raises(UserError, match="lists no streams"):
        wikidump.open_dump(multi, empty)


def test_progress_line():
    lines = []
    p = documents._Progress(total=100 * 10**6, log=lines.append, every=0.0)
    p.update(10 * 10**6, 500)
    time.sleep(0.01)
    p.update(20 * 10**6, 500)
    assert "pages/s" in lines[-1] and "MB/s" in lines[-1] and "ETA" in lines[-1] and "20/100 MB" in lines[-1]
    resumed = documents._Progress(total=100 * 10**6, log=lines.append, every=0.0)
    resumed.update(50 * 10**6, 900, resumed=True)  # parts kept from a killed run: not speed
    resumed.update(60 * 10**6, 100)
    assert "60/100 MB" in lines[-1] and resumed.pos0 == 50 * 10**6 and resumed.pages == 100


def test_summary_logged(tmp_path):
    plain, _ = make_dumps(tmp_path, 14)
    lines = []
    documents.run_wiki(plain, tmp_path / "o", num_shards=1, workers=1, log=lines.append)
    assert any(
        "14 pages: 8 documents kept, 2 redirects and 2 pages of other namespaces skipped, 2 articles "
        "dropped as shorter than 200 characters" in ln
        for ln in lines
    ), lines


_KILLABLE = """
import sys, time
from bertforge.data import documents as D
real = D._wiki_chunk
def slow(job, item):
    out = real(job, item)
    time.sleep(0.3)
    return out
D._wiki_chunk = slow
D.run_wiki(sys.argv[1], sys.argv[2], num_shards=3, workers=2, chunk_bytes=3000, log=lambda *a: None)
"""


def test_sigkill_then_rerun_gives_the_same_documents(tmp_path, monkeypatch):
    plain, _ = make_dumps(tmp_path, 140)
    whole = documents.run_wiki(
        plain, tmp_path / "whole", num_shards=3, workers=2, chunk_bytes=3000, log=lambda *_: None
    )
    out = tmp_path / "killed"
    env = dict(os.environ, PYTHONPATH=str(Path(documents.__file__).parents[2]))
    proc = subprocess.Popen([sys.executable, "-c", _KILLABLE, str(plain), str(out)], env=env, start_new_session=True)
    deadline = time.time() + 60
    while len(list((out / "parts").glob("part_*.txt"))) < 4 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)  # the run and its workers, mid-way
    proc.wait()
    kept = sorted((out / "parts").glob("part_*.txt"))
    assert 4 <= len(kept) < whole["parts"]
    assert not list(out.glob("docs_*.txt")) and not (out / "manifest.json").exists()  # nothing looks complete
    assert all(documents._part_counts(p) is not None for p in kept)  # every named part is whole
    redone = []
    real = wikidump.chunk_xml
    monkeypatch.setattr(wikidump, "chunk_xml", lambda d, payload: redone.append(1) or real(d, payload))
    # resumed with other --shards: the parts (documents of each chunk, dealt out at the merge) are kept all the same
    again = documents.run_wiki(plain, out, num_shards=2, workers=1, chunk_bytes=3000, log=lambda *_: None)
    assert len(redone) == whole["parts"] - len(kept)  # the complete parts were kept, not redone
    assert again["files"] == ["docs_0.txt", "docs_1.txt"]
    assert sorted(_docs_in(out)) == sorted(_docs_in(tmp_path / "whole"))
    assert {k: again[k] for k in ("documents", "pages", "chars")} == {
        k: whole[k] for k in ("documents", "pages", "chars")
    }


def test_cut_off_dump_keeps_complete_pages(shared_data, tmp_path):
    dump = shared_data / "wikipedia_dump_sample" / "wikiextractor_vi_pair" / "test.xml"
    lines = []
    m = documents.run_wiki(dump, tmp_path / "vi", num_shards=1, workers=2, log=lines.append)
    assert (m["pages"], m["redirects"], m["other_namespaces"]) == (10, 3, 1)
    assert any("ends without </mediawiki>" in ln for ln in lines)
    text = (tmp_path / "vi" / "docs_0.txt").read_text(encoding="utf-8")
    assert "ngôn ngữ" in text and "Tập tin" not in text and "nhỏ|" not in text


def test_settings_change_rebuilds(tmp_path):
    plain, _ = make_dumps(tmp_path, 14)
    documents.run_wiki(plain, tmp_path / "o", num_shards=1, workers=1, log=lambda *_: None)
    with_headings = documents.run_wiki(
        plain, tmp_path / "o", num_shards=1, workers=1, headings=True, log=lambda *_: None
    )
    assert with_headings["settings"]["headings"] is True
    assert "Notes." in (tmp_path / "o" / "docs_0.txt").read_text()
    assert json.loads((tmp_path / "o" / "manifest.json").read_text())["settings"]["cleaner"] == documents.CLEANER


@pytest.mark.parametrize("bad", ["missing.xml.bz2", "nothing.xml"])
def test_bad_inputs(tmp_path, bad):
    from bertforge.errors import UserError

    if bad == "nothing.xml":
        (tmp_path / bad).write_text("<mediawiki></mediawiki>")
    with pytest.raises(UserError, match="does not exist|no documents"):
        documents.run_wiki(tmp_path / bad, tmp_path / "o", workers=1, log=lambda *_: None)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p.write_text("Plain text, one line.\n"), "is not a MediaWiki XML dump"),
        (lambda p: p.mkdir(), "is a directory; pass the pages-articles"),
        (lambda p: p.write_text("<mediawiki></mediawiki>"), "gave no documents"),
    ],
    ids=["text-file", "directory", "no-pages"],
)
def test_a_dump_that_is_not_one_is_one_line_and_leaves_no_directory(tmp_path, capsys, make, message):
    from bertforge.cli import main

    make(tmp_path / "dump.xml")
    assert (
        main(["data", "wiki", "--dump", str(tmp_path / "dump.xml"), "--out", str(tmp_path / "o"), "--workers", "1"])
        == 2
    )
    one_line(capsys.readouterr().err, message)
    assert not (tmp_path / "o").exists()


def test_dumps_in_a_directory_or_glob_are_cleaned_as_data_wiki_cleans_them(tmp_path):
    """`data docs --source DIR` (or a glob) wrote the raw wikitext ({{...}}, [[...]]) of the dumps it found there;
    a multistream dump's index beside them is no text, and a split dump's name (.xml-pXpY.bz2) is a dump too."""
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    plain, multi = make_dumps(dumps, 30)
    plain.rename(dumps / "test-pages-articles1.xml-p1p30.bz2")
    quiet = {"num_shards": 1, "workers": 1, "log": lambda *_: None}
    documents.run_wiki(multi, tmp_path / "wiki", **quiet)
    reference = _docs_in(tmp_path / "wiki")
    assert reference and "Sentence 0 has prose in it." in reference[0]
    for source in (dumps, dumps / "*"):
        out = tmp_path / f"docs_{len(source.parts)}"
        manifest = documents.run_docs(str(source), out, **quiet)
        assert _docs_in(out) == reference * 2, source  # the multistream dump, then the split one
        assert manifest["settings"]["cleaner"] == documents.CLEANER  # raw documents of an older run are rebuilt
        assert not any(m in d for d in _docs_in(out) for m in ("[[", "{{", "'''", "Datei:", "==", "REDIRECT"))
