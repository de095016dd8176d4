"""Document sources, third audit: --headings documents of an older cleaner rebuilt, WikiExtractor articles
without their `</doc>` kept, folders a --source glob names read as folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertforge.data import documents, sources
from bertforge.errors import UserError

QUIET = {"num_shards": 1, "workers": 1, "log": lambda *_: None}
SITEINFO = (
    '<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/" version="0.10" xml:lang="en">\n'
    "<siteinfo><sitename>Test</sitename><namespaces>"
    '<namespace key="0" case="first-letter" /></namespaces></siteinfo>\n'
)
PROSE = "The river runs through the old town and past the mill. " * 5


def _page(text: str) -> str:
    return (
        '<page><title>Town</title><ns>0</ns><id>1</id><revision><id>2</id><text xml:space="preserve">'
        f"{text}</text></revision></page>\n"
    )


def _dump(path: Path) -> Path:
    text = f"{PROSE}\n== History ==\n=== Early years ===\n{PROSE}\n"
    path.write_text(SITEINFO + _page(text) + "</mediawiki>\n", encoding="utf-8")
    return path


def test_headings_documents_of_the_older_cleaner_are_rebuilt(tmp_path):
    """`--headings` documents written before stacked headings (only the innermost heading, "Early years.") were
    taken as up to date: the cleaner's version did not change with them. Documents without --headings, which did
    not change, are still up to date."""
    dump, out = _dump(tmp_path / "t.xml"), tmp_path / "o"
    new = documents.run_wiki(dump, out, headings=True, **QUIET)
    text = (out / "docs_0.txt").read_text(encoding="utf-8")
    assert "History.\nEarly years.\n" in text
    # what the older version left: its documents, and its manifest's settings (no heading_style in them)
    old_settings = {k: v for k, v in new["settings"].items() if k != "heading_style"}
    (out / "docs_0.txt").write_text(text.replace("History.\n", ""), encoding="utf-8")
    (out / "manifest.json").write_text(json.dumps(dict(new, settings=old_settings)), encoding="utf-8")
    lines: list[str] = []
    documents.run_wiki(dump, out, headings=True, **dict(QUIET, log=lines.append))
    assert not any("up to date" in ln for ln in lines)
    assert (out / "docs_0.txt").read_text(encoding="utf-8") == text
    # without --headings: an older manifest still matches, nothing is redone
    plain = documents.run_wiki(dump, tmp_path / "p", **QUIET)
    assert "heading_style" not in plain["settings"]
    lines.clear()
    documents.run_wiki(dump, tmp_path / "p", **dict(QUIET, log=lines.append))
    assert any("up to date" in ln for ln in lines)


def _doc(i: int, title: str, body: str, close: bool = True) -> str:
    return f'<doc id="{i}" url="https://en.wikipedia.org/wiki?curid={i}" title="{title}">\n{title}\n\n{body}\n' + (
        "</doc>\n" if close else ""
    )


def test_wikiextractor_articles_without_their_closing_tag_are_kept(tmp_path):
    """An article whose `</doc>` is missing (files cut and joined by hand, a file cut off at its end) was dropped
    without a word: the next `<doc>` line started over, and the end of the file ended nothing."""
    f = tmp_path / "wiki_00"
    f.write_text(
        _doc(1, "Alpha", "Alpha is a letter.", close=False)
        + _doc(2, "Beta", "Beta &amp; more.")
        + _doc(3, "Gamma", "Gamma is cut off.", close=False),
        encoding="utf-8",
    )
    got = list(sources.iter_source(str(f)))
    assert got == [
        ("Alpha", "\nAlpha is a letter.\n"),
        ("Beta", "\nBeta & more.\n"),
        ("Gamma", "\nGamma is cut off.\n"),
    ]


def _tree(root: Path) -> Path:
    """WikiExtractor's layout (text/AA/wiki_00, text/AB/wiki_00), a text file beside the folders, a hidden one."""
    for sub, i, title in (("AA", 1, "Alpha"), ("AB", 2, "Beta")):
        (root / "text" / sub).mkdir(parents=True)
        (root / "text" / sub / "wiki_00").write_text(_doc(i, title, f"{title} is a letter."), encoding="utf-8")
    (root / "text" / ".ipynb_checkpoints").mkdir()
    (root / "text" / ".ipynb_checkpoints" / "wiki_00").write_text(_doc(9, "Copy", "A copy."), encoding="utf-8")
    return root / "text"


