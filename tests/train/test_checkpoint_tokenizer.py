"""A pre-trained checkpoint ships the tokenizer it was trained with, in files that transformers' AutoTokenizer
and fill-mask pipeline load for BERT and ModernBERT alike, and that our own loader reads the same way: the
same tokens for the same text, lower-casing included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertforge.cli import main
from bertforge.data.vocab import _guess_lowercase, load_tokenizer, train_bpe, train_wordpiece

transformers = pytest.importorskip("transformers")

TEXT = "Capital Road near ℝ, the Old River Town."


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Documents of generated sentences, with the double-struck ℝ of maths text (upper-case, no lower case)."""
    words = ["river", "capital", "near", "north", "the", "old", "road", "bridge", "hill", "town", "ℝ", ","]
    lines = [" ".join(words[(i * 7 + j) % len(words)] for j in range(9)) + " ." for i in range(400)]
    docs = ["\n".join(lines[k : k + 20]) for k in range(0, 400, 20)]
    path = tmp_path_factory.mktemp("ckpt_tok") / "docs.txt"
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


def test_an_uncased_vocab_with_caseless_capitals_is_guessed_uncased():
    assert _guess_lowercase(Path("vocab.txt"), {"[CLS]": 0, "the": 1, "ℂ": 2, "ℝ": 3, "##s": 4})
    assert not _guess_lowercase(Path("vocab.txt"), {"[CLS]": 0, "The": 1, "the": 2})


def pretrain(corpus: Path, vocab: Path, tmp_path: Path, preset: str) -> Path:
    shards = tmp_path / "shards"
    argv = ["data", "shards", "--docs", str(corpus), "--vocab", str(vocab), "--out", str(shards)]
    assert main([*argv, "--objective", "mlm", "--seq-len", "64", "--shards", "1", "--workers", "1"]) == 0
    sets = [f"model.preset={preset}", "model.max_position_embeddings=64", f"data.input_dir={shards}"]
    sets += [f"data.vocab={vocab}", "data.eval_dir=null", "data.num_workers=0", "train.objective=mlm"]
    sets += ["train.max_steps=1", "train.global_batch_size=2", "train.micro_batch_size=2", "train.device=cpu"]
    sets += ["train.precision=fp32", "train.save_every=1", f"train.output_dir={tmp_path / 'run'}"]
    assert main(["pretrain", *(x for s in sets for x in ("--set", s))]) == 0
    return Path(json.loads((tmp_path / "run" / "summary.json").read_text())["model_dir"])


@pytest.mark.parametrize("preset", ["tiny", "modernbert-tiny"])
@pytest.mark.parametrize("kind", ["wordpiece", "bpe"])
def test_checkpoint_tokenizer_loads_in_transformers_as_trained(corpus, tmp_path, preset, kind):
    vocab = tmp_path / "vocab"
    if kind == "wordpiece":
        train_wordpiece([corpus], vocab, vocab_size=200, lowercase=True, unused_tokens=0)
        source = vocab / "vocab.txt"  # what data.vocab names; its sibling tokenizer.json carries the lower-casing
    else:
        train_bpe([corpus], vocab, vocab_size=320, lowercase=True, min_frequency=1)
        source = vocab
    model_dir = pretrain(corpus, source, tmp_path, preset)
    assert {"tokenizer.json", "tokenizer_config.json"} <= {p.name for p in model_dir.iterdir()}
    want = load_tokenizer(vocab).encode(TEXT).ids
    assert load_tokenizer(vocab).token_to_id("[UNK]") not in want  # "Capital", "Old" lower-cased, ℝ known
    assert load_tokenizer(model_dir).encode(TEXT).ids == want  # our serving reads the checkpoint alike
    hf_tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    assert hf_tok(TEXT)["input_ids"] == want
    assert hf_tok.mask_token == "[MASK]" and hf_tok.model_max_length == 64
    fill = transformers.pipeline("fill-mask", model=str(model_dir), top_k=3)
    assert len(fill("the capital is near the [MASK] .")) == 3
