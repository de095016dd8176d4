"""Task heads as one table (`TASK_HEADS`): which modules a task adds on top of the encoder, whether it needs
the pooler, how its forward turns the sequence output into logits and a loss, and which `transformers`
class holds the same weights.

Module names follow Hugging Face BERT (`cls.predictions.*`, `cls.seq_relationship`, `qa_outputs`,
`classifier`) so `hf_interop`'s name map stays short.

The MLM head is masked-only (DESIGN §4): hidden states are gathered at `masked_positions` first, then
transformed and projected to the vocabulary, so the largest matmul of a small model runs on B*P rows instead
of B*T. Slot semantics follow NVIDIA's data: position 0 is always [CLS], so `masked_positions == 0` marks an
empty slot. Without `masked_positions` the same module runs densely over every token: the reference path
(and Hugging Face's `labels (B, T)` with -100 = ignore).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from bertforge.model.config import BertConfig
from bertforge.model.dropout import Dropout


@dataclass
class ModelOutput:
    """Everything a head can return; fields a task does not produce stay None."""

    loss: torch.Tensor | None = None
    mlm_loss: torch.Tensor | None = None
    nsp_loss: torch.Tensor | None = None
    mlm_logits: torch.Tensor | None = None
    """(B*P, V) at the masked slots; (B, T, V) on the dense reference path."""
    nsp_logits: torch.Tensor | None = None
    """(B*K, 2), one row per [CLS] slot."""
    mlm_correct: torch.Tensor | None = None
    mlm_count: torch.Tensor | None = None
    nsp_correct: torch.Tensor | None = None
    nsp_count: torch.Tensor | None = None
    start_logits: torch.Tensor | None = None
    end_logits: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    last_hidden_state: torch.Tensor | None = None
    """(B, T, H) encoder output (embeddings for serving / sentence encoders)."""

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}


# ------------------------------------------------------------------------------------------- modules
class PredictionHead(nn.Module):
    """transform (dense, act, LayerNorm) then the decoder tied to the word embeddings, plus an output bias."""

    def __init__(self, config: BertConfig):
        super().__init__()
        from bertforge.model.bert import ACTIVATIONS  # local: bert imports this module

        self.transform = nn.Module()
        self.transform.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.transform.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.act = ACTIVATIONS[config.hidden_act]
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, x: torch.Tensor, decoder_weight: torch.Tensor) -> torch.Tensor:
        x = self.transform.LayerNorm(self.act(self.transform.dense(x)))
        return F.linear(x, decoder_weight, self.bias)  # (..., V)


class PreTrainingHeads(nn.Module):
    def __init__(self, config: BertConfig, nsp: bool):
        super().__init__()
        self.predictions = PredictionHead(config)
        if nsp:
            self.seq_relationship = nn.Linear(config.hidden_size, 2)


def _mlm(model, seq, masked_positions, masked_labels, labels) -> dict[str, torch.Tensor]:
    head: PredictionHead = model.cls.predictions
    weight = model.bert.embeddings.word_embeddings.weight  # (V, H), tied decoder
    if masked_positions is None:  # dense reference path: every token
        logits = head(seq, weight)  # (B, T, V)
        out: dict[str, torch.Tensor] = {"mlm_logits": logits}
        if labels is not None:
            valid = labels != -100
            out["mlm_loss"] = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1),
                                              ignore_index=-100)
            out["mlm_count"] = valid.sum()
            out["mlm_correct"] = ((logits.argmax(-1) == labels) & valid).sum()
        return out
    B, P = masked_positions.shape
    H = seq.shape[-1]
    x = seq.gather(1, masked_positions[:, :, None].expand(B, P, H))  # (B, P, H): gather first
    logits = head(x.reshape(B * P, H), weight)  # (B*P, V)
    out = {"mlm_logits": logits}
    if masked_labels is not None:
        valid = masked_positions.reshape(-1) != 0  # (B*P,) slot 0 = empty (position 0 is [CLS])
        target = masked_labels.reshape(-1).masked_fill(~valid, -100)
        count = valid.sum()
        # sum / count (not mean) so a batch with no masked slot gives 0, not NaN
        ce = F.cross_entropy(logits.float(), target, ignore_index=-100, reduction="sum")
        out["mlm_loss"] = ce / count.clamp(min=1)
        out["mlm_count"] = count
        out["mlm_correct"] = ((logits.argmax(-1) == target) & valid).sum()
    return out


def _nsp(model, seq, nsp_positions, nsp_labels) -> dict[str, torch.Tensor]:
    B, _, H = seq.shape
    if nsp_positions is None:
        nsp_positions = torch.zeros(B, 1, dtype=torch.long, device=seq.device)  # one [CLS] at 0
    K = nsp_positions.shape[1]
    cls_h = seq.gather(1, nsp_positions[:, :, None].expand(B, K, H))  # (B, K, H): each sequence's [CLS]
    logits = model.cls.seq_relationship(model.bert.pooler(cls_h)).reshape(B * K, 2)  # (B*K, 2)
    out = {"nsp_logits": logits}
    if nsp_labels is not None:
        target = nsp_labels.reshape(-1)  # (B,) or (B, K) -> (B*K,); -1 = empty slot
        valid = target != -1
        count = valid.sum()
        ce = F.cross_entropy(logits.float(), target, ignore_index=-1, reduction="sum")
        out["nsp_loss"] = ce / count.clamp(min=1)
        out["nsp_count"] = count
        out["nsp_correct"] = ((logits.argmax(-1) == target) & valid).sum()
    return out


def _pretraining_forward(model, seq, b) -> ModelOutput:
    out = _mlm(model, seq, b["masked_positions"], b["masked_labels"], b["labels"])
    out.update(_nsp(model, seq, b["nsp_positions"], b["nsp_labels"]))
    if "mlm_loss" in out and "nsp_loss" in out:
        out["loss"] = out["mlm_loss"] + out["nsp_loss"]
    return ModelOutput(**out)


def _mlm_forward(model, seq, b) -> ModelOutput:
    out = _mlm(model, seq, b["masked_positions"], b["masked_labels"], b["labels"])
    return ModelOutput(loss=out.get("mlm_loss"), **out)


def _qa_forward(model, seq, b) -> ModelOutput:
    start, end = model.qa_outputs(seq).unbind(-1)  # (B, T, 2) -> 2 x (B, T)
    loss = None
    if b["start_positions"] is not None and b["end_positions"] is not None:
        # as Hugging Face: positions outside the window are clamped to T and ignored
        T = seq.shape[1]
        sp, ep = b["start_positions"].clamp(0, T), b["end_positions"].clamp(0, T)
        loss = (F.cross_entropy(start.float(), sp, ignore_index=T) + F.cross_entropy(end.float(), ep, ignore_index=T)) / 2
    return ModelOutput(loss=loss, start_logits=start, end_logits=end)


def _sequence_forward(model, seq, b, regression: bool) -> ModelOutput:
    pooled = model.bert.pooler(seq[:, 0])  # (B, H) from [CLS]
    logits = model.classifier(model.head_dropout(pooled))  # (B, L)
    loss = None
    if b["labels"] is not None:
        if regression:
            loss = F.mse_loss(logits.float().squeeze(-1), b["labels"].float().view(-1))
        else:
            loss = F.cross_entropy(logits.float(), b["labels"].view(-1))
    return ModelOutput(loss=loss, logits=logits)


def _token_forward(model, seq, b) -> ModelOutput:
    logits = model.classifier(model.head_dropout(seq))  # (B, T, L)
    loss = None
    if b["labels"] is not None:
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), b["labels"].reshape(-1), ignore_index=-100)
    return ModelOutput(loss=loss, logits=logits)


@dataclass(frozen=True)
class TaskHead:
    modules: Callable[[BertConfig, int], dict[str, nn.Module]]
    """Top-level modules the task adds, by (Hugging Face) name."""
    pooler: bool
    """Whether the encoder keeps its pooler (NSP and sequence classification read it)."""
    forward: Callable[[Any, torch.Tensor, dict[str, Any]], ModelOutput]
    """(model, sequence output (B, T, H), batch) -> ModelOutput."""
    hf_bert: str
    """The `transformers` class with the same weights, for BERT."""
    hf_roberta: str | None
    """The same for RoBERTa (None: transformers has none, e.g. no NSP head)."""
    fixed_labels: int | None = None
    """Number of outputs when the task fixes it (regression: 1)."""


def _dropout(config: BertConfig) -> nn.Module:
    return Dropout(config.hidden_dropout_prob)


TASK_HEADS: dict[str, TaskHead] = {
    "pretraining": TaskHead(lambda c, n: {"cls": PreTrainingHeads(c, nsp=True)}, True, _pretraining_forward,
                            "BertForPreTraining", None),
    "mlm": TaskHead(lambda c, n: {"cls": PreTrainingHeads(c, nsp=False)}, False, _mlm_forward,
                    "BertForMaskedLM", "RobertaForMaskedLM"),
    "qa": TaskHead(lambda c, n: {"qa_outputs": nn.Linear(c.hidden_size, 2)}, False, _qa_forward,
                   "BertForQuestionAnswering", "RobertaForQuestionAnswering"),
    "classification": TaskHead(
        lambda c, n: {"head_dropout": _dropout(c), "classifier": nn.Linear(c.hidden_size, n)}, True,
        lambda m, s, b: _sequence_forward(m, s, b, regression=False),
        "BertForSequenceClassification", "RobertaForSequenceClassification"),
    "regression": TaskHead(
        lambda c, n: {"head_dropout": _dropout(c), "classifier": nn.Linear(c.hidden_size, 1)}, True,
        lambda m, s, b: _sequence_forward(m, s, b, regression=True),
        "BertForSequenceClassification", "RobertaForSequenceClassification", fixed_labels=1),
    "token_classification": TaskHead(
        lambda c, n: {"head_dropout": _dropout(c), "classifier": nn.Linear(c.hidden_size, n)}, False,
        _token_forward, "BertForTokenClassification", "RobertaForTokenClassification"),
}
