"""SQuAD / GLUE edge cases checked against the reference algorithms: Google BERT's run_squad.py (features and
`write_predictions`), the official SQuAD v1.1 / v2.0 evaluation scripts, scikit-learn and scipy (GLUE)."""

from __future__ import annotations

import collections
import copy
import json
import random
import re
import string

import numpy as np
import pytest
import scipy.stats
import sklearn.metrics
from tokenizers import BertWordPieceTokenizer

from bertforge.finetune import metrics as M
from bertforge.finetune import squad


@pytest.fixture
def word_tokenizer(tmp_path):
    """A WordPiece tokenizer whose vocab holds whole lower-case words (one token per word)."""
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "what", "is", "the", "answer", "?", "paris", "london"]
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(words + ["capital"]) + "\n", encoding="utf-8")
    return BertWordPieceTokenizer(str(vocab), lowercase=True)


# ------------------------------------------------------------------------------------ n-best (run_squad.py)
def _logits(n: int, at: dict[int, tuple[float, float]]) -> tuple[np.ndarray, np.ndarray]:
    s, e = np.full(n, -10.0), np.full(n, -10.0)
    for i, (a, b) in at.items():
        s[i], e[i] = a, b
    return s, e


@pytest.mark.parametrize(
    "cls, expected",
    [
        # null 4.0 ranks below both n_best spans: it is added after them (n_best + 1 entries)
        ((1.0, 3.0), ["paris", "paris london", ""]),
        # null 4.75 ranks second: it takes one of the n_best places
        ((1.75, 3.0), ["paris", ""]),
    ],
)
def test_v2_nbest_null_entry_as_run_squad(word_tokenizer, cls, expected):
    """write_predictions: the null entry carries the [CLS] start/end logits of the window with the smallest null
    score, and competes for the n_best places (spans: paris 5.0, paris london 4.5, london 2.5)."""
    ctx = "paris london capital"
    ex = squad.SquadExample("q", "what is the answer ?", ctx, [("paris", 0)])
    f = squad.make_features([ex], word_tokenizer, max_seq_len=16, doc_stride=8)
    c0 = int(f.ctx_offset[0])  # [CLS] + 5 question tokens + [SEP]
    s, e = _logits(len(f.input_ids[0]), {0: cls, c0: (3.0, 2.0), c0 + 1: (1.0, 1.5)})
    preds, nbest, odds = squad.postprocess([ex], f, [s], [e], n_best=2, version_2=True)
    assert [d["text"] for d in nbest["q"]] == expected
    null = next(d for d in nbest["q"] if d["text"] == "")
    assert (null["start_logit"], null["end_logit"]) == cls
    assert sum(d["probability"] for d in nbest["q"]) == pytest.approx(1.0)
    assert odds["q"] == pytest.approx(sum(cls) - 5.0) and preds["q"] == "paris"
    # with one place the null entry can fill the n-best alone; the prediction still weighs the best span
    preds, nbest, odds = squad.postprocess([ex], f, [s], [e], n_best=1, version_2=True, null_score_diff_threshold=9)
    assert preds["q"] == "paris" and odds["q"] == pytest.approx(sum(cls) - 5.0)


def test_v2_null_logits_from_the_window_with_the_smallest_null_score(word_tokenizer):
    ctx = " ".join(["london"] * 12 + ["paris"])
    ex = squad.SquadExample("q", "what is the answer ?", ctx, [("paris", ctx.index("paris"))])
    f = squad.make_features([ex], word_tokenizer, max_seq_len=16, doc_stride=4)
    assert len(f) > 1
    S, E = [], []
    for i in range(len(f)):
        s, e = _logits(len(f.input_ids[i]), {0: (2.0 + i, 1.0 - 2 * i)})  # null 3 - i: the last window's is least
        S.append(s)
        E.append(e)
    _, nbest, _ = squad.postprocess([ex], f, S, E, version_2=True)
    null = next(d for d in nbest["q"] if d["text"] == "")
    last = len(f) - 1
    assert (null["start_logit"], null["end_logit"]) == (2.0 + last, 1.0 - 2 * last)
    assert null["score"] == pytest.approx(3.0 - last)


# --------------------------------------------------------------------------- official evaluation scripts
def _norm(s):
    """normalize_answer of evaluate-v1.1.py / evaluate-v2.0.py."""
    s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(re.compile(r"\b(a|an|the)\b", re.UNICODE), " ", s).split())


