"""Corpus readers and document cleaning: Wikipedia dumps (fixture + shared sample), WikiExtractor, text, hf:,
builtin."""

from __future__ import annotations

import bz2
import functools
import itertools
import json
import os

import pytest

from bertforge.data import sources
from bertforge.data.documents import clean_document, run_docs, run_wiki
from bertforge.errors import UserError

NS = "http://www.mediawiki.org/xml/export-0.10/"


def _page(title, ns, text, redirect=False):
    red = f'<redirect title="{title} target" />' if redirect else ""
    return (
        f"<page><title>{title}</title><ns>{ns}</ns><id>1</id>{red}<revision><id>2</id>"
        f'<text xml:space="preserve">{text}</text></revision></page>'
    )


ARTICLE = """{{Infobox river|name=Testriver|length=100 km}}
'''Testriver''' is a river in the [[Example Valley|valley of examples]]. It flows north.&lt;ref&gt;\
{{cite web|url=http://x|title=Source title}}&lt;/ref&gt; Its water is cold.

== History ==
The river was named in 1850 by a surveyor.&lt;ref name="a"&gt;Reference text here.&lt;/ref&gt;\
 The name means &lt;b&gt;cold water&lt;/b&gt; in the local language.
* Settlers arrived in 1870 and built mills.
* A bridge opened in 1901.

{| class="wikitable"
|-
! Year !! Flow
|-
| 1900 || 12
|}
[[File:Testriver.jpg|thumb|A view of the river]]
&lt;!-- hidden comment --&gt;
[[Category:Rivers]]
[[de:Testfluss]]
"""


def _dump(path, compress=True):
    body = (
        f'<mediawiki xmlns="{NS}" version="0.10"><siteinfo><sitename>Test</sitename></siteinfo>'
        + _page("Testriver", 0, ARTICLE)
        + _page("Old river", 0, "#REDIRECT [[Testriver]]", redirect=True)
        + _page("Talk:Testriver", 1, "This talk page should never appear in the output at all. " * 5)
        + _page("Second", 0, "A second article about lakes. Lakes are calm and deep. " * 6)
        + "</mediawiki>"
    )
    data = body.encode("utf-8")
    path.write_bytes(bz2.compress(data) if compress else data)
    return path


def test_wiki_dump_fixture(tmp_path):
    dump = _dump(tmp_path / "test-pages-articles.xml.bz2")
    pages = list(sources.iter_wiki_dump(dump))
    assert [t for t, _ in pages] == ["Testriver", "Second"]  # ns 0 only, redirect skipped
    text = sources.wikitext_to_text(pages[0][1])
    for good in (
        "Testriver is a river in the valley of examples.",
        "It flows north.",
        "Its water is cold.",
        "cold water",
    ):
        assert good in text
    # list items are dropped, as WikiExtractor and the BERT paper do (the mwparserfromhell cleaner kept them)
    for bad in (
        "{{",
        "}}",
        "[[",
        "]]",
        "<ref",
        "Reference text",
        "Source title",
        "History",
        "==",
        "wikitable",
        "1900",
        "thumb",
        "Category",
        "Testfluss",
        "hidden comment",
        "'''",
        "<b>",
        "*",
        "Settlers arrived",
    ):
        assert bad not in text, bad
    res = run_wiki(dump, tmp_path / "docs", num_shards=2, min_doc_chars=20, workers=2, log=lambda *a: None)
    assert res["documents"] == 2
    out = (tmp_path / "docs" / "docs_0.txt").read_text() + (tmp_path / "docs" / "docs_1.txt").read_text()
    assert "talk page" not in out
    assert "It flows north." in out.split("\n")  # one sentence per line
    # a re-run with the same settings is skipped
    again = run_wiki(dump, tmp_path / "docs", num_shards=2, min_doc_chars=20, workers=1, log=lambda *a: None)
    assert again == json.loads((tmp_path / "docs" / "manifest.json").read_text())


def test_plain_xml_dump(tmp_path):
    dump = _dump(tmp_path / "d.xml", compress=False)
    assert len(list(sources.iter_wiki_dump(dump))) == 2


