"""Same input and settings, same bytes: `data vocab` and `data prepare` end to end (issue 20, class 5)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertforge.config import load_config
from bertforge.data.cli import run_prepare
from bertforge.data.vocab import train_wordpiece
from bertforge.errors import UserError


def _corpus(path: Path) -> Path:
    # many words of equal frequency: the ties the trainer used to break by chance
    words = [a + b + c for a in "bcdfg" for b in "aeiou" for c in "klmnprst"]
    lines = [" ".join(words[i : i + 9]) + "." for i in range(0, len(words), 3)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_vocab_is_byte_identical(tmp_path):
    corpus = _corpus(tmp_path / "corpus.txt")
    outs = [tmp_path / f"v{i}" for i in range(4)]
    for out in outs:
        train_wordpiece([corpus], out, vocab_size=150, min_frequency=2, unused_tokens=2)
    for name in ("vocab.txt", "tokenizer.json"):
        first = (outs[0] / name).read_bytes()
        assert all((o / name).read_bytes() == first for o in outs[1:]), name
    lines = (outs[0] / "vocab.txt").read_text(encoding="utf-8").split("\n")
    assert lines[:7] == ["[PAD]", "[unused0]", "[unused1]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    added = [t["content"] for t in json.loads((outs[0] / "tokenizer.json").read_text())["added_tokens"]]
    assert added == lines[:7]  # the "##c" symbols fixed for the trainer are no special tokens


def test_vocab_of_empty_corpus_is_refused(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n   \n", encoding="utf-8")
    with pytest.raises(UserError, match="empty.txt.*no words"):
        train_wordpiece([empty], tmp_path / "v", vocab_size=100)
    assert not (tmp_path / "v" / "vocab.txt").exists()


def test_a_vocab_smaller_than_asked_is_said(tmp_path):
    """A small corpus runs out of pieces before --vocab-size: the line says so instead of a silent 180 tokens."""
    from bertforge.data.cli import run_vocab

    corpus = _corpus(tmp_path / "corpus.txt")
    lines: list[str] = []
    run_vocab(str(corpus), tmp_path / "v", vocab_size=30522, log=lines.append)
    assert "fewer than the 30522 asked for: the corpus holds no more" in lines[-1], lines


def _drop_seconds(record):
    """A manifest without its wall times, the one thing allowed to differ between two runs."""
    if isinstance(record, dict):
        return {k: _drop_seconds(v) for k, v in record.items() if k != "seconds"}
    if isinstance(record, list):
        return [_drop_seconds(v) for v in record]
    return record


def _files(root: Path) -> dict[str, bytes]:
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            data = p.read_bytes()
            if p.name == "manifest.json":
                data = json.dumps(_drop_seconds(json.loads(data)), sort_keys=True).encode()
            out[str(p.relative_to(root))] = data
    return out


def test_prepare_is_byte_identical(tmp_path, tiny_corpus):
    """Two `data prepare` runs from scratch into the same path (documents rewritten, so new mtimes)."""
    sets = [
        f"output_dir={tmp_path / 'out'}",
        f"docs.source={tiny_corpus}",
        "docs.min_doc_chars=10",
        "docs.num_shards=2",
        "vocab.vocab_size=200",
        "shards.num_shards=2",
        "shards.dupe_factor=2",
        "shards.eval_fraction=0.2",
        "shards.workers=1",
    ]
    runs = []
    for i in range(2):
        run_prepare(load_config("data", "demo", sets), log=lambda *a: None)
        (tmp_path / "out").rename(tmp_path / f"run{i}")
        runs.append(_files(tmp_path / f"run{i}"))
    assert runs[0].keys() == runs[1].keys()
    assert sum(k.endswith(".hdf5") for k in runs[0]) == 3, sorted(runs[0])
    differ = [k for k in runs[0] if runs[0][k] != runs[1][k]]
    assert not differ


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--eval-fraction", "0.1"], "--eval-fraction 0.1 is ignored without --eval-out: add --eval-out DIR"),
        (["--eval-out", "EVAL"], "gets nothing without --eval-fraction"),
    ],
)
def test_shards_eval_options_need_each_other(tmp_path, tiny_corpus, capsys, extra, message):
    from bertforge.cli import main

    train_wordpiece([tiny_corpus], tmp_path / "v", vocab_size=200)
    extra = [str(tmp_path / "eval") if a == "EVAL" else a for a in extra]
    argv = ["data", "shards", "--docs", str(tiny_corpus), "--vocab", str(tmp_path / "v"), "--out", str(tmp_path / "s")]
    assert main([*argv, "--shards", "1", "--dupe-factor", "1", "--workers", "1", *extra]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "s").exists()