def _ref_f1(gold, pred, v2):
    g, p = _norm(gold).split(), _norm(pred).split()
    same = sum((collections.Counter(g) & collections.Counter(p)).values())
    if v2 and (not g or not p):
        return float(g == p)
    if same == 0:
        return 0.0
    prec, rec = same / len(p), same / len(g)
    return 2 * prec * rec / (prec + rec)


def _ref_v2(dataset, preds, na_probs, thresh):
    """evaluate-v2.0.py's main() for predictions of every question, as a dict."""
    has_ans = {qa["id"]: bool(qa["answers"]) for qa in M.iter_questions(dataset)}
    exact, f1 = {}, {}
    for qa in M.iter_questions(dataset):
        golds = [a["text"] for a in qa["answers"] if _norm(a["text"])] or [""]
        exact[qa["id"]] = max(float(_norm(g) == _norm(preds[qa["id"]])) for g in golds)
        f1[qa["id"]] = max(_ref_f1(g, preds[qa["id"]], True) for g in golds)

    def apply(scores):
        return {q: float(not has_ans[q]) if na_probs[q] > thresh else s for q, s in scores.items()}

    def best(scores):
        cur = best_score = sum(1 for q in has_ans if not has_ans[q])
        best_thresh = 0.0
        for q in sorted(na_probs, key=lambda k: na_probs[k]):
            cur += scores[q] if has_ans[q] else (-1 if preds[q] else 0)
            if cur > best_score:
                best_score, best_thresh = cur, na_probs[q]
        return 100.0 * best_score / len(scores), best_thresh

    out = {}
    ex_t, f1_t = apply(exact), apply(f1)
    for name, qids in (
        ("", list(has_ans)),
        ("HasAns_", [q for q in has_ans if has_ans[q]]),
        ("NoAns_", [q for q in has_ans if not has_ans[q]]),
    ):
        out[f"{name}exact"] = 100.0 * sum(ex_t[q] for q in qids) / len(qids)
        out[f"{name}f1"] = 100.0 * sum(f1_t[q] for q in qids) / len(qids)
    out["best_exact"], out["best_exact_thresh"] = best(exact)
    out["best_f1"], out["best_f1_thresh"] = best(f1)
    return out


def _edge_dataset():
    """Questions that hit every branch: several golds, golds that normalise to nothing, unanswerable ones."""
    golds = [["Paris"], ["the Eiffel Tower", "Eiffel Tower", "tower"], ["The"], ["1,000 km", "1000 km"], []]
    preds = ["", "paris.", "an Eiffel  tower!", "the", "1000 KM", "“Paris”", "Tower Eiffel tower", ".", " "]
    rng = random.Random(0)
    qas, pred_of, na = [], {}, {}
    for i in range(120):
        g = golds[i % len(golds)]
        qas.append({"id": f"q{i}", "question": "?", "answers": [{"text": t, "answer_start": 0} for t in g]})
        pred_of[f"q{i}"] = rng.choice(preds)
        na[f"q{i}"] = rng.choice([-2.0, -0.5, 0.0, 0.5, 1.0, 3.0, rng.gauss(0, 2)])  # ties on purpose
    return [{"paragraphs": [{"context": "", "qas": qas}]}], pred_of, na


def test_squad_metrics_equal_official_scripts_on_edge_cases():
    data, preds, na = _edge_dataset()
    v1_data = copy.deepcopy(data)
    for qa in M.iter_questions(v1_data):
        qa["answers"] = qa["answers"] or [{"text": "Paris", "answer_start": 0}]
    ref_em = [
        max(float(_norm(a["text"]) == _norm(preds[q["id"]])) for a in q["answers"]) for q in M.iter_questions(v1_data)
    ]
    ref_f1 = [max(_ref_f1(a["text"], preds[q["id"]], False) for a in q["answers"]) for q in M.iter_questions(v1_data)]
    out = M.squad_v1_scores(v1_data, preds)
    assert out["exact_match"] == pytest.approx(100 * np.mean(ref_em))
    assert out["f1"] == pytest.approx(100 * np.mean(ref_f1))
    for thresh in (1.0, 0.0, -1.0):
        ours, ref = M.squad_v2_scores(data, preds, na, thresh), _ref_v2(data, preds, na, thresh)
        assert {k: ours[k] for k in ref} == pytest.approx(ref)


