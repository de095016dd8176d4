"""SQuAD audit: accented text through an uncased (accent-stripping) tokenizer maps back to the original context.

Hugging Face's run_qa.py labels and extracts answers through the fast tokenizer's offset mapping, Google's
run_squad.py through whitespace tokens and orig_to_tok_index; either way the answer is a slice of the original
context ("Beyoncé", not the normalised "beyonce"). These tests pin that for our offsets-based features and
postprocessing, with contexts in composed (NFC) and decomposed (NFD) form and characters whose lower-casing
changes the length ("İ"). The bug they caught: the normaliser drops a word's last combining mark ("Beyonce" +
U+0301, Hindi vowel signs), no token held it, and the predicted answer lost it ("Beyonce", "म").
"""

from __future__ import annotations

import unicodedata

import numpy as np
import pytest
from tokenizers import BertWordPieceTokenizer, ByteLevelBPETokenizer, Tokenizer

from bertforge.finetune import squad
from bertforge.finetune.metrics import squad_v1_scores

CONTEXTS = [
    ("The singer Beyoncé Knowles lives in Zürich, not in São Paulo.", ["Beyoncé", "Zürich", "São Paulo"]),
    ("İstanbul and Zürich: Beyoncé's ﬁles.", ["İstanbul", "Beyoncé", "ﬁles"]),
    # decomposed accents: "e" + U+0301, "u" + U+0308 (one more character each than the composed form)
    (unicodedata.normalize("NFD", "Dvořák met Beyoncé in Zürich."), ["Dvořák", "Beyoncé", "Zürich"]),
]


@pytest.fixture
def uncased_tokenizer(tmp_path):
    """A lower-casing, accent-stripping WordPiece tokenizer (bert-base-uncased's normaliser) over a few words
    in their stripped form: "Beyoncé" is one token "beyonce" spanning the original 7 characters."""
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "who", "?", "the", "singer", "beyonce", "knowles"]
    words += ["lives", "in", "zurich", ",", "not", "sao", "paulo", ".", "istanbul", "and", ":", "'", "s", "dvorak"]
    words += ["met"]
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(words) + "\n", encoding="utf-8")
    return BertWordPieceTokenizer(str(vocab), lowercase=True, strip_accents=True)


def _examples(contexts=CONTEXTS):
    out = []
    for c, (ctx, answers) in enumerate(contexts):
        for a, text in enumerate(answers):
            text = unicodedata.normalize("NFD", text) if unicodedata.is_normalized("NFD", ctx) else text
            out.append(squad.SquadExample(f"q{c}_{a}", "who ?", ctx, [(text, ctx.index(text))]))
    return out


def _label_texts(f, examples):
    """The context slice each window's training label points at (windows holding the answer only)."""
    got: dict[str, str] = {}
    for i in range(len(f)):
        s, e = int(f.start_positions[i]), int(f.end_positions[i])
        if s:
            c0, off, ex = int(f.ctx_offset[i]), f.offsets[i], examples[int(f.example_index[i])]
            got.setdefault(ex.qid, ex.context[off[s - c0, 0] : off[e - c0, 1]])
    return got


def _oracle(f):
    S, E = [], []
    for i in range(len(f)):
        s, e = np.zeros(len(f.input_ids[i])), np.zeros(len(f.input_ids[i]))
        s[f.start_positions[i]], e[f.end_positions[i]] = 10.0, 10.0
        S.append(s)
        E.append(e)
    return S, E


def _dataset(examples):
    return [
        {
            "paragraphs": [
                {"context": ex.context, "qas": [{"id": ex.qid, "answers": [{"text": ex.answers[0][0]}]}]}
                for ex in examples
            ]
        }
    ]


@pytest.mark.parametrize("max_seq_len, doc_stride", [(64, 128), (12, 2)])  # one window; many short windows
def test_accented_answers_label_and_predict_original_characters(uncased_tokenizer, max_seq_len, doc_stride):
    examples = _examples()
    f = squad.make_features(examples, uncased_tokenizer, max_seq_len, doc_stride, training=True, log=None)
    # the tokenizer does strip the accents (else the test would not test the accent case)
    assert uncased_tokenizer.encode("Beyoncé", add_special_tokens=False).tokens == ["beyonce"]
    assert _label_texts(f, examples) == {ex.qid: ex.answers[0][0] for ex in examples}
    preds, nbest, _ = squad.postprocess(examples, f, *_oracle(f), n_best=5, max_answer_len=5)
    assert preds == {ex.qid: ex.answers[0][0] for ex in examples}
    assert squad_v1_scores(_dataset(examples), preds)["exact_match"] == 100.0
    # no candidate ends before an accent of its last letter (the stripped spelling "Beyonce")
    assert not any("beyonce" in unicodedata.normalize("NFC", d["text"]).lower() for v in nbest.values() for d in v)


def test_accented_answers_byte_level_bpe():
    """RoBERTa's byte-level BPE splits "é" into two byte tokens; both map to the whole character."""
    corpus = [ctx for ctx, _ in CONTEXTS] * 5
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(corpus, vocab_size=280, min_frequency=1, special_tokens=["<s>", "<pad>", "</s>", "<unk>"])
    tok = Tokenizer.from_str(bpe._tokenizer.to_str())
    examples = _examples()
    f = squad.make_features(examples, tok, max_seq_len=96, doc_stride=128, training=True, log=None)
    assert _label_texts(f, examples) == {ex.qid: ex.answers[0][0] for ex in examples}
    preds, _, _ = squad.postprocess(examples, f, *_oracle(f), n_best=5, max_answer_len=30)
    assert preds == {ex.qid: ex.answers[0][0] for ex in examples}


def test_hindi_vowel_signs_stay_on_the_answer(tmp_path):
    """bert-base-multilingual-uncased strips Hindi's vowel signs (combining marks): "में" normalises to "म". The
    answer still ends with them, as the context has them (XQuAD / MLQA hi with an uncased multilingual model)."""
    vocab = tmp_path / "vocab.txt"
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "?", "म", "क", "भारत", "।"]
    vocab.write_text("\n".join(words) + "\n", encoding="utf-8")
    tok = BertWordPieceTokenizer(str(vocab), lowercase=True, strip_accents=True)
    ctx = "दिल्ली भारत में है। राजधानी के लोग"
    answers = ["भारत में", "दिल्ली", "के"]
    examples = [squad.SquadExample(f"q{i}", "?", ctx, [(a, ctx.index(a))]) for i, a in enumerate(answers)]
    f = squad.make_features(examples, tok, max_seq_len=32, training=True, log=None)
    assert _label_texts(f, examples) == {ex.qid: ex.answers[0][0] for ex in examples}
    preds, _, _ = squad.postprocess(examples, f, *_oracle(f), n_best=5, max_answer_len=5)
    assert preds == {ex.qid: ex.answers[0][0] for ex in examples}
