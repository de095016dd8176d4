"""SQuAD v1.1 / v2.0: examples, windowed features, n-best postprocessing (DESIGN §3.6).

Features follow Google BERT's `run_squad.py` with a fast tokenizer's character offsets in place of its
whitespace-token bookkeeping:

- the question is cut to `max_query_len` tokens;
- the context is split into windows of `max_seq_len - |q| - 3` tokens (BERT: `[CLS] q [SEP] ctx [SEP]`; RoBERTa
  has one more separator), the next window starting `doc_stride` tokens after the previous one's start (note:
  Hugging Face tokenizers' `stride` is the *overlap* between windows, not this step);
- a context token that appears in several windows counts only in the window where it has the most context
  on both sides (`_check_is_max_context`: min(left, right) + 0.01 x window length);
- a training answer is mapped to tokens by character offsets: the first token ending after the answer's first
  character and the last token starting before its end; a window that does not contain the whole answer (and
  every v2.0 unanswerable question) points at [CLS] (index 0).

Postprocessing: per question, over all its windows, the top `n_best` start and end logits inside the context,
end >= start, length <= `max_answer_len`, max-context start, score = start + end logit; the text is the slice of
the original context between the start token's first and the end token's last character (and the combining marks
after it that an accent-stripping normaliser drops). v2.0: the null score is the smallest [CLS] start+end over the
windows, and the answer is "" when null - best span > threshold.
"""

from __future__ import annotations

import dataclasses
import json
import math
import unicodedata
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.errors import UserError
from bertforge.runtime.io import read_input, write_text


@dataclasses.dataclass
class SquadExample:
    qid: str
    question: str
    context: str
    answers: list[tuple[str, int]]
    """(text, character start) of each gold answer; empty for an unanswerable v2.0 question."""
    is_impossible: bool = False


def read_squad(
    path: str | Path, scoring: bool = False, v1: bool = False, training: bool = False
) -> tuple[list[SquadExample], list[dict[str, Any]]]:
    """Examples of a SQuAD JSON file and its raw `data` list (what the official metric reads).

    A file that is not SQuAD's shape (a missing key, a non-integer `answer_start`, no questions at all) is a
    UserError naming the file and the field, so the metric and the feature builder can index it freely.
    `scoring`: only what the official metric reads is required (ids and answer texts), as its scripts do;
    a `question`, `context` or `answer_start` that is there must still have its type.
    `v1`: SQuAD v1.1: every question needs an answer, and `is_impossible` (a v2.0 field) is not read.
    `training`: a v2.0 question may leave out `answers` (an unanswerable one); evaluation files need the key,
    as the official scripts read every question's.
    """
    path = Path(path)
    data = read_input(path, "SQuAD file", "give the SQuAD JSON file (e.g. train-v1.1.json)")
    try:
        raw = json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise UserError(f"SQuAD file {path} is not valid JSON: {e}") from None
    data = _field(raw, "data", list, path, "the top level")
    examples = []
    first_at: dict[str, str] = {}  # id -> where: predictions and the official metric are keyed by id
    for a, article in enumerate(data):
        for p, para in enumerate(_field(article, "paragraphs", list, path, f"data[{a}]")):
            where = f"data[{a}].paragraphs[{p}]"
            context = _field(para, "context", str, path, where, "" if scoring else None)
            for q, qa in enumerate(_field(para, "qas", list, path, where)):
                examples.append(ex := _example(qa, context, path, f"{where}.qas[{q}]", scoring, v1, training))
                if not training and first_at.setdefault(ex.qid, f"{where}.qas[{q}]") != f"{where}.qas[{q}]":
                    raise UserError(
                        f"SQuAD file {path}: {where}.qas[{q}] repeats the id {ex.qid!r} of {first_at[ex.qid]}; "
                        "evaluation scores each id once, so one of the two would be scored against the other's "
                        "prediction: give every question its own id"
                    )
    if not examples:
        raise UserError(f"SQuAD file {path} holds no questions (no data[].paragraphs[].qas[]); is it the right file?")
    return examples, data