# ------------------------------------------------------------------------------ features (run_squad.py)
def _google_windows(basic, wordpiece, vocab, question, context, max_seq, stride, max_q):
    """convert_examples_to_features of run_squad.py (eval mode): each window's token ids and the max-context
    flag of each of its context tokens."""
    doc_words, prev_ws = [], True
    for c in context:
        if c in " \t\r\n\u202f":
            prev_ws = True
        else:
            if prev_ws:
                doc_words.append(c)
            else:
                doc_words[-1] += c
            prev_ws = False

    def tokenize(text):
        return [p for w in basic.tokenize(text) for p in wordpiece.tokenize(w)]

    q = tokenize(question)[:max_q]
    doc = [p for w in doc_words for p in tokenize(w)]
    spans, start, room = [], 0, max_seq - len(q) - 3
    while start < len(doc):
        length = min(len(doc) - start, room)
        spans.append((start, length))
        if start + length == len(doc):
            break
        start += min(length, stride)

    def is_max(cur, pos):
        best = best_i = None
        for i, (s, n) in enumerate(spans):
            if s <= pos <= s + n - 1:
                score = min(pos - s, s + n - 1 - pos) + 0.01 * n
                if best is None or score > best:
                    best, best_i = score, i
        return best_i == cur

    out = []
    for w, (s, n) in enumerate(spans):
        toks = ["[CLS]", *q, "[SEP]", *doc[s : s + n], "[SEP]"]
        out.append(([vocab.get(t, vocab["[UNK]"]) for t in toks], [is_max(w, s + i) for i in range(n)]))
    return out


def test_windows_equal_run_squad_on_real_dev(shared_data):
    """Windows (ids, doc_stride steps, question cut, max-context flags) equal run_squad.py's on a sample of the
    official dev set, with short windows so that most contexts span several."""
    legacy = pytest.importorskip("transformers.models.bert.tokenization_bert_legacy")
    vocab_file = shared_data / "bert_vocab" / "bert-base-uncased-vocab.txt"
    vocab = legacy.load_vocab(str(vocab_file))
    basic, wordpiece = legacy.BasicTokenizer(do_lower_case=True), legacy.WordpieceTokenizer(vocab, "[UNK]")
    data = json.loads((shared_data / "squad_v1.1" / "dev-v1.1.json").read_text(encoding="utf-8"))["data"]
    paragraphs = random.Random(1).sample([p for a in data for p in a["paragraphs"]], 40)
    examples = [
        squad.SquadExample(qa["id"], qa["question"] + " why" * (i % 3 * 20), p["context"], [])  # some cut to 16
        for p in paragraphs
        for i, qa in enumerate(p["qas"][:2])
    ]
    tok = BertWordPieceTokenizer(str(vocab_file), lowercase=True)
    f = squad.make_features(examples, tok, max_seq_len=96, doc_stride=32, max_query_len=16)
    ours = collections.defaultdict(list)
    for i in range(len(f)):
        ours[int(f.example_index[i])].append((f.input_ids[i].tolist(), f.max_context[i].tolist()))
    assert len(f) > 2 * len(examples)
    for i, ex in enumerate(examples):
        assert ours[i] == _google_windows(basic, wordpiece, vocab, ex.question, ex.context, 96, 32, 16), ex.qid


# ------------------------------------------------------------------------------------------------- GLUE
def test_glue_metric_edges_equal_sklearn_scipy():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 60)
    for p in (np.zeros(60, int), np.ones(60, int), 1 - y):  # constant predictors, all wrong
        assert M.matthews_corr(p, y) == pytest.approx(sklearn.metrics.matthews_corrcoef(y, p))
        assert M.f1_binary(p, y) == pytest.approx(sklearn.metrics.f1_score(y, p, zero_division=0))
    x = rng.integers(0, 6, 200).astype(float)  # STS-B-like scores: many ties on both sides
    z = np.round(x + rng.normal(0, 1.5, 200)).clip(0, 5)
    assert M.spearman(z, x) == pytest.approx(scipy.stats.spearmanr(z, x)[0])
    assert M.pearson(z, x) == pytest.approx(scipy.stats.pearsonr(z, x)[0])
