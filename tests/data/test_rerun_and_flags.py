"""A re-run with fewer shards leaves nothing a reader would take for data; --out, --eval-out and --docs in
places of their own; the flags of `data docs`/`wiki`/`vocab`/`shards` checked at start-up in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.helpers import one_line

from bertforge.cli import main
from bertforge.data.build import document_files
from bertforge.data.shardset import ShardSet
from bertforge.data.vocab import train_wordpiece
from bertforge.errors import UserError

TEXT = "\n\n".join(
    f"Document {i} tells of the river and the mountain.\nIt has a second line about the forest {i}." for i in range(12)
)


@pytest.fixture
def corpus(tmp_path) -> tuple[Path, Path]:
    src = tmp_path / "src.txt"
    src.write_text(TEXT + "\n", encoding="utf-8")
    docs = tmp_path / "docs"
    assert (
        main(["data", "docs", "--source", str(src), "--out", str(docs), "--shards", "4", "--min-doc-chars", "5"]) == 0
    )
    train_wordpiece(document_files(docs), tmp_path / "vocab", vocab_size=80)
    return docs, tmp_path / "vocab" / "tokenizer.json"


def _shards(docs: Path, vocab: Path, out: Path, *extra: str) -> list[str]:
    return ["data", "shards", "--docs", str(docs), "--vocab", str(vocab), "--out", str(out), "--seq-len", "32",
            "--max-pred", "4", "--dupe-factor", "1", "--workers", "1", *extra]  # fmt: skip


def test_a_rerun_with_fewer_shards_removes_the_earlier_runs_extra_files(corpus, tmp_path, capsys):
    docs, vocab = corpus
    src = tmp_path / "src.txt"
    assert (
        main(["data", "docs", "--source", str(src), "--out", str(docs), "--shards", "2", "--min-doc-chars", "5"]) == 0
    )
    assert sorted(p.name for p in docs.glob("*.txt")) == ["docs_0.txt", "docs_1.txt"]
    assert "removed docs_2.txt, docs_3.txt" in capsys.readouterr().out
    assert len(document_files(docs)) == 2
    out = tmp_path / "shards"
    assert main(_shards(docs, vocab, out, "--shards", "3")) == 0
    assert main(_shards(docs, vocab, out, "--shards", "1")) == 0
    assert sorted(p.name for p in out.glob("*.hdf5")) == ["train_0.hdf5"]
    assert "removed train_1.hdf5, train_2.hdf5" in capsys.readouterr().out


def test_docs_refuse_an_out_dir_holding_document_files_of_someone_elses(tmp_path, capsys):
    """`data docs --out` where the user keeps docs_N.txt files of their own: refused in one line before any
    work, the files untouched; the same directory after our own run (its manifest lists them) re-runs."""
    src, out = tmp_path / "src.txt", tmp_path / "mine"
    src.write_text(TEXT + "\n", encoding="utf-8")
    out.mkdir()
    for i in (0, 1, 12):
        (out / f"docs_{i}.txt").write_text(f"my own notes {i}\n", encoding="utf-8")
    argv = ["data", "docs", "--source", str(src), "--out", str(out), "--shards", "2", "--min-doc-chars", "5"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert one_line(err) and "holds docs_0.txt, docs_1.txt and 1 more, which no manifest.json" in err
    assert [(out / f"docs_{i}.txt").read_text() for i in (0, 1, 12)] == [f"my own notes {i}\n" for i in (0, 1, 12)]
    assert not (out / "manifest.json").exists()
    (out / "docs_12.txt").unlink()
    (out / "manifest.json").write_text(json.dumps({"files": ["docs_0.txt", "docs_1.txt"]}))  # as a run of ours
    assert main(argv) == 0 and "Document 0 tells" in (out / "docs_0.txt").read_text()


def test_readers_take_only_what_the_manifest_lists(corpus, tmp_path, capsys):
    docs, vocab = corpus
    (docs / "vocab.txt").write_text("[PAD]\n[UNK]\n", encoding="utf-8")  # `data vocab --out` the docs dir
    assert [p.name for p in document_files(docs)] == [f"docs_{i}.txt" for i in range(4)]
    out = tmp_path / "shards"
    assert main(_shards(docs, vocab, out, "--shards", "1")) == 0
    (out / "train_7.hdf5").write_bytes((out / "train_0.hdf5").read_bytes())  # another run's shard, by hand
    with pytest.raises(UserError, match="train_7.hdf5 is not in the manifest"):
        ShardSet.open(out)
    (docs / "docs_2.txt").unlink()
    with pytest.raises(UserError, match="docs_2.txt is missing"):
        document_files(docs)


@pytest.mark.parametrize("where", ["eval_is_out", "out_is_docs", "eval_is_docs"])
def test_shards_refuse_out_eval_out_and_docs_in_one_place(corpus, tmp_path, capsys, where):
    docs, vocab = corpus
    out, ev = {"eval_is_out": (tmp_path / "s", tmp_path / "s"), "out_is_docs": (docs, tmp_path / "e"),
               "eval_is_docs": (tmp_path / "s", docs)}[where]  # fmt: skip
    manifest = (docs / "manifest.json").read_text()
    assert main(_shards(docs, vocab, out, "--eval-out", str(ev), "--eval-fraction", "0.2")) == 2
    one_line(capsys.readouterr().err, "a directory of their own" if where == "eval_is_out" else "holds the documents")
    assert (docs / "manifest.json").read_text() == manifest


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["docs", "--source", "", "--out", "o"], "docs.source (--source, --dump) is empty"),
        (["docs", "--source", "x.txt", "--out", "o", "--min-doc-chars", "-4"], "(--min-doc-chars) must be >= 0"),
        (["docs", "--source", "x.txt", "--out", "o", "--workers", "-3"], "(--workers) must be >= 0"),
        (["wiki", "--dump", "x.xml", "--out", "o", "--workers", "-1"], "(--workers) must be >= 0"),
        (["vocab", "--docs", "d", "--out", "o", "--unused", "-1"], "(--unused) must be >= 0"),
        (["shards", "--docs", "d", "--vocab", "v", "--out", "o", "--seed", "-1"], "(--seed) must be >= 0"),
        (["shards", "--docs", "d", "--vocab", "v", "--out", "o", "--seq-len", "40000"], "at most 32768"),
        (["shards", "--docs", "d", "--vocab", "v", "--out", "o", "--max-pred", "200"], "more than the 128 tokens"),
    ],
)
def test_bad_flags_are_one_line_before_anything_is_read_or_written(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    assert main(["data", *argv]) == 2
    one_line(capsys.readouterr().err, message)
    assert not (tmp_path / "o").exists()


def test_vocab_on_a_document_that_is_not_utf8_is_one_line(tmp_path, capsys):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "docs_0.txt").write_bytes(b"caf\xe9 au lait\n")
    assert (
        main(["data", "vocab", "--docs", str(tmp_path / "d"), "--out", str(tmp_path / "v"), "--vocab-size", "80"]) == 2
    )
    one_line(capsys.readouterr().err, "docs_0.txt is not UTF-8 text")
    assert not (tmp_path / "v").exists()


def test_more_shards_than_open_files_allow_is_refused_at_start(corpus, tmp_path, capsys):
    import resource

    docs, vocab = corpus
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert main(_shards(docs, vocab, tmp_path / "s", "--shards", str(soft))) == 2
    one_line(capsys.readouterr().err, f"{soft} shards need {soft} files open at once", "ulimit -n")
    assert json.loads((docs / "manifest.json").read_text())["files"]  # the documents untouched


def test_out_dirs_holding_other_steps_or_your_own_files_are_refused_and_kept(corpus, tmp_path, capsys):
    """`data shards` deleted a user's train_5.hdf5 "as an earlier run's", replaced a docs or train manifest when
    pointed at their folders, and `data docs`/`pack` wrote over shards' folders (a reader then saw mixed kinds):
    each is now refused in one line before any work, and what was there is kept."""
    import h5py

    docs, vocab = corpus
    mine = tmp_path / "mine"
    mine.mkdir()
    with h5py.File(mine / "train_5.hdf5", "w") as f:
        f["x"] = [1]
    assert main(_shards(docs, vocab, mine, "--shards", "2")) == 2
    one_line(capsys.readouterr().err, "holds train_5.hdf5, which `data shards` did not write")
    assert sorted(p.name for p in mine.iterdir()) == ["train_5.hdf5"]

    out = tmp_path / "s"
    assert main(_shards(docs, vocab, out, "--shards", "1")) == 0
    docs_before = {p.name: p.read_bytes() for p in docs.iterdir()}
    src = tmp_path / "src.txt"
    attempts = [
        (_shards(docs, vocab, tmp_path / "s2", "--eval-out", str(out), "--eval-fraction", "0.2"), "for eval"),
        (_shards(docs, vocab, out, "--shards", "1", "--dupe-factor", "2"), None),  # its own folder: a re-run
        (["data", "docs", "--source", str(src), "--out", str(out), "--min-doc-chars", "5"], "data docs` did not"),
        (["pack", "--in", str(out), "--out", str(mine)], "holds train_5.hdf5 of unpacked shards"),
    ]
    for argv, message in attempts:
        if message is None:
            assert main(argv) == 0
            continue
        assert main(argv) == 2, argv
        one_line(capsys.readouterr().err, message)
    capsys.readouterr()
    assert {p.name: p.read_bytes() for p in docs.iterdir()} == docs_before
    other = tmp_path / "docs2"
    assert main(["data", "docs", "--source", str(src), "--out", str(other), "--min-doc-chars", "5"]) == 0
    assert main(_shards(docs, vocab, other, "--shards", "1")) == 2
    one_line(capsys.readouterr().err, "did not write for train shards")


def test_cased_rerun_rebuilds_the_shards(corpus, tmp_path, capsys):
    """--cased was not part of the shards' parameter hash: a re-run kept the uncased shards as finished."""
    docs, vocab = corpus
    out = tmp_path / "s"
    assert main(_shards(docs, vocab, out, "--shards", "1")) == 0
    assert main(_shards(docs, vocab, out, "--shards", "1")) == 0
    assert "kept" in capsys.readouterr().out
    assert main(_shards(docs, vocab, out, "--shards", "1", "--cased")) == 0
    assert "kept" not in capsys.readouterr().out
    assert main(_shards(docs, vocab, out, "--shards", "1", "--cased")) == 0
    assert "kept" in capsys.readouterr().out  # and kept as the cased run's