def _example(qa: Any, context: str, path: Path, where: str, scoring: bool, v1: bool, training: bool) -> SquadExample:
    """The question at `where` (`read_squad`'s flags)."""
    qid = _field(qa, "id", str, path, where)
    question = _field(qa, "question", str, path, where, "" if scoring else None)
    answers = [
        (
            _field(x, "text", str, path, f"{where}.answers[{k}]"),
            _field(x, "answer_start", int, path, f"{where}.answers[{k}]", 0 if scoring else None),
        )
        for k, x in enumerate(_field(qa, "answers", list, path, where, [] if training or v1 else None))
    ]
    if v1 and not answers:
        # else it trains as unanswerable (the [CLS] target of v2.0), and evaluate-v1.1.py cannot score it (its
        # max over the gold answers fails)
        raise UserError(
            f"SQuAD file {path}: {where} (id {qid!r}) has no answers; every SQuAD v1.1 question needs at least "
            "one: add its answers, or use --task squad_v2 for a file with unanswerable questions"
        )
    # run_squad.py reads is_impossible for v2.0 only: in v1.1 an answered question trains on its answer
    return SquadExample(qid, question, context, answers, not v1 and bool(qa.get("is_impossible", False)))


def _field(obj: Any, key: str, kind: type, path: Path, where: str, default: Any = None) -> Any:
    """obj[key], checked to be a `kind` (and an offset >= 0); else a one-line error naming the file and the
    field. A missing key gives `default` when there is one."""
    if not isinstance(obj, dict):
        raise UserError(f"SQuAD file {path}: {where} is {obj!r:.60}, not an object (not a SQuAD JSON file?)")
    if key not in obj and default is not None:
        return default
    if key not in obj:
        raise UserError(f"SQuAD file {path}: {where} has no {key!r} (not a SQuAD v1.1/v2.0 JSON file?)")
    value = obj[key]
    if not isinstance(value, kind) or isinstance(value, bool) or (isinstance(value, int) and value < 0):
        kind_name = {list: "a list", str: "a string", int: "a character offset (an integer >= 0)"}[kind]
        raise UserError(f"SQuAD file {path}: {where}.{key} is {value!r:.60}, not {kind_name}")
    return value


def answer_matches(ex: SquadExample) -> bool:
    """Whether the first answer's text is what its `answer_start` points at in the context (up to whitespace):
    run_squad.py's "Could not find answer" check, which skips the example rather than train a wrong span."""
    text, start = ex.answers[0]
    found = ex.context[start : start + len(text)]
    return bool(text.strip()) and start + len(text) <= len(ex.context) and found.split() == text.split()


@dataclasses.dataclass
class Specials:
    """How a question/context pair is laid out for this tokenizer's model family."""

    cls: int
    sep: int
    mid: int
    """Separators between question and context: 1 for BERT (`[SEP]`), 2 for RoBERTa (`</s></s>`)."""
    type_ids: bool
    """Whether the context gets token type 1 (BERT) or all zeros (RoBERTa has no token types)."""


def specials_for(tokenizer) -> Specials:
    if tokenizer.token_to_id("[CLS]") is not None:
        return Specials(tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]"), 1, True)
    if tokenizer.token_to_id("<s>") is not None:
        return Specials(tokenizer.token_to_id("<s>"), tokenizer.token_to_id("</s>"), 2, False)
    raise UserError("tokenizer has neither [CLS]/[SEP] (BERT) nor <s>/</s> (RoBERTa) special tokens")


def window_starts(n_tokens: int, max_ctx: int, doc_stride: int) -> list[tuple[int, int]]:
    """(start, length) of each context window: run_squad.py's loop, the step being `doc_stride` tokens."""
    spans, start = [], 0
    while True:
        length = min(max_ctx, n_tokens - start)
        spans.append((start, length))
        if start + length >= n_tokens:
            return spans
        start += min(length, doc_stride)


