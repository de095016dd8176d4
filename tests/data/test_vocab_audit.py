"""Loading a vocab the way Google's and Hugging Face's readers do, without their foot-guns: a vocab with no [UNK]
is refused when it is loaded (it used to stop tokenization with a Rust error at the first word it could not
spell), a byte-order mark does not rename the first token, a vocab.txt is read with the casing of the
tokenizer.json `data vocab` wrote beside it, and rewriting that tokenizer.json rebuilds the shards made with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.helpers import one_line

from bertforge.cli import main
from bertforge.data.vocab import load_tokenizer, read_vocab_txt, vocab_hash
from bertforge.errors import UserError

CASED = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "Paris", "France", "is", "in", "par", "##is", "f", "##rance",
         "the", "."]  # fmt: skip


def _write(path: Path, tokens: list[str], bom: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes((("\ufeff" if bom else "") + "".join(t + "\n" for t in tokens)).encode("utf-8"))
    return path


def test_a_vocab_without_unk_is_refused_when_loaded(tmp_path, capsys):
    vocab = _write(tmp_path / "hand" / "vocab.txt", [t for t in CASED if t != "[UNK]"])
    with pytest.raises(UserError, match=r"lacks the token \[UNK\]") as e:
        load_tokenizer(vocab)
    assert str(vocab) in str(e.value)
    assert main(["data", "vocab", "--from", str(vocab), "--out", str(tmp_path / "v")]) == 2
    one_line(capsys.readouterr().err, vocab, "[UNK]")
    # a tokenizer.json whose WordPiece model names an [UNK] its vocab lacks: refused the same way
    tj = tmp_path / "tokenizer.json"
    data = json.loads(load_tokenizer(_write(tmp_path / "ok" / "vocab.txt", CASED)).to_str())
    data["model"]["vocab"].pop("[UNK]")
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] != "[UNK]"]
    tj.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(UserError, match=r"lacks the token \[UNK\]"):
        load_tokenizer(tj)


def test_a_byte_order_mark_does_not_rename_the_first_token(tmp_path):
    plain = _write(tmp_path / "plain" / "vocab.txt", CASED)
    bom = _write(tmp_path / "bom" / "vocab.txt", CASED, bom=True)
    assert read_vocab_txt(bom) == read_vocab_txt(plain)
    # [UNK] first (as some converted vocabs have it): with the mark kept it was "\ufeff[UNK]", so no [UNK] at all
    unk_first = _write(tmp_path / "unk" / "vocab.txt", ["[UNK]", *[t for t in CASED if t != "[UNK]"]], bom=True)
    text = "Paris is in Lyon [PAD]"
    assert load_tokenizer(unk_first).encode(text).tokens == ["[CLS]", "Paris", "is", "in", "[UNK]", "[PAD]", "[SEP]"]


def test_a_vocab_txt_reads_with_the_casing_of_the_tokenizer_json_beside_it(tmp_path):
    src = _write(tmp_path / "hand" / "vocab.txt", CASED)
    out = tmp_path / "v"
    assert main(["data", "vocab", "--from", str(src), "--out", str(out), "--uncased"]) == 0
    uncased = ["par", "##is", "is", "in", "f", "##rance"]
    assert load_tokenizer(out).encode("Paris is in France", add_special_tokens=False).tokens == uncased
    # what `data shards --vocab DIR/vocab.txt` and `pretrain data.vocab=DIR/vocab.txt` load: the same tokenizer
    assert load_tokenizer(out / "vocab.txt").encode("Paris is in France", add_special_tokens=False).tokens == uncased
    # an explicit casing still wins over the file beside it
    cased = load_tokenizer(out / "vocab.txt", lowercase=False).encode("Paris", add_special_tokens=False).tokens
    assert cased == ["Paris"]


def test_shards_are_rebuilt_when_the_vocab_directory_changes_casing(tmp_path, tiny_corpus, capsys):
    src = _write(tmp_path / "hand" / "vocab.txt", [*CASED, "Document", "document", "talks", "about"])
    vocab, shards = tmp_path / "v", tmp_path / "shards"
    argv = ["data", "shards", "--docs", str(tiny_corpus), "--vocab", str(vocab), "--out", str(shards),
            "--shards", "1", "--dupe-factor", "1", "--workers", "1"]  # fmt: skip
    assert main(["data", "vocab", "--from", str(src), "--out", str(vocab)]) == 0
    assert main(argv) == 0
    capsys.readouterr()
    assert main(argv) == 0
    assert "already finished" in capsys.readouterr().out  # the same vocab: kept
    assert main(["data", "vocab", "--from", str(src), "--out", str(vocab), "--uncased"]) == 0
    assert (vocab / "vocab.txt").read_bytes() == src.read_bytes()  # the same tokens: only tokenizer.json differs
    capsys.readouterr()
    assert main(argv) == 0
    assert "already finished" not in capsys.readouterr().out  # rebuilt with the uncased tokenizer, not kept
    # the manifest still records the vocab.txt's hash, as shards built before did (eval shards pair with them)
    assert json.loads((shards / "manifest.json").read_text())["vocab_sha256"] == vocab_hash(vocab / "vocab.txt")
    # the same through the vocab.txt of the directory (`--vocab DIR/vocab.txt` reads the tokenizer.json beside it)
    argv[argv.index(str(vocab))] = str(vocab / "vocab.txt")
    assert main(argv) == 0  # built once through the file
    assert main(["data", "vocab", "--from", str(src), "--out", str(vocab)]) == 0  # cased again
    capsys.readouterr()
    assert main(argv) == 0
    assert "already finished" not in capsys.readouterr().out
    assert load_tokenizer(vocab / "vocab.txt").encode("Paris", add_special_tokens=False).tokens == ["Paris"]


def test_data_vocab_from_a_vocab_with_a_repeated_line(tmp_path):
    """`data vocab --from` such a vocab.txt failed ("ids are not contiguous"): it is written as it was read."""
    src = tmp_path / "in" / "vocab.txt"
    src.parent.mkdir()
    src.write_bytes(b"[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\nhello\n##s\n")
    assert main(["data", "vocab", "--from", str(src), "--out", str(tmp_path / "v")]) == 0
    assert (tmp_path / "v" / "vocab.txt").read_bytes() == src.read_bytes()
    assert load_tokenizer(tmp_path / "v").encode("hello world hellos", add_special_tokens=False).ids == [7, 6, 7, 8]


@pytest.mark.parametrize("name", ["vocab.txt", "my-vocab.txt"])
def test_a_checkpoint_of_a_vocab_with_a_repeated_line_is_saved_as_it_was_read(tmp_path, name):
    """Pre-training takes such a vocab (the model gets a row per line); its checkpoints' tokenizer files used to
    fail to save ("ids are not contiguous") at the first checkpoint."""
    from transformers import BertTokenizerFast

    from bertforge.data.vocab import save_hf_tokenizer

    vocab = tmp_path / name
    vocab.write_bytes(b"[PAD]\r\n[UNK]\r\n[CLS]\r\n[SEP]\r\n[MASK]\r\nhello\r\nworld\r\nhello\r\n##s\r\n")
    model = tmp_path / "model"
    model.mkdir()
    save_hf_tokenizer(vocab, model, 64)
    assert (model / "vocab.txt").read_bytes() == vocab.read_bytes()
    want = [2, 7, 6, 7, 8, 3]  # the last "hello" line's id, as Google's and Hugging Face's readers take it
    assert load_tokenizer(model).encode("hello world hellos").ids == want
    assert BertTokenizerFast.from_pretrained(str(model))("hello world hellos")["input_ids"] == want


def test_a_tokenizer_config_decides_a_vocab_txts_casing_as_transformers_reads_it(tmp_path):
    """A Hugging Face model directory whose tokenizer_config.json says do_lower_case false beside a lower-casing
    tokenizer.json: transformers' BertTokenizer(Fast) rebuilds the normalizer from the config, so its vocab.txt
    reads cased."""
    from transformers import AutoTokenizer

    src = _write(tmp_path / "hand" / "vocab.txt", CASED)
    d = tmp_path / "model"
    assert main(["data", "vocab", "--from", str(src), "--out", str(d), "--uncased"]) == 0
    (d / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer", "do_lower_case": False}))
    want = AutoTokenizer.from_pretrained(str(d)).tokenize("Paris")
    assert load_tokenizer(d / "vocab.txt").encode("Paris", add_special_tokens=False).tokens == want == ["Paris"]


def test_shards_of_an_unchanged_vocab_hash_as_before(tmp_path):
    """The params hash of shards built from a `data vocab` directory is what it was before the casing fix (no
    one-time rebuild of every existing shard directory): the casing enters it only where the vocab.txt alone
    would be read with another."""
    from bertforge.data.vocab import casing_beyond_hash

    src = _write(tmp_path / "hand" / "vocab.txt", CASED)
    d = tmp_path / "v"
    assert main(["data", "vocab", "--from", str(src), "--out", str(d)]) == 0
    for given in (d, d / "vocab.txt"):
        assert casing_beyond_hash(given, load_tokenizer(given)) is None
    assert vocab_hash(d) == vocab_hash(d / "vocab.txt")  # a directory hashes as its vocab.txt, as before
    assert main(["data", "vocab", "--from", str(src), "--out", str(d), "--uncased"]) == 0
    assert casing_beyond_hash(d, load_tokenizer(d)) == "lowercase=True,strip_accents=True"


def test_a_moved_vocab_directory_is_still_the_shards_vocab(tmp_path, tiny_corpus):
    """check_vocab given a directory looked for vocab.txt in the directory's parent: a vocab directory moved away
    from the path the manifest names was refused as another vocab."""
    import shutil

    from bertforge.data.shardset import ShardSet

    src = _write(tmp_path / "hand" / "vocab.txt", [*CASED, "Document", "document", "talks", "about"])
    vocab, shards = tmp_path / "v", tmp_path / "shards"
    assert main(["data", "vocab", "--from", str(src), "--out", str(vocab)]) == 0
    argv = ["data", "shards", "--docs", str(tiny_corpus), "--vocab", str(vocab), "--out", str(shards),
            "--shards", "1", "--dupe-factor", "1", "--workers", "1"]  # fmt: skip
    assert main(argv) == 0
    moved = shutil.move(vocab, tmp_path / "elsewhere")
    ShardSet.open(shards).check_vocab(moved)