def test_vocab_out_keeps_a_vocab_it_did_not_write_and_refuses_conflicting_flags(corpus, tmp_path, capsys):
    """`data vocab --out` replaced (or, with --model bpe, deleted) a downloaded vocab.txt kept there; --from with
    --docs dropped --docs silently; --from a BPE vocab wrote a vocab.txt of Ġ-tokens (61% [UNK] as WordPiece)."""
    docs, _ = corpus
    mine = tmp_path / "google"
    mine.mkdir()
    (mine / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\n", encoding="utf-8")
    for extra in ([], ["--model", "bpe"]):
        argv = ["data", "vocab", "--docs", str(docs), "--out", str(mine), "--vocab-size", "90", *extra]
        assert main(argv) == 2
        one_line(capsys.readouterr().err, "holds a vocab.txt that `data vocab` did not write")
    assert [p.name for p in mine.iterdir()] == ["vocab.txt"] and (mine / "vocab.txt").read_text().endswith("the\n")
    argv = ["data", "vocab", "--docs", str(docs), "--from", str(mine / "vocab.txt"), "--out", str(tmp_path / "v")]
    assert main(argv) == 2
    one_line(capsys.readouterr().err, "give one of them")
    bpe, copy = tmp_path / "bpe", tmp_path / "copy"
    assert main(["data", "vocab", "--docs", str(docs), "--out", str(bpe), "--model", "bpe", "--vocab-size", "300"]) == 0
    assert main(["data", "vocab", "--from", str(bpe), "--out", str(copy)]) == 0
    assert sorted(p.name for p in copy.iterdir()) == ["tokenizer.json"]
    # our own vocab directory re-runs
    assert main(["data", "vocab", "--docs", str(docs), "--out", str(bpe), "--vocab-size", "90"]) == 0
    assert sorted(p.name for p in bpe.iterdir()) == ["tokenizer.json", "vocab.txt"]


def test_a_resumed_run_leaves_the_shards_it_keeps_out_of_its_rates(corpus, tmp_path, capsys):
    """Shards found finished took no time in this run: counted, they made docs/s, tokens/s and the ETA read high."""
    docs, vocab = corpus
    out = tmp_path / "shards"
    assert main(_shards(docs, vocab, out, "--shards", "3")) == 0
    (out / "train_1.hdf5").unlink()
    capsys.readouterr()
    assert main(_shards(docs, vocab, out, "--shards", "3")) == 0
    kept = next(line for line in capsys.readouterr().out.splitlines() if "train_0.hdf5" in line)
    assert "| 0 shards/s | eta ? |" in kept and "(kept, already finished) | 0 docs/s | 0.00 M tokens/s" in kept


def test_docs_glob_naming_folders_reads_each_as_a_folder(tmp_path):
    """`data shards --docs 'runs/*/docs'` (two corpora's document folders): each folder named is read as a folder
    is (its listed documents), as `data docs --source` reads one; before, the glob's folders were skipped and the
    run stopped with "no document files"."""
    for name in ("a", "b"):
        docs = tmp_path / name / "docs"
        docs.mkdir(parents=True)
        (docs / "docs_0.txt").write_text(f"{name} one.\n")
        (docs / "docs_1.txt").write_text(f"{name} two.\n")
    found = document_files(str(tmp_path / "*" / "docs"))
    assert [p.relative_to(tmp_path).as_posix() for p in found] == [
        "a/docs/docs_0.txt", "a/docs/docs_1.txt", "b/docs/docs_0.txt", "b/docs/docs_1.txt",
    ]  # fmt: skip