def max_context_flags(spans: Sequence[tuple[int, int]]) -> list[np.ndarray]:
    """For every window, whether each of its tokens has its maximum context in this window."""
    best: dict[int, tuple[float, int]] = {}
    for w, (start, length) in enumerate(spans):
        for pos in range(start, start + length):
            score = min(pos - start, start + length - 1 - pos) + 0.01 * length
            if pos not in best or score > best[pos][0]:
                best[pos] = (score, w)
    return [np.array([best[p][1] == w for p in range(s, s + n)], dtype=bool) for w, (s, n) in enumerate(spans)]


@dataclasses.dataclass
class SquadFeatures:
    """One row per window. Sequences have their own lengths (padding happens per batch)."""

    input_ids: list[np.ndarray]
    token_type_ids: list[np.ndarray]
    example_index: np.ndarray
    """Index into the example list of the question each window belongs to."""
    ctx_offset: np.ndarray
    """Position of the first context token in the sequence."""
    offsets: list[np.ndarray]
    """(n_ctx, 2) character span in the context of each context token of the window."""
    max_context: list[np.ndarray]
    """(n_ctx,) bool: the token's score counts in this window."""
    start_positions: np.ndarray
    end_positions: np.ndarray

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def lengths(self) -> np.ndarray:
        return np.array([len(x) for x in self.input_ids])


def _encode_unique(tokenizer, texts: Sequence[str]) -> dict[str, Any]:
    """Encode each distinct text once (a paragraph's context is shared by its ~5 questions)."""
    unique = list(dict.fromkeys(texts))
    encs = tokenizer.encode_batch(unique, add_special_tokens=False)
    return dict(zip(unique, encs))


def _trimmed_offsets(text: str, offsets: Sequence[tuple[int, int]]) -> np.ndarray:
    """(n, 2) token character spans without surrounding whitespace: byte-level BPE (RoBERTa) tokens carry their
    leading space ("Ġparis" spans " paris") unless a post-processor trims them, and we encode without one.

    A token also takes the combining marks that follow it and that no token holds: an accent-stripping
    (uncased) normaliser drops them, so a decomposed "Beyonce\u0301" (or Hindi "में", whose vowel signs are
    marks) is one token ending before its last mark, and the answer would lose it ("Beyonce", "म"). Google's
    run_squad.py answers with the original words, marks included."""
    out = np.asarray(offsets, dtype=np.int64).reshape(-1, 2).copy()
    for row in out:
        s, e = int(row[0]), int(row[1])
        while s < e - 1 and text[s].isspace():
            s += 1
        while e > s + 1 and text[e - 1].isspace():
            e -= 1
        row[0], row[1] = s, e
    if text.isascii():  # no combining marks: the pass below is for the contexts that can hold them
        return out
    covered = None  # (len(text),) bool: held by some token; built only for a text with a mark after a token
    for row in out:
        e = int(row[1])
        if e >= len(text) or not unicodedata.category(text[e]).startswith("M"):
            continue
        if covered is None:
            covered = np.zeros(len(text), dtype=bool)
            for s2, e2 in out.tolist():
                covered[s2:e2] = True
        while e < len(text) and not covered[e] and unicodedata.category(text[e]).startswith("M"):
            e += 1
        row[1] = e
    return out


def _wrong_answers(examples: Sequence[SquadExample], log: Callable[[str], None] | None) -> set[int]:
    """Indices of the training examples whose answer is not at its answer_start, counted in one line to `log`."""
    answerable = [i for i, ex in enumerate(examples) if ex.answers and not ex.is_impossible]
    wrong = {i for i in answerable if not answer_matches(examples[i])}
    if wrong and log is not None:
        log(
            f"warning: skipped {len(wrong)} of {len(answerable)} training answers whose answer_start does not "
            f"match the context (first: question {examples[min(wrong)].qid!r})"
        )
    if wrong and len(wrong) == len(examples):
        raise UserError(
            f"none of the {len(examples)} training answers matches its context at its answer_start; is "
            "--train-file a SQuAD file whose offsets count characters of the context?"
        )
    return wrong