def test_folders_a_glob_names_are_read_as_folders(tmp_path):
    """`--source 'text/*'` (WikiExtractor's AA, AB, ... folders) skipped every folder it named: "gave no documents
    (0 read)", and a glob naming files and folders lost the folders' documents without a word."""
    text = _tree(tmp_path)
    want = [("Alpha", "\nAlpha is a letter.\n"), ("Beta", "\nBeta is a letter.\n")]
    assert list(sources.iter_source(str(text / "*"))) == want
    assert list(sources.iter_source(str(text / "**"))) == want  # a recursive glob names each file once
    (text / "zz.txt").write_text("A plain document beside the folders.\n", encoding="utf-8")
    assert [t for t, _ in sources.iter_source(str(text / "*"))] == ["Alpha", "Beta", "zz"]
    manifest = documents.run_docs(str(text / "A*"), tmp_path / "o", min_doc_chars=1, **QUIET)
    assert manifest["documents"] == 2


def test_out_a_glob_would_name_is_refused(tmp_path):
    """With folders read, an --out the glob names (now or once written) would be read as corpus on the next run."""
    text = _tree(tmp_path)
    for out in (text / "docs", text / "AA" / "docs"):
        with pytest.raises(UserError, match="inside what --source"):
            documents.run_docs(str(text / "*"), out, min_doc_chars=1, **QUIET)
        assert not out.exists()
    documents.run_docs(str(text / "A*"), text / "docs", min_doc_chars=1, **QUIET)  # not named by 'A*'
    documents.run_docs(str(text / "*"), text / ".docs", min_doc_chars=1, **QUIET)  # '*' skips hidden names


def test_documents_of_a_glob_whose_folders_were_skipped_are_rebuilt(tmp_path):
    """The documents an older version wrote for a glob naming files and folders lacked the folders' files, yet
    matched the settings (the inputs' signature already covered the folders): a re-run kept them."""
    text = _tree(tmp_path)
    (text / "zz.txt").write_text("A plain document beside the folders.\n", encoding="utf-8")
    out = tmp_path / "o"
    new = documents.run_docs(str(text / "*"), out, min_doc_chars=1, **QUIET)
    assert new["documents"] == 3
    old_settings = {k: v for k, v in new["settings"].items() if k != "glob_folders"}
    (out / "manifest.json").write_text(json.dumps(dict(new, settings=old_settings, documents=1)), encoding="utf-8")
    assert documents.run_docs(str(text / "*"), out, min_doc_chars=1, **QUIET)["documents"] == 3
    # a folder given itself, or a glob of files, records nothing new: their documents did not change
    assert "glob_folders" not in documents.run_docs(str(text), tmp_path / "d", min_doc_chars=1, **QUIET)["settings"]
    assert (
        "glob_folders"
        not in documents.run_docs(str(text / "*.txt"), tmp_path / "g", min_doc_chars=1, **QUIET)["settings"]
    )


def test_empty_documents_are_dropped_at_min_doc_chars_0(tmp_path):
    """--min-doc-chars 0 wrote an empty document (WikiExtractor's redirect stubs, an article of templates alone) as
    blank lines and counted it: the manifest said 4 documents of a text shard holding 2."""
    f = tmp_path / "wiki_00"
    f.write_text(
        _doc(1, "A", "") + _doc(2, "B", "Beta text here.") + _doc(3, "C", "") + _doc(4, "D", "Delta."),
        encoding="utf-8",
    )
    m = documents.run_docs(str(f), tmp_path / "o", min_doc_chars=0, **QUIET)
    assert (m["documents"], m["dropped_short"]) == (2, 2)
    assert (tmp_path / "o" / "docs_0.txt").read_text(encoding="utf-8") == "Beta text here.\n\nDelta.\n\n"
    dump = tmp_path / "t.xml"
    dump.write_text(SITEINFO + _page("{{Infobox}}") + _page("Some prose.") + "</mediawiki>\n", encoding="utf-8")
    m = documents.run_wiki(dump, tmp_path / "w", min_doc_chars=0, **QUIET)
    assert (m["documents"], m["dropped_short"]) == (1, 1)
    assert (tmp_path / "w" / "docs_0.txt").read_text(encoding="utf-8") == "Some prose.\n\n"


def test_json_lines_given_as_text_are_refused_and_read_by_hf(tmp_path):
    """A C4/Pile-style `.jsonl` (no "title", so not WikiExtractor's) given as text became one document of JSON
    syntax (`{"text": "...", "url": ...}` lines); hf: could not read C4's own `.json.gz`."""
    import gzip

    rows = [{"text": f"Document {i} says something of its own here.", "url": f"u{i}"} for i in range(3)]
    data = "".join(json.dumps(r) + "\n" for r in rows)
    (tmp_path / "c4.jsonl").write_text(data, encoding="utf-8")
    with gzip.open(tmp_path / "c4.json.gz", "wt", encoding="utf-8") as f:
        f.write(data)
    for name in ("c4.jsonl", "c4.json.gz"):
        with pytest.raises(UserError, match=f"JSON lines.*hf:{tmp_path / name}"):
            list(sources.iter_source(str(tmp_path / name)))
    got = list(sources.iter_source(f"hf:{tmp_path / 'c4.json.gz'}"))
    assert [text for _, text in got] == [r["text"] for r in rows]
