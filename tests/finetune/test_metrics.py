"""Official SQuAD metrics on hand-worked cases; GLUE metrics against scikit-learn / scipy and hand values."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats
import sklearn.metrics

from bertforge.finetune import metrics as M


@pytest.mark.parametrize(
    "raw, norm",
    [
        ("The Eiffel Tower!", "eiffel tower"),
        ("  an   apple,  a pear ", "apple pear"),
        ("Theory of the atom", "theory of atom"),  # "the" only as a whole word
        ("A.B.C.", "abc"),  # punctuation dropped before articles are matched
        ("a-the an", "athe"),  # "-" is removed first, so "athe" is no longer an article
        ("Élan — naïve", "élan — naïve"),  # non-ASCII punctuation (em dash) is kept, like the official script
    ],
)
def test_normalize(raw, norm):
    assert M.normalize_answer(raw) == norm


def test_em_f1_hand_values():
    assert M.exact_match("the Denver Broncos", "Denver Broncos") == 1.0
    assert M.exact_match("Denver", "Denver Broncos") == 0.0
    # pred tokens {denver}, gold {denver, broncos}: P=1, R=1/2, F1=2/3
    assert M.f1_v1("Denver", "Denver Broncos") == pytest.approx(2 / 3)
    # multiset: pred "a a b" -> [a? no, articles removed] use non-article tokens
    assert M.f1_v1("x x y", "x y y") == pytest.approx(2 * (2 / 3) * (2 / 3) / (4 / 3))
    assert M.f1_v1("cat", "dog") == 0.0
    # v1.1: both sides normalise to nothing -> EM 1 but F1 0 (no shared token); v2.0: F1 = EM
    assert M.exact_match("the", "a") == 1.0
    assert M.f1_v1("the", "a") == 0.0
    assert M.f1_v2("the", "a") == 1.0
    assert M.f1_v2("", "Denver") == 0.0


def _dataset(qas):
    return [{"title": "t", "paragraphs": [{"context": "c", "qas": qas}]}]


def test_squad_v1_max_over_golds_and_missing():
    ds = _dataset(
        [
            {"id": "q1", "answers": [{"text": "Denver Broncos"}, {"text": "Broncos"}]},
            {"id": "q2", "answers": [{"text": "Santa Clara, California"}, {"text": "Levi's Stadium"}]},
            {"id": "q3", "answers": [{"text": "gold"}]},
        ]
    )
    preds = {"q1": "Broncos", "q2": "Santa Clara"}  # q3 missing
    out = M.squad_v1_scores(ds, preds)
    # q1: EM 1 F1 1; q2: EM 0, F1 vs "santa clara california" = 2*1*(2/3)/(5/3) = 0.8; q3: 0
    assert out["exact_match"] == pytest.approx(100 / 3)
    assert out["f1"] == pytest.approx(100 * 1.8 / 3)
    assert out["total"] == 3 and out["missing"] == 1


def test_squad_v2_empty_answers_split_and_threshold():
    ds = _dataset(
        [
            {"id": "a", "answers": [{"text": "Paris"}]},
            {"id": "b", "answers": []},
            {"id": "c", "answers": []},
            {"id": "d", "answers": [{"text": "New York City"}]},
        ]
    )
    preds = {"a": "Paris", "b": "", "c": "London", "d": "York"}
    out = M.squad_v2_scores(ds, preds)
    # a: 1/1; b: empty vs empty -> 1/1; c: non-empty vs no-answer -> 0/0; d: EM 0, F1 2*1*(1/2)/(3/2)... gold
    # "new york city" 3 tokens, pred 1 shared: P=1, R=1/3, F1=0.5
    assert out["exact"] == pytest.approx(50.0)
    assert out["f1"] == pytest.approx(100 * 2.5 / 4)
    assert out["HasAns_total"] == 2 and out["NoAns_total"] == 2
    assert out["HasAns_exact"] == pytest.approx(50.0)
    assert out["HasAns_f1"] == pytest.approx(75.0)
    assert out["NoAns_exact"] == pytest.approx(50.0)
    # na_probs: c is the most likely no-answer. Official search: start at #no-answer = 2, admit in increasing
    # prob order a(+1 ->3), d(+0 EM ->3), b(empty pred: 0 ->3), c(non-empty on no-answer: -1 ->2): best 3/4 at
    # threshold na_probs[a]
    na = {"a": 0.1, "d": 0.2, "b": 0.3, "c": 0.9}
    out = M.squad_v2_scores(ds, preds, na_probs=na)
    assert out["best_exact"] == pytest.approx(75.0)
    assert out["best_exact_thresh"] == pytest.approx(0.1)
    # F1: a +1 -> 3, d +0.5 -> 3.5 (thresh 0.2), b 0, c -1
    assert out["best_f1"] == pytest.approx(100 * 3.5 / 4)
    assert out["best_f1_thresh"] == pytest.approx(0.2)
    # threshold applied: with thresh 0.5, c is predicted no-answer -> correct
    out = M.squad_v2_scores(ds, preds, na_probs=na, na_prob_thresh=0.5)
    assert out["NoAns_exact"] == pytest.approx(100.0)


def test_glue_metrics_against_sklearn_scipy():
    rng = np.random.default_rng(0)
    for _ in range(5):
        y = rng.integers(0, 2, 200)
        p = np.where(rng.random(200) < 0.7, y, 1 - y)
        assert M.accuracy(p, y) == pytest.approx(sklearn.metrics.accuracy_score(y, p))
        assert M.f1_binary(p, y) == pytest.approx(sklearn.metrics.f1_score(y, p))
        assert M.matthews_corr(p, y) == pytest.approx(sklearn.metrics.matthews_corrcoef(y, p))
        x = rng.normal(size=100)
        z = np.round(x + rng.normal(size=100), 1)  # rounded: ties for Spearman's average ranks
        assert M.pearson(x, z) == pytest.approx(scipy.stats.pearsonr(x, z)[0])
        assert M.spearman(x, z) == pytest.approx(scipy.stats.spearmanr(x, z)[0])


def test_glue_metrics_hand_values():
    y = np.array([1, 1, 0, 0])
    p = np.array([1, 0, 0, 0])
    # tp=1 fn=1 tn=2 fp=0: F1 = 2/3; MCC = (1*2 - 0)/sqrt(1*2*2*3) = 2/sqrt(12)
    assert M.f1_binary(p, y) == pytest.approx(2 / 3)
    assert M.matthews_corr(p, y) == pytest.approx(2 / np.sqrt(12))
    assert M.matthews_corr(np.zeros(4), y) == 0.0  # a constant predictor: 0, as sklearn
    assert M.spearman([1, 2, 3], [10, 20, 100]) == pytest.approx(1.0)
    assert M.pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