def make_features(
    examples: Sequence[SquadExample],
    tokenizer,
    max_seq_len: int = 384,
    doc_stride: int = 128,
    max_query_len: int = 64,
    training: bool = False,
    log: Callable[[str], None] | None = print,
) -> SquadFeatures:
    """Windowed features of `examples`; with `training`, answers whose text is not at their answer_start are
    skipped (their questions get no features) and counted in one line to `log`."""
    sp = specials_for(tokenizer)
    contexts = _encode_unique(tokenizer, [e.context for e in examples])
    # run_qa.py strips the question's left whitespace (SQuAD dev has 10 such questions): a byte-level BPE would
    # encode it as lone space tokens and spell the first word as a mid-sentence one ("ĠWhere"), unlike transformers
    questions = _encode_unique(tokenizer, [e.question.lstrip() for e in examples])
    input_ids: list[np.ndarray] = []
    token_type_ids: list[np.ndarray] = []
    offsets: list[np.ndarray] = []
    max_context: list[np.ndarray] = []
    ex_idx: list[int] = []
    ctx_off: list[int] = []
    starts: list[int] = []
    ends: list[int] = []
    trimmed: dict[str, np.ndarray] = {}
    wrong = _wrong_answers(examples, log) if training else set()
    for i, ex in enumerate(examples):
        if i in wrong:
            continue
        q_ids = questions[ex.question.lstrip()].ids[:max_query_len]
        c_enc = contexts[ex.context]
        c_ids = np.asarray(c_enc.ids, dtype=np.int64)
        if ex.context not in trimmed:
            trimmed[ex.context] = _trimmed_offsets(ex.context, c_enc.offsets)
        c_offsets = trimmed[ex.context]  # (n_ctx, 2)
        max_ctx = max_seq_len - len(q_ids) - 2 - sp.mid
        if max_ctx <= 0:
            raise UserError(
                f"max_seq_len {max_seq_len} leaves no room for the context after a {len(q_ids)}-token "
                f"question; raise max_seq_len or lower max_query_len"
            )
        spans = window_starts(len(c_ids), max_ctx, doc_stride)
        flags = max_context_flags(spans)
        tok_start = tok_end = -1
        if training and ex.answers and not ex.is_impossible:
            text, char_start = ex.answers[0]
            char_end = char_start + len(text)
            # first token ending after the answer starts, last token starting before it ends
            inside = np.nonzero((c_offsets[:, 1] > char_start) & (c_offsets[:, 0] < char_end))[0]
            if len(inside):
                tok_start, tok_end = int(inside[0]), int(inside[-1])
        head = [sp.cls, *q_ids] + [sp.sep] * sp.mid
        for (start, length), flag in zip(spans, flags):
            ids = np.asarray(head + c_ids[start : start + length].tolist() + [sp.sep], dtype=np.int64)
            types = np.zeros(len(ids), dtype=np.int64)
            if sp.type_ids:
                types[len(head) :] = 1
            input_ids.append(ids)
            token_type_ids.append(types)
            offsets.append(c_offsets[start : start + length])
            max_context.append(flag)
            ex_idx.append(i)
            ctx_off.append(len(head))
            s = e = 0
            if tok_start >= start and tok_end < start + length:
                s, e = tok_start - start + len(head), tok_end - start + len(head)
            starts.append(s)
            ends.append(e)
    return SquadFeatures(
        input_ids=input_ids,
        token_type_ids=token_type_ids,
        example_index=np.asarray(ex_idx, dtype=np.int64),
        ctx_offset=np.asarray(ctx_off, dtype=np.int64),
        offsets=offsets,
        max_context=max_context,
        start_positions=np.asarray(starts, dtype=np.int64),
        end_positions=np.asarray(ends, dtype=np.int64),
    )


