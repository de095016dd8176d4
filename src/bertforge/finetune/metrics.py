"""Evaluation metrics: the official SQuAD v1.1 / v2.0 scores and the GLUE metrics.

SQuAD follows the official evaluation scripts line by line (`evaluate-v1.1.py`, `evaluate-v2.0.py` from
rajpurkar.github.io/SQuAD-explorer) so our numbers are the numbers papers report:

- normalise: lower-case -> drop ASCII punctuation (`string.punctuation`) -> replace `\\b(a|an|the)\\b` with a
  space -> collapse whitespace;
- EM: equality after normalisation; F1: precision/recall over the multiset of normalised tokens;
- each question scores the maximum over its gold answers; the result is 100 x the mean over questions;
- v1.1: a question without a prediction scores 0 (the script prints a warning and counts it);
- v2.0: an unanswerable question's only gold answer is "", and if either side normalises to nothing,
  F1 = EM; `na_probs` (the model's no-answer score per question) gives the best-threshold search.

GLUE metrics are the ones the GLUE benchmark uses (Wang et al. 2018): accuracy, F1 of the positive class
(MRPC, QQP), Matthews correlation (CoLA), Pearson and Spearman correlation (STS-B). They are written in numpy
here and checked against scikit-learn and scipy by the tests.
"""

from __future__ import annotations

import collections
import re
import string
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


