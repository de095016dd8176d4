"""`bertforge data` checked before any work: `data vocab --from` a tokenizer.json that is neither WordPiece nor BPE
leaves no earlier vocab.txt beside it (and says which files it wrote), and refuses the training flags it would
ignore; `data prepare` reads vocab.vocab_file and checks its vocab directory before the documents step (hours on a
Wikipedia dump), not after it; an empty path flag is refused, not taken for the working directory."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.helpers import one_line
from tokenizers import Tokenizer, models, pre_tokenizers

from bertforge.cli import main

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _word_level(path: Path) -> Path:
    """A WordLevel tokenizer.json (BERT's special tokens, a few words) in directory `path`."""
    vocab = {t: i for i, t in enumerate([*SPECIALS, "document", "river", "the"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path.mkdir()
    tok.save(str(path / "tokenizer.json"))
    return path


def test_vocab_from_a_word_level_tokenizer_leaves_no_earlier_vocab_txt(tiny_corpus, tmp_path, capsys):
    # the earlier WordPiece vocab.txt stayed beside the new tokenizer.json, and the log said both were written:
    # a reader of vocab.txt (a BertTokenizer, `data shards --vocab out/vocab.txt`) got the other vocab
    out = tmp_path / "vocab"
    assert main(["data", "vocab", "--docs", str(tiny_corpus), "--out", str(out), "--vocab-size", "100"]) == 0
    assert (out / "vocab.txt").is_file()
    capsys.readouterr()
    assert main(["data", "vocab", "--from", str(_word_level(tmp_path / "wl")), "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert not (out / "vocab.txt").exists()
    assert f"{out}/tokenizer.json (wordlevel)" in said and "vocab.txt, tokenizer.json" not in said
    assert Tokenizer.from_file(str(out / "tokenizer.json")).get_vocab_size() == 8


def _prepare(source: Path, out: Path, *sets: str) -> list[str]:
    base = [f"docs.source={source}", "docs.min_doc_chars=10", "docs.workers=1", "shards.workers=1", f"output_dir={out}"]
    base += ["shards.num_shards=1", "shards.dupe_factor=1", "shards.seq_len=32", "shards.max_pred=4"]
    base += ["shards.eval_fraction=0", "vocab.vocab_size=100"]
    return ["data", "prepare", "--config", "demo", *(x for s in [*base, *sets] for x in ("--set", s))]


@pytest.mark.parametrize("vocab_file", ["empty.txt", "."])
def test_prepare_reads_its_vocab_file_before_the_documents_step(tiny_corpus, tmp_path, capsys, vocab_file):
    # only its existence was checked: an empty vocab.txt or a directory without one failed after the documents
    (tmp_path / "empty.txt").write_text("", encoding="utf-8")
    out = tmp_path / "prepared"
    assert main(_prepare(tiny_corpus, out, f"vocab.vocab_file={tmp_path / vocab_file}")) == 2
    captured = capsys.readouterr()
    assert "data docs:" not in captured.out
    assert not out.exists()
    one_line(captured.err, "vocab.vocab_file: vocab")


@pytest.mark.parametrize("change", ["bpe", "foreign vocab.txt"])
def test_prepare_refuses_its_vocab_directory_before_the_documents_step(tiny_corpus, tmp_path, capsys, change):
    # a vocab of the other model, or a vocab.txt `data vocab` did not write, was found after new documents were made
    out = tmp_path / "prepared"
    assert main(_prepare(tiny_corpus, out)) == 0
    sets = ["docs.min_doc_chars=20"]  # other documents: the step would run again
    if change == "bpe":
        sets.append("vocab.model=bpe")
    else:
        (out / "vocab" / "tokenizer.json").unlink()
    capsys.readouterr()
    manifest = (out / "docs" / "manifest.json").read_bytes()
    assert main(_prepare(tiny_corpus, out, *sets)) == 2
    captured = capsys.readouterr()
    one_line(captured.err, out / "vocab")
    assert "data docs:" not in captured.out
    assert (out / "docs" / "manifest.json").read_bytes() == manifest


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--vocab-size", "100"], "--vocab-size 100 shape a trained vocab"),
        (["--unused", "5", "--min-frequency", "3"], "--unused 5, --min-frequency 3 shape a trained vocab"),
        (["--model", "bpe"], "is a wordpiece vocab, not bpe (--model bpe)"),
    ],
)
def test_vocab_from_refuses_the_training_flags_it_would_ignore(tiny_corpus, tmp_path, capsys, flags, message):
    # they were ignored: `--from vocab.txt --model bpe` wrote a WordPiece vocab, `--vocab-size 100` all its tokens
    src = tmp_path / "src"
    assert main(["data", "vocab", "--docs", str(tiny_corpus), "--out", str(src), "--vocab-size", "100"]) == 0
    capsys.readouterr()
    out = tmp_path / "copy"
    assert main(["data", "vocab", "--from", str(src / "vocab.txt"), "--out", str(out), *flags]) == 2
    one_line(capsys.readouterr().err, message)
    assert not out.exists()


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["docs", "--source", "{corpus}", "--out", ""], "--out"),
        (["vocab", "--docs", "{corpus}", "--out", "", "--vocab-size", "100"], "--out"),
        (["shards", "--docs", "{corpus}", "--vocab", "", "--out", "s"], "--vocab"),
        (["shards", "--docs", "", "--vocab", "v", "--out", "s"], "--docs"),
        (["inspect", "s", "--plot", ""], "--plot"),
        (["inspect", ""], "a shard path"),
    ],
)
def test_an_empty_path_is_refused_not_taken_for_the_working_directory(
    tiny_corpus, tmp_path, capsys, monkeypatch, argv, flag
):
    # `--out "$OUT"` with OUT unset wrote document shards or a vocab into the working directory; an empty --vocab
    # or --docs read whatever lay there, an empty --plot drew nothing
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert main(["data", *(a.format(corpus=tiny_corpus) for a in argv)]) == 2
    one_line(capsys.readouterr().err, f"{flag} is empty")
    assert not list(work.iterdir())