def postprocess(
    examples: Sequence[SquadExample],
    features: SquadFeatures,
    start_logits: Sequence[np.ndarray],
    end_logits: Sequence[np.ndarray],
    n_best: int = 20,
    max_answer_len: int = 30,
    version_2: bool = False,
    null_score_diff_threshold: float = 0.0,
) -> tuple[dict[str, str], dict[str, list[dict[str, Any]]], dict[str, float]]:
    """(predictions, nbest, null_odds) from per-feature logits (each a (len(feature),) array, in feature order).

    null_odds (v2.0) is null score - best span score per question: the `na_probs` the official v2 script's
    best-threshold search takes.
    """
    by_example: dict[int, list[int]] = {}
    for fi, ei in enumerate(features.example_index):
        by_example.setdefault(int(ei), []).append(fi)
    predictions: dict[str, str] = {}
    nbest_out: dict[str, list[dict[str, Any]]] = {}
    null_odds: dict[str, float] = {}
    for ei, ex in enumerate(examples):
        cands: list[tuple[float, float, float, int, int]] = []  # (score, start logit, end logit, char s, char e)
        null_score, null_logits = math.inf, (0.0, 0.0)
        for fi in by_example.get(ei, []):
            s_log, e_log = np.asarray(start_logits[fi]), np.asarray(end_logits[fi])
            if float(s_log[0] + e_log[0]) < null_score:  # the [CLS] logits of that window, as run_squad.py reports
                null_score, null_logits = float(s_log[0] + e_log[0]), (float(s_log[0]), float(e_log[0]))
            c0 = int(features.ctx_offset[fi])
            n_ctx = len(features.offsets[fi])
            cs, ce = s_log[c0 : c0 + n_ctx], e_log[c0 : c0 + n_ctx]  # context part only, (n_ctx,)
            k = min(n_best, n_ctx)
            top_s = np.argsort(-cs, kind="stable")[:k]
            top_e = np.argsort(-ce, kind="stable")[:k]
            S, E = np.meshgrid(top_s, top_e, indexing="ij")  # (k, k) candidate pairs
            ok = (E >= S) & (E - S + 1 <= max_answer_len) & features.max_context[fi][S]
            for a, b in zip(S[ok].tolist(), E[ok].tolist()):
                off = features.offsets[fi]
                cands.append((float(cs[a] + ce[b]), float(cs[a]), float(ce[b]), int(off[a, 0]), int(off[b, 1])))
        cands.sort(key=lambda c: -c[0])
        seen: set[str] = set()
        entries: list[dict[str, Any]] = []
        for score, sl, el, c_s, c_e in cands:
            text = ex.context[c_s:c_e]
            if text in seen:  # several windows propose the same span
                continue
            seen.add(text)
            entries.append({"text": text, "score": score, "start_logit": sl, "end_logit": el})
            if len(entries) >= n_best:
                break
        best_span = next((d for d in entries if d["text"]), None)  # before the null entry takes a place
        if version_2 and null_score < math.inf:
            # run_squad.py's null entry competes for the n_best places (after spans of its score), and is added
            # after them only when it ranks below all n_best
            rank = sum(1 for d in entries if d["score"] >= null_score)
            entries.insert(
                rank, {"text": "", "score": null_score, "start_logit": null_logits[0], "end_logit": null_logits[1]}
            )
            if rank < n_best:
                del entries[n_best:]
        if not entries:
            entries = [{"text": "", "score": 0.0, "start_logit": 0.0, "end_logit": 0.0}]
        scores = np.array([d["score"] for d in entries])
        probs = np.exp(scores - scores.max())
        probs /= probs.sum()
        for d, p in zip(entries, probs):
            d["probability"] = float(p)
        nbest_out[ex.qid] = entries
        if not version_2:
            predictions[ex.qid] = entries[0]["text"]
        else:
            diff = null_score - (best_span["score"] if best_span else -math.inf)
            null_odds[ex.qid] = float(diff) if math.isfinite(diff) else 1e9
            predictions[ex.qid] = "" if best_span is None or diff > null_score_diff_threshold else best_span["text"]
    return predictions, nbest_out, null_odds


def write_json(path: str | Path, obj: Any) -> None:
    """Atomic JSON write (temporary name, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(obj, indent=1, ensure_ascii=False))
