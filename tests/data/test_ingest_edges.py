"""Text ingestion on realistic user inputs: WikiExtractor output in its other shapes (--json, -c, --revision, a
.DS_Store beside it, a glob of its files), byte-order marks, stray line breaks, non-UTF-8 bytes deep in a file,
an edited hf: file, hidden folders inside a source directory."""

from __future__ import annotations

import bz2
import gzip
import json
import os

import pytest

from bertforge.data import sources
from bertforge.data.documents import clean_document, run_docs
from bertforge.errors import UserError

ALPHA = '<doc id="1" url="https://en.wikipedia.org/wiki?curid=1" title="Alpha">\nAlpha\n\nAlpha is a letter.\n</doc>\n'
BETA = '<doc id="2" url="https://en.wikipedia.org/wiki?curid=2" title="Beta">\nBeta\n\nBeta &amp; more.\n</doc>\n'
BOTH = (ALPHA + BETA).encode()
EXPECTED = [("Alpha", "\nAlpha is a letter.\n"), ("Beta", "\nBeta & more.\n")]


def _quiet(*_):
    pass


def _extractor_dir(root, name="wiki_00", data=BOTH):
    (root / "AA").mkdir(parents=True)
    (root / "AA" / name).write_bytes(data)
    return root


def test_wikiextractor_dir_beside_a_hidden_file(tmp_path):
    """macOS leaves .DS_Store in the folder: sorted first, it made the folder plain text (`<doc ...>` lines and the
    repeated titles became sentences)."""
    src = _extractor_dir(tmp_path / "text")
    (src / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
    assert list(sources.iter_source(str(src))) == EXPECTED
    assert sources.markup(str(src)) == "wikiextractor"


def test_wikiextractor_compressed_output(tmp_path):
    """`WikiExtractor -c` writes wiki_00.bz2: it was read as bz2 plain text, tags included."""
    src = _extractor_dir(tmp_path / "text", "wiki_00.bz2", bz2.compress(BOTH))
    assert list(sources.iter_source(str(src))) == EXPECTED


def test_wikiextractor_revision_ids_keep_every_article(tmp_path):
    """`--revision` puts revid="..." before url: those articles were skipped without a word."""
    src = _extractor_dir(tmp_path / "text", data=(ALPHA.replace(' url="', ' revid="99" url="') + BETA).encode())
    assert list(sources.iter_source(str(src))) == EXPECTED
    # other tools write attributes after the title: the title still ends at its own quote
    assert sources._DOC_OPEN.match('<doc id="12" url="u" title="Anarchism" lang="en">')[1] == "Anarchism"
    assert sources._DOC_OPEN.match('<doc id="1" url="u" title="Foo "bar" baz">')[1] == 'Foo "bar" baz'


def test_wikiextractor_json_lines(tmp_path):
    """`--json` writes one object per line (v3: text without the title; v2: the title line first, as in <doc>):
    it was one document of raw JSON."""
    lines = [
        {"id": "1", "revid": "5", "url": "u", "title": "Alpha", "text": "Alpha is a letter.\nIt comes first."},
        {"id": "2", "url": "u", "title": "Beta &amp; Co", "text": "Beta &amp; Co\n\nBeta &amp; more."},
    ]
    src = _extractor_dir(tmp_path / "text", data="".join(json.dumps(o) + "\n" for o in lines).encode())
    assert list(sources.iter_source(str(src))) == [
        ("Alpha", "Alpha is a letter.\nIt comes first."),
        ("Beta & Co", "\nBeta & more."),
    ]
    (src / "AA" / "wiki_01").write_text(json.dumps(lines[0]) + "\n" + json.dumps(lines[1])[:30])  # killed writer
    with pytest.raises(UserError, match=r"wiki_01 line 2 is not a WikiExtractor --json article"):
        list(sources.iter_source(str(src)))


def test_wikiextractor_files_by_glob_or_alone_and_with_bom(tmp_path):
    """Its files named by a glob (text/*/wiki_*) or one by one were plain text; a byte-order mark hid the tag."""
    src = _extractor_dir(tmp_path / "text", data=b"\xef\xbb\xbf" + BOTH)
    for source in (str(src / "*" / "wiki_*"), str(src / "AA" / "wiki_00"), str(src)):
        assert list(sources.iter_source(source)) == EXPECTED, source
        assert sources.markup(source) == "wikiextractor"


def test_wikitext_raw_file_with_bom(tmp_path):
    """A byte-order mark before ` = Title = ` made a WikiText file plain text (headings and @-@ kept)."""
    (tmp_path / "wiki.raw").write_bytes(b"\xef\xbb\xbf = Tower = \n\n A 10 @-@ storey tower . \n\n = = History = = \n")
    assert list(sources.iter_source(str(tmp_path / "wiki.raw"))) == [("Tower", "A 10-storey tower .")]


def test_non_utf8_error_gives_the_file_offset(tmp_path):
    """The offset was the one inside the decoder's 8 KB block (here 3620 instead of 20004)."""
    (tmp_path / "latin.txt").write_bytes(b"a" * 20000 + b"\ncaf\xe9\n")
    with pytest.raises(UserError, match=r"latin\.txt is not valid UTF-8 \(byte 20004: invalid continuation"):
        list(sources.iter_source(str(tmp_path / "latin.txt")))
    (tmp_path / "latin.txt.gz").write_bytes(gzip.compress(b"b" * 70000 + b"\xff"))
    with pytest.raises(UserError, match=r"byte 70000: invalid start byte"):
        list(sources.iter_source(str(tmp_path / "latin.txt.gz")))


def test_stray_line_breaks_stay_sentence_and_document_boundaries():
    """A lone CR stayed inside a sentence (every reader of the documents breaks the line there, and CR CR gave a
    blank line: a document boundary); form feed and U+2028 were dropped, gluing the words around them."""
    sents = clean_document("First part\rsecond part.\r\rThird one.\x0cFourth one.\u2028Fifth one.")
    assert sents == ["First part", "second part.", "Third one.", "Fourth one.", "Fifth one."]
    assert not any(c in s for s in sents for c in "\r\x0b\x0c\u2028")


def test_hf_local_file_edit_rebuilds_the_documents(tmp_path):
    """hf:FILE recorded no input signature: after the file was edited, a re-run said "up to date"."""
    data = tmp_path / "corpus.jsonl"
    data.write_text(json.dumps({"text": "One document of text. It has two sentences."}) + "\n")
    source, out = f"hf:{data}", tmp_path / "docs"
    assert run_docs(source, out, 1, 1, workers=1, log=_quiet)["documents"] == 1
    rows = [json.dumps({"text": f"Document {i} of text. It has two sentences."}) + "\n" for i in range(3)]
    data.write_text("".join(rows))
    os.utime(data, ns=(1, 10**18))  # a new mtime even on coarse-clock file systems
    assert run_docs(source, out, 1, 1, workers=1, log=_quiet)["documents"] == 3


def test_hidden_folders_inside_a_source_dir_are_not_read(tmp_path):
    """Jupyter's .ipynb_checkpoints/ holds a copy of each text file: every document was read twice."""
    (tmp_path / "corpus" / ".ipynb_checkpoints").mkdir(parents=True)
    (tmp_path / "corpus" / "a.txt").write_text("A sentence here.\n")
    (tmp_path / "corpus" / ".ipynb_checkpoints" / "a-checkpoint.txt").write_text("A sentence here.\n")
    assert list(sources.iter_source(str(tmp_path / "corpus"))) == [("a", "A sentence here.\n")]


def test_shared_wikiextractor_sample_compressed_and_by_glob(shared_data, tmp_path):
    """The real Vietnamese WikiExtractor output reads the same as a directory, compressed (-c) and by glob."""
    text = shared_data / "wikipedia_dump_sample" / "wikiextractor_vi_pair" / "text"
    want = list(sources.iter_source(str(text)))
    assert len(want) == 9 and not any("<doc" in t or "</doc>" in t for _, t in want)
    src = _extractor_dir(tmp_path / "c", "wiki_00.bz2", bz2.compress((text / "AA" / "wiki_00").read_bytes()))
    (src / ".DS_Store").write_bytes(b"\x00")
    assert list(sources.iter_source(str(src))) == want
    assert list(sources.iter_source(str(text / "*" / "wiki_*"))) == want


def test_documents_read_back_as_a_corpus_leave_their_manifest_out(tmp_path):
    """Re-dealing documents into other --shards (`data docs --source DOCS_DIR`) made their manifest.json, a few
    hundred characters of JSON, one more document."""
    (tmp_path / "a.txt").write_text("".join(f"Sentence number {i} of document {i}.\n\n" for i in range(4)))
    first = run_docs(str(tmp_path / "a.txt"), tmp_path / "docs", 2, 1, workers=1, log=_quiet)
    for source in (str(tmp_path / "docs"), str(tmp_path / "docs" / "*")):
        again = run_docs(source, tmp_path / "again", 1, 1, workers=1, log=_quiet)
        assert again["documents"] == first["documents"] == 4, source
        assert "settings" not in (tmp_path / "again" / "docs_0.txt").read_text()