def test_bad_dumps(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        list(sources.iter_wiki_dump(tmp_path / "missing.xml.bz2"))
    full = bz2.compress(_dump(tmp_path / "x.xml", compress=False).read_bytes())
    (tmp_path / "cut.xml.bz2").write_bytes(full[: len(full) // 2])
    with pytest.raises(UserError, match="cut.xml.bz2.*corrupt or truncated"):
        list(sources.iter_wiki_dump(tmp_path / "cut.xml.bz2"))
    (tmp_path / "junk.xml.bz2").write_bytes(b"this is not bzip2 at all")
    with pytest.raises(UserError, match="junk.xml.bz2"):
        run_wiki(tmp_path / "junk.xml.bz2", tmp_path / "out", workers=1, log=lambda *a: None)
    assert not list((tmp_path / "out").iterdir())  # nothing half-written left behind


def test_shared_dump_sample(shared_data, tmp_path):
    dump = shared_data / "wikipedia_dump_sample" / "enwiki-table-markup.xml.bz2"
    pages = list(sources.iter_wiki_dump(dump))
    assert len(pages) == 5
    res = run_wiki(dump, tmp_path / "docs", num_shards=1, workers=2, log=lambda *a: None)
    assert res["documents"] == 5
    text = (tmp_path / "docs" / "docs_0.txt").read_text()
    for bad in ("{|", "|-", "{{", "[[", "<ref", "==", "class=", "'''"):
        assert bad not in text, bad
    assert "Estonia" in text


def test_wikiextractor_dir(shared_data, tmp_path):
    d = shared_data / "wikipedia_dump_sample" / "wikiextractor_vi_pair" / "text"
    docs = list(sources.iter_source(str(d)))
    assert len(docs) > 5 and all("<doc" not in t and "</doc>" not in t for _, t in docs)
    (tmp_path / "AA").mkdir()
    (tmp_path / "AA" / "wiki_00").write_text(
        '<doc id="1" url="u" title="Alpha">\nAlpha\n\nAlpha is a letter. It comes first.\n</doc>\n'
        '<doc id="2" url="u" title="Beta">\nBeta\n\nBeta is second.\n</doc>\n'
    )
    assert list(sources.iter_source(str(tmp_path))) == [
        ("Alpha", "\nAlpha is a letter. It comes first.\n"),
        ("Beta", "\nBeta is second.\n"),
    ]


def test_wikiextractor_html_escapes_undone(tmp_path):
    """WikiExtractor's default --html-safe writes html.escape(text, quote=False): `&amp;` was read as is and
    tokenized as `&`, `amp`, `;`. The title (unescaped in WikiExtractor's output) still drops the title line."""
    src = tmp_path / "text"
    (src / "AA").mkdir(parents=True)
    (src / "AA" / "wiki_00").write_text(
        '<doc id="7" url="u" title="Hennes & Mauritz">\nHennes & Mauritz\n\n'
        "Hennes &amp; Mauritz sells clothes; 3 &lt; 4 &gt; 2.\n</doc>\n"
    )
    body = "Hennes & Mauritz sells clothes; 3 < 4 > 2.\n"
    assert list(sources.iter_source(str(src))) == [("Hennes & Mauritz", "\n" + body)]
    manifest = run_docs(str(src), tmp_path / "docs", num_shards=1, min_doc_chars=1, workers=1, log=lambda *_: None)
    assert "wikiextractor" in manifest["settings"]["cleaner"]  # documents of the escaped reading are rebuilt
    assert (tmp_path / "docs" / "docs_0.txt").read_text() == body + "\n"


def test_text_files_wikitext_and_cleaning(tmp_path):
    (tmp_path / "a.txt").write_text("First doc line one.\nLine two.\n\n\nSecond doc.\n")
    assert [t for _, t in sources.iter_source(str(tmp_path / "a.txt"))] == [
        "First doc line one.\nLine two.\n",
        "Second doc.\n",
    ]
    assert len(list(sources.iter_source(str(tmp_path / "*.txt"), one_doc_per_file=True))) == 1
    (tmp_path / "w.raw").write_text(
        " \n = Alpha = \n \n Alpha is a role @-@ playing game . It sold well . \n \n"
        " = = Reception = = \n \n Critics liked it . \n \n = Beta = \n \n Beta text . \n"
    )
    docs = list(sources.iter_source(str(tmp_path / "w.raw")))
    assert [t for t, _ in docs] == ["Alpha", "Beta"]
    assert "role-playing" in docs[0][1] and "Reception" not in docs[0][1] and "Critics liked it" in docs[0][1]
    assert clean_document("Hello\u00a0  world.\x07 Second  sentence here.\n\nNew para.") == [
        "Hello world.",
        "Second sentence here.",
        "New para.",
    ]
    (tmp_path / "bad.txt").write_bytes(b"ok line\n\xff\xfe broken\n")
    with pytest.raises(UserError, match="bad.txt.*UTF-8"):
        run_docs(str(tmp_path / "bad.txt"), tmp_path / "o", workers=1, log=lambda *a: None)
    (tmp_path / "short.txt").write_text("tiny.\n")
    with pytest.raises(UserError, match="empty or too short"):
        run_docs(str(tmp_path / "short.txt"), tmp_path / "o2", workers=1, log=lambda *a: None)


def test_hf_local_and_offline(tmp_path):
    import datasets

    ds = datasets.Dataset.from_dict({"title": ["A", "B"], "text": ["Alpha text here.", "Beta text here."]})
    ds.save_to_disk(str(tmp_path / "ds"))
    assert list(sources.iter_source(f"hf:{tmp_path / 'ds'}")) == [("A", "Alpha text here."), ("B", "Beta text here.")]
    (tmp_path / "rows.jsonl").write_text('{"text": "Gamma."}\n{"text": "Delta."}\n')
    assert [t for _, t in sources.iter_source(f"hf:{tmp_path / 'rows.jsonl'}")] == ["Gamma.", "Delta."]
    with pytest.raises(UserError, match="cannot load Hugging Face dataset.*offline"):
        list(sources.iter_source("hf:bertforge-no-such-dataset/xyz"))
    (tmp_path / "bad.jsonl").write_text("garbage{{{\n")  # a local file's own fault, not the network's
    with pytest.raises(UserError, match=r"hf:.*bad.jsonl: cannot read .*bad.jsonl: .*JSON parse error") as e:
        list(sources.iter_source(f"hf:{tmp_path / 'bad.jsonl'}"))
    assert "HF_HUB_OFFLINE" not in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(UserError, match="hf: names no dataset"):
        list(sources.iter_source("hf:"))


def test_builtin_python_docs():
    docs = list(itertools.islice(sources.iter_source("builtin:python-docs"), 30))
    assert len(docs) == 30 and all(t.startswith("topic:") for t, _ in docs)
    text = " ".join(t for _, t in docs)
    assert len(text) > 20000 and ">>>" not in text
    with pytest.raises(UserError, match="builtin:python-docs"):
        sources.iter_source("builtin:nope")


def test_cut_off_dump_keeps_pages_then_errors(shared_data):
    """The Vietnamese sample is a dump head cut off mid-file: pages before the cut come out, then a clear error."""
    dump = shared_data / "wikipedia_dump_sample" / "wikiextractor_vi_pair" / "test.xml"
    pages = []
    with pytest.raises(UserError, match="test.xml.*not valid XML"):
        for page in sources.iter_wiki_dump(dump):
            pages.append(page)
    assert len(pages) > 5
    prefixes = sources.non_article_prefixes(sources.dump_namespaces(dump))
    assert "tập tin:" in prefixes  # the Vietnamese name of the File namespace, from <siteinfo>
    texts = [sources.wikitext_to_text(w, prefixes) for _, w in pages[:6]]
    assert sum(bool(t) for t in texts) >= 4  # the main page is all templates/divs: empty is right
    assert all("{{" not in t and "[[" not in t and "|" not in t and "nhỏ|" not in t for t in texts)
    assert "ngôn ngữ" in texts[2]


def test_cli_wiki_and_vocab_from(tmp_path, shared_data, capsys):
    from bertforge.cli import main

    dump = _dump(tmp_path / "t.xml.bz2")
    assert (
        main(
            [
                "data",
                "wiki",
                "--dump",
                str(dump),
                "--out",
                str(tmp_path / "docs"),
                "--min-doc-chars",
                "20",
                "--shards",
                "1",
                "--workers",
                "1",
            ]
        )
        == 0
    )
    assert "It flows north." in (tmp_path / "docs" / "docs_0.txt").read_text()
    assert main(["data", "wiki", "--dump", str(tmp_path / "nope.xml.bz2"), "--out", str(tmp_path / "d2")]) == 2
    assert "nope.xml.bz2 does not exist" in capsys.readouterr().err
    vocab = shared_data / "bert_vocab" / "bert-base-uncased-vocab.txt"
    assert main(["data", "vocab", "--from", str(vocab), "--out", str(tmp_path / "v")]) == 0
    assert (tmp_path / "v" / "vocab.txt").read_bytes() == vocab.read_bytes()
    from bertforge.data.vocab import load_tokenizer

    assert load_tokenizer(tmp_path / "v").encode("Hello there").tokens == ["[CLS]", "hello", "there", "[SEP]"]


@pytest.mark.parametrize("suffix", [".xz", ".gz", ".bz2"])
def test_compressed_text_reads_like_plain(tmp_path, suffix):
    """One paragraph per line, a blank line between documents (shared/corpus's format), compressed."""
    import bz2
    import gzip
    import lzma

    text = "First paragraph of doc one.\nSecond paragraph, é.\n\n\nDoc two only paragraph.\n"
    plain = tmp_path / "c.txt"
    plain.write_text(text, encoding="utf-8")
    packed = tmp_path / f"c.txt{suffix}"
    packed.write_bytes({".xz": lzma, ".gz": gzip, ".bz2": bz2}[suffix].compress(text.encode()))
    docs = list(sources.iter_source(str(packed)))
    assert [d for _, d in docs] == [d for _, d in sources.iter_source(str(plain))]
    assert [d for _, d in docs] == ["First paragraph of doc one.\nSecond paragraph, é.\n", "Doc two only paragraph.\n"]
    cut = tmp_path / f"cut.txt{suffix}"
    cut.write_bytes(packed.read_bytes()[: len(packed.read_bytes()) // 2])
    with pytest.raises(UserError, match="not a complete"):
        list(sources.iter_source(str(cut)))


def test_missing_sentence_splitter_is_one_error_before_any_worker(tmp_path, monkeypatch):
    """An environment without blingfire (the GPU image had none) stops `data docs` at start-up with one line
    saying what to install, where it used to end in a worker's traceback after the pool started."""
    import importlib.util

    from bertforge.data import documents

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "blingfire" else real(name, *a))
    documents._splitter.cache_clear()
    monkeypatch.setattr(documents, "bounded_map", lambda *a: pytest.fail("workers started"))
    (tmp_path / "a.txt").write_text("One sentence here. Another one there.\n")
    try:
        with pytest.raises(UserError, match="blingfire.*pip install blingfire"):
            run_docs(str(tmp_path / "a.txt"), tmp_path / "o", workers=2, log=lambda *a: None)
    finally:
        documents._splitter.cache_clear()


def test_docs_out_inside_its_source_is_refused(tmp_path):
    """--out inside the folder --source reads: each re-run used to read the last run's documents and manifest
    as more corpus (20 -> 41 -> 62 documents)."""
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "a.txt").write_text("A first sentence of the corpus here. " * 20 + "\n")
    quiet = {"workers": 1, "log": lambda *a: None}
    for source, out in ((raw, raw / "docs"), (raw, raw), (raw / "**" / "*.txt", raw / "docs"), (raw / "*.txt", raw)):
        with pytest.raises(UserError, match="inside what --source"):
            run_docs(str(source), out, **quiet)
    assert not (raw / "docs").exists() and sorted(p.name for p in raw.iterdir()) == ["a.txt"]
    run_docs(str(raw / "a.txt"), raw / "docs", min_doc_chars=10, **quiet)  # one file: nothing else is read
    run_docs(str(raw / "*.txt"), raw / "docs", min_doc_chars=10, **quiet)  # the glob matches no docs_N.txt there


def test_docs_rerun_rebuilds_when_the_reading_or_the_files_change(tmp_path):
    """The up-to-date check compared only the source string: a new file the glob matches, an edited file, or
    --one-doc-per-file kept the old documents."""
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "a.txt").write_text("Alpha sentence one is here.\n\nAlpha sentence two is here.\n")
    logs: list[str] = []
    run = functools.partial(run_docs, str(raw / "*.txt"), tmp_path / "d", min_doc_chars=5, workers=1, log=logs.append)
    assert run()["documents"] == 2
    assert run()["documents"] == 2 and "up to date" in logs[-1]
    assert run(one_doc_per_file=True)["documents"] == 1
    (raw / "b.txt").write_text("Beta sentence is here.\n")
    assert run(one_doc_per_file=True)["documents"] == 2
    os.utime(raw / "b.txt", ns=(1, 1))  # same names and sizes, other times: an edit
    logs.clear()
    assert run(one_doc_per_file=True)["documents"] == 2 and not any("up to date" in m for m in logs)


def test_docs_refuses_more_shards_than_open_files_before_any_work(tmp_path):
    import resource

    (tmp_path / "a.txt").write_text("Some text that is long enough to keep. " * 10 + "\n")
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        pytest.skip("no open-file limit here")
    with pytest.raises(UserError, match="ulimit -n"):
        run_docs(str(tmp_path / "a.txt"), tmp_path / "o", num_shards=soft, workers=1, log=lambda *a: None)
    assert not list((tmp_path / "o").glob("*"))