# ------------------------------------------------------------------------------------------------ SQuAD
def normalize_answer(s: str) -> str:
    """Lower-case, drop ASCII punctuation, replace articles with a space, collapse whitespace (official order)."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1_v1(prediction: str, gold: str) -> float:
    """v1.1 F1: 0 when no normalised token is shared (so two answers that normalise to nothing score 0)."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    same = sum((collections.Counter(pred) & collections.Counter(ref)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def f1_v2(prediction: str, gold: str) -> float:
    """v2.0 F1: if either side normalises to no tokens, F1 is 1 when both do and 0 otherwise (= EM)."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not pred or not ref:
        return float(pred == ref)
    return f1_v1(prediction, gold)


def iter_questions(dataset: Iterable[Mapping[str, Any]]) -> Iterable[Mapping[str, Any]]:
    """Every `qa` of a SQuAD `data` list (articles -> paragraphs -> qas), in file order."""
    for article in dataset:
        for paragraph in article["paragraphs"]:
            yield from paragraph["qas"]


def squad_v1_scores(dataset: list, predictions: Mapping[str, str]) -> dict[str, float]:
    """`{"exact_match", "f1", "total", "missing"}` exactly as `evaluate-v1.1.py` computes EM and F1."""
    em = f1 = 0.0
    total = missing = 0
    for qa in iter_questions(dataset):
        total += 1
        if qa["id"] not in predictions:
            missing += 1  # the official script warns and counts the question as 0
            continue
        golds = [a["text"] for a in qa["answers"]]
        pred = predictions[qa["id"]]
        em += max(exact_match(pred, g) for g in golds)
        f1 += max(f1_v1(pred, g) for g in golds)
    total_safe = max(total, 1)
    return {"exact_match": 100.0 * em / total_safe, "f1": 100.0 * f1 / total_safe, "total": total, "missing": missing}


def _v2_raw_scores(dataset: list, predictions: Mapping[str, str]) -> tuple[dict, dict, dict]:
    """Per-question EM and F1 (`get_raw_scores` of evaluate-v2.0.py) and whether each has an answer.

    Deviation, on purpose: the official script skips questions without a prediction and then fails on them in
    the HasAns/NoAns split; here a missing prediction scores 0, as in v1.1.
    """
    exact, f1, has_ans = {}, {}, {}
    for qa in iter_questions(dataset):
        qid = qa["id"]
        has_ans[qid] = bool(qa["answers"])
        golds = [a["text"] for a in qa["answers"] if normalize_answer(a["text"])] or [""]
        if qid not in predictions:
            exact[qid] = f1[qid] = 0.0
            continue
        pred = predictions[qid]
        exact[qid] = max(exact_match(pred, g) for g in golds)
        f1[qid] = max(f1_v2(pred, g) for g in golds)
    return exact, f1, has_ans


def _best_threshold(
    predictions: Mapping[str, str],
    scores: Mapping[str, float],
    na_probs: Mapping[str, float],
    has_ans: Mapping[str, bool],
) -> tuple[float, float]:
    """`find_best_thresh` of evaluate-v2.0.py: start from "predict no answer everywhere", then admit questions
    in increasing na_prob order and keep the threshold with the best total."""
    score = best = float(sum(1 for v in has_ans.values() if not v))
    best_thresh = 0.0
    for qid in sorted(na_probs, key=lambda k: na_probs[k]):
        if qid not in scores:
            continue
        if has_ans[qid]:
            diff = scores[qid]
        else:
            diff = -1.0 if predictions.get(qid) else 0.0
        score += diff
        if score > best:
            best, best_thresh = score, na_probs[qid]
    return 100.0 * best / max(len(scores), 1), best_thresh


def squad_v2_scores(
    dataset: list,
    predictions: Mapping[str, str],
    na_probs: Mapping[str, float] | None = None,
    na_prob_thresh: float = 1.0,
) -> dict[str, float]:
    """The dict `evaluate-v2.0.py` prints: exact, f1, total, HasAns_*, NoAns_*, and with `na_probs` the
    best_exact/best_f1 thresholds. A question counts as "no answer" when na_prob > na_prob_thresh."""
    exact_raw, f1_raw, has_ans = _v2_raw_scores(dataset, predictions)
    probs = dict(na_probs) if na_probs is not None else {k: 0.0 for k in exact_raw}

    def thresholded(raw: dict) -> dict:
        return {q: (float(not has_ans[q]) if probs.get(q, 0.0) > na_prob_thresh else s) for q, s in raw.items()}

    exact, f1 = thresholded(exact_raw), thresholded(f1_raw)

    def summary(qids: list[str]) -> tuple[float, float, int]:
        n = max(len(qids), 1)
        return 100.0 * sum(exact[q] for q in qids) / n, 100.0 * sum(f1[q] for q in qids) / n, len(qids)

    out: dict[str, float] = {}
    out["exact"], out["f1"], out["total"] = summary(list(exact))
    for name, flag in (("HasAns", True), ("NoAns", False)):
        qids = [q for q, v in has_ans.items() if v is flag]
        if qids:
            out[f"{name}_exact"], out[f"{name}_f1"], out[f"{name}_total"] = summary(qids)
    out["missing"] = sum(1 for q in exact_raw if q not in predictions)
    if na_probs is not None:
        out["best_exact"], out["best_exact_thresh"] = _best_threshold(predictions, exact_raw, probs, has_ans)
        out["best_f1"], out["best_f1_thresh"] = _best_threshold(predictions, f1_raw, probs, has_ans)
    return out


# ------------------------------------------------------------------------------------------------- GLUE
def accuracy(preds: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(np.asarray(preds) == np.asarray(labels)))


def f1_binary(preds: np.ndarray, labels: np.ndarray, positive: int = 1) -> float:
    """F1 of the positive class (GLUE's F1 for MRPC and QQP; sklearn's `f1_score` default)."""
    p, y = np.asarray(preds) == positive, np.asarray(labels) == positive
    tp = float(np.sum(p & y))
    denom = float(np.sum(p) + np.sum(y))
    return 2 * tp / denom if denom else 0.0


def matthews_corr(preds: np.ndarray, labels: np.ndarray) -> float:
    """Matthews correlation for binary labels (CoLA); 0 when a marginal is empty, as sklearn does."""
    p, y = np.asarray(preds).astype(bool), np.asarray(labels).astype(bool)
    tp, tn = float(np.sum(p & y)), float(np.sum(~p & ~y))
    fp, fn = float(np.sum(p & ~y)), float(np.sum(~p & y))
    denom = np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return float((tp * tn - fp * fn) / denom) if denom else 0.0


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    xc, yc = x - x.mean(), y - y.mean()
    denom = np.sqrt(np.sum(xc * xc) * np.sum(yc * yc))
    return float(np.sum(xc * yc) / denom) if denom else 0.0


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n with ties given their average rank (what Spearman's rho needs)."""
    x = np.asarray(x, dtype=np.float64)
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x), dtype=np.float64)
    xs = x[order]
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and xs[j + 1] == xs[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    return pearson(_ranks(x), _ranks(y))


# metric name -> fn(preds, labels); preds are class ids for classification, floats for regression
GLUE_METRICS = {
    "accuracy": accuracy,
    "f1": f1_binary,
    "mcc": matthews_corr,
    "pearson": pearson,
    "spearman": spearman,
}
