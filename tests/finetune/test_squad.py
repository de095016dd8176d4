"""SQuAD features (windows, max-context, answer mapping through offsets) and n-best postprocessing."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
from tokenizers import BertWordPieceTokenizer

from bertforge.finetune import squad
from bertforge.finetune.metrics import squad_v1_scores, squad_v2_scores


@pytest.fixture
def word_tokenizer(tmp_path):
    """A WordPiece tokenizer whose vocab holds whole lower-case words (one token per word)."""
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "what", "is", "the", "answer", "?", ".", ","]
    words += [f"w{i}" for i in range(200)] + ["paris", "london", "capital", "of", "france"]
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(words) + "\n", encoding="utf-8")
    return BertWordPieceTokenizer(str(vocab), lowercase=True)


def test_window_starts_step_is_doc_stride():
    assert squad.window_starts(10, 4, 3) == [(0, 4), (3, 4), (6, 4)]
    assert squad.window_starts(10, 4, 4) == [(0, 4), (4, 4), (8, 2)]
    assert squad.window_starts(3, 4, 2) == [(0, 3)]
    # a stride larger than the window still covers every token (the step is capped at the window length)
    assert squad.window_starts(9, 4, 8) == [(0, 4), (4, 4), (8, 1)]


def test_max_context_flags():
    spans = [(0, 4), (3, 4), (6, 4)]
    flags = squad.max_context_flags(spans)
    # token 3: window 0 scores min(3, 0)=0, window 1 min(0, 3)=0 -> a tie, the first window keeps it (strict >
    # in run_squad.py); token 6 likewise stays in window 1
    assert flags[0].tolist() == [True, True, True, True]
    assert flags[1].tolist() == [False, True, True, True]
    assert flags[2].tolist() == [False, True, True, True]
    # every token counts in exactly one window
    owners = {}
    for w, (s, n) in enumerate(spans):
        for p, f in zip(range(s, s + n), flags[w]):
            owners[p] = owners.get(p, 0) + int(f)
    assert set(owners.values()) == {1}


def test_long_context_windows_and_answer_positions(word_tokenizer):
    context = " ".join(f"w{i}" for i in range(100))
    ans_start = context.index("w57")
    ex = squad.SquadExample("q", "what is the answer ?", context, [("w57 w58", ans_start)])
    f = squad.make_features([ex], word_tokenizer, max_seq_len=32, doc_stride=10, max_query_len=64, training=True)
    q_len = 5
    max_ctx = 32 - q_len - 3  # 24 context tokens per window
    starts = [0, 10, 20, 30, 40, 50, 60, 70, 80]  # the last window (80, 20) reaches token 99
    assert len(f) == len(starts)
    for i, s in enumerate(starts):
        ids = f.input_ids[i]
        assert len(ids) == min(32, q_len + 3 + (100 - s))
        assert ids[0] == word_tokenizer.token_to_id("[CLS]") and ids[q_len + 1] == word_tokenizer.token_to_id("[SEP]")
        assert ids[-1] == word_tokenizer.token_to_id("[SEP]")
        assert f.token_type_ids[i][: q_len + 2].sum() == 0 and f.token_type_ids[i][q_len + 2 :].min() == 1
        assert f.offsets[i][0, 0] == context.index(f"w{s} ")
        inside = s <= 57 and 58 < s + max_ctx
        if inside:
            assert (f.start_positions[i], f.end_positions[i]) == (57 - s + q_len + 2, 58 - s + q_len + 2)
        else:
            assert (f.start_positions[i], f.end_positions[i]) == (0, 0)
    # the question is cut to max_query_len
    f = squad.make_features([ex], word_tokenizer, max_seq_len=32, doc_stride=10, max_query_len=2)
    assert f.ctx_offset[0] == 2 + 2


def _oracle_logits(f):
    """Logits that put 10 on each window's labelled start/end (else 0) — the best a model can do."""
    S, E = [], []
    for i in range(len(f)):
        s, e = np.zeros(len(f.input_ids[i])), np.zeros(len(f.input_ids[i]))
        s[f.start_positions[i]] = 10.0
        e[f.end_positions[i]] = 10.0
        S.append(s)
        E.append(e)
    return S, E


