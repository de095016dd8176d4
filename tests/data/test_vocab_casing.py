"""The casing of a vocab given to `data vocab --from` and `data prepare` (vocab.vocab_file): guessed from the vocab
(its name, then its tokens) unless --cased/--uncased or vocab.lowercase says otherwise; a trained vocab stays
uncased by default. Both used to lower-case a cased vocab (Paris -> par ##is)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bertforge.cli import main
from bertforge.data.vocab import load_tokenizer

CASED_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "Paris", "France", "is", "in", "par", "##is", "f",
                "##rance", "the", "."]  # fmt: skip


@pytest.fixture
def cased_vocab(tmp_path) -> Path:
    """A cased vocab.txt whose name says nothing of its casing: only its tokens do."""
    path = tmp_path / "hand" / "vocab.txt"
    path.parent.mkdir()
    path.write_text("".join(t + "\n" for t in CASED_TOKENS), encoding="utf-8")
    return path


def _tokens(vocab: Path, text: str = "Paris is in France") -> list[str]:
    return load_tokenizer(vocab).encode(text, add_special_tokens=False).tokens


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ([], ["Paris", "is", "in", "France"]),
        (["--cased"], ["Paris", "is", "in", "France"]),
        (["--uncased"], ["par", "##is", "is", "in", "f", "##rance"]),
    ],
)
def test_vocab_from_keeps_a_cased_vocab_cased(cased_vocab, tmp_path, flags, expected):
    out = tmp_path / "conv"
    assert main(["data", "vocab", "--from", str(cased_vocab), "--out", str(out), *flags]) == 0
    assert _tokens(out) == _tokens(out / "tokenizer.json") == expected
    assert (out / "vocab.txt").read_bytes() == cased_vocab.read_bytes()


def test_vocab_from_casing_of_googles_vocabs(shared_data, tmp_path):
    for name, expected in (("cased", ["Paris", "is", "in", "France"]), ("uncased", ["paris", "is", "in", "france"])):
        src = shared_data / "bert_vocab" / f"bert-base-{name}-vocab.txt"
        out = tmp_path / name
        assert main(["data", "vocab", "--from", str(src), "--out", str(out)]) == 0
        assert _tokens(out) == _tokens(src) == expected, name


def test_cased_and_uncased_flags_exclude_each_other(cased_vocab, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["data", "vocab", "--from", str(cased_vocab), "--out", str(tmp_path / "v"), "--cased", "--uncased"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_trained_vocab_is_uncased_by_default_and_cased_on_request(tiny_corpus, tmp_path):
    for flags, word in (([], "document"), (["--cased"], "Document")):
        out = tmp_path / ("cased" if flags else "uncased")
        argv = ["data", "vocab", "--docs", str(tiny_corpus), "--out", str(out), "--vocab-size", "200"]
        assert main([*argv, *flags]) == 0
        assert _tokens(out, "Document")[0] == word


def test_prepare_with_a_cased_vocab_file_keeps_it_cased(cased_vocab, tiny_corpus, tmp_path):
    out = tmp_path / "prep"
    sets = [f"output_dir={out}", f"docs.source={tiny_corpus}", f"vocab.vocab_file={cased_vocab}",
            "shards.dupe_factor=1", "shards.eval_fraction=0", "shards.num_shards=1", "shards.workers=1"]  # fmt: skip
    assert main(["data", "prepare", *(x for s in sets for x in ("--set", s))]) == 0
    assert _tokens(out / "vocab") == ["Paris", "is", "in", "France"]