def test_postprocess_v1_and_v2(word_tokenizer):
    ctx = "the capital of france is paris , the capital of w1 is london ."
    exs = [
        squad.SquadExample("a", "what is the capital of france ?", ctx, [("paris", ctx.index("paris"))]),
        squad.SquadExample("b", "what is w1 ?", ctx, [("london", ctx.index("london"))]),
        squad.SquadExample("c", "what is w9 ?", ctx, [], is_impossible=True),
    ]
    f = squad.make_features(exs, word_tokenizer, max_seq_len=20, doc_stride=4, training=True)
    S, E = _oracle_logits(f)
    preds, nbest, null_odds = squad.postprocess(exs, f, S, E, n_best=5, max_answer_len=4, version_2=True)
    assert preds == {"a": "paris", "b": "london", "c": ""}
    assert null_odds["c"] > 0 > null_odds["a"]
    assert all(abs(sum(d["probability"] for d in v) - 1) < 1e-6 for v in nbest.values())
    data = [
        {
            "paragraphs": [
                {
                    "context": ctx,
                    "qas": [
                        {"id": e.qid, "answers": [{"text": t, "answer_start": s} for t, s in e.answers]} for e in exs
                    ],
                }
            ]
        }
    ]
    assert squad_v2_scores(data, preds)["exact"] == 100.0
    # v1 (no null answer): the impossible question still gets a span; max_answer_len is respected
    preds, nbest, _ = squad.postprocess(exs[:2], f, S, E, n_best=5, max_answer_len=1)
    assert preds == {"a": "paris", "b": "london"}
    assert all(len(d["text"].split()) <= 1 for v in nbest.values() for d in v)


def test_dev_answers_recoverable_through_offsets(shared_data):
    """Every answer of a sample of the official dev set maps to a token span whose character offsets give back
    the answer text exactly — except answers that start or end inside a word piece, which no token span can
    reproduce (about 0.2% of dev answers, e.g. "gold" inside "golden")."""
    vocab = shared_data / "bert_vocab" / "bert-base-uncased-vocab.txt"
    tok = BertWordPieceTokenizer(str(vocab), lowercase=True)
    examples, _ = squad.read_squad(shared_data / "squad_v1.1" / "dev-v1.1.json")
    assert len(examples) == 10570
    sample = random.Random(0).sample(examples, 600)
    per_answer = [dataclasses.replace(e, answers=[a]) for e in sample for a in e.answers]
    f = squad.make_features(per_answer, tok, max_seq_len=384, doc_stride=128, training=True)
    recovered: dict[int, str] = {}
    for i in range(len(f)):
        s, e = int(f.start_positions[i]), int(f.end_positions[i])
        if s:
            c0, off = int(f.ctx_offset[i]), f.offsets[i]
            recovered.setdefault(
                int(f.example_index[i]), per_answer[f.example_index[i]].context[off[s - c0, 0] : off[e - c0, 1]]
            )
    exact = 0
    for j, ex in enumerate(per_answer):
        text, start = ex.answers[0]
        assert j in recovered, f"answer {text!r} of {ex.qid} is in no window"
        on_boundary = _on_token_boundaries(tok, ex.context, start, start + len(text))
        if recovered[j] == text:
            exact += 1
        else:
            assert not on_boundary, (ex.qid, text, recovered[j])
    assert exact / len(per_answer) > 0.995


def _on_token_boundaries(tok, context, a, b):
    offs = tok.encode(context, add_special_tokens=False).offsets
    return any(s == a for s, _ in offs) and any(e == b for _, e in offs)


@pytest.mark.slow
def test_full_dev_oracle_scores_near_100(shared_data):
    """Oracle logits on the full dev set through features + postprocess + official metric."""
    tok = BertWordPieceTokenizer(str(shared_data / "bert_vocab" / "bert-base-uncased-vocab.txt"), lowercase=True)
    examples, data = squad.read_squad(shared_data / "squad_v1.1" / "dev-v1.1.json")
    f = squad.make_features(examples, tok, training=True)
    S, E = _oracle_logits(f)
    preds, _, _ = squad.postprocess(examples, f, S, E)
    out = squad_v1_scores(data, preds)
    assert out["exact_match"] > 99.0 and out["missing"] == 0
