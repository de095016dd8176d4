"""Task heads as modules and one table (`TASK_HEADS`): which head module a task puts on top of the encoder,
which of the encoder's pieces (the tied decoder weight, the pooler) its forward takes, and which
`transformers` class holds the same weights. A head's forward turns the sequence output into logits and a
loss; it reads nothing of the model but its own parameters and what it is given.

Module names follow Hugging Face BERT (`cls.predictions.*`, `cls.seq_relationship`, `qa_outputs`,
`classifier`) so `hf_interop`'s name map stays short. The pooler stays `bert.pooler` and the decoder weight
stays `bert.embeddings.word_embeddings.weight`: the heads get them as arguments and never register them, so
each parameter has one name.

The MLM head is masked-only (DESIGN §4): hidden states are gathered at `masked_positions` first, then
transformed and projected to the vocabulary, so the largest matmul of a small model runs on B*P rows instead
of B*T. Slot semantics follow NVIDIA's data: position 0 is always [CLS], so `masked_positions == 0` marks an
empty slot. Without `masked_positions` the same module runs densely over every token: the reference path
(and Hugging Face's `labels (B, T)` with -100 = ignore).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from bertforge.model.activations import ACTIVATIONS
from bertforge.model.config import BertConfig
from bertforge.model.dropout import Dropout, fast_dropout_usable


@dataclass
class ModelOutput:
    """Everything a head can return; fields a task does not produce stay None."""

    loss: torch.Tensor | None = None
    mlm_loss: torch.Tensor | None = None
    nsp_loss: torch.Tensor | None = None
    mlm_logits: torch.Tensor | None = None
    """(B*P, V) at the masked slots; (n, V) at the n real slots only when training with labels in eager mode on
    CPU; (B, T, V) on the dense reference path."""
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


# ------------------------------------------------------------------------------------------- heads
# Each head is the module registered on the model under its Hugging Face name; its forward takes the sequence
# output (B, T, H), the batch (the label/position inputs of `BertForTask.forward`, None when absent) and, by
# keyword, the pieces it shares with the encoder, which the encoder owns and names (`TaskHead.inputs`):
# `decoder_weight`, the word embeddings (V, H) the MLM decoder is tied to, and `pooler`, `bert.pooler`.
Batch = dict[str, Any]


class Transform(nn.Module):
    """LayerNorm(act(dense(x))): BERT's MLM `transform`, and ModernBERT's prediction head (`head`), which
    ModernBERT puts first in every task head (its biases and activation from the config's ModernBERT fields)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        bias = config.classifier_bias if config.modern else True
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=bias)
        self.act = ACTIVATIONS[config.classifier_activation if config.modern else config.hidden_act]
        norm_bias = config.norm_bias if config.modern else True
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps, bias=norm_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.act(self.dense(x)))


class PredictionHead(nn.Module):
    """transform (dense, act, LayerNorm) then the decoder tied to the word embeddings, plus an output bias."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.transform = Transform(config)
        has_bias = config.decoder_bias or not config.modern
        self.bias = nn.Parameter(torch.zeros(config.vocab_size)) if has_bias else None

    def forward(self, x: torch.Tensor, decoder_weight: torch.Tensor) -> torch.Tensor:
        return F.linear(self.transform(x), decoder_weight, self.bias)  # (..., V)


class PreTrainingHeads(nn.Module):
    """`cls`: the MLM head (`cls.predictions`) and, with `nsp`, the NSP classifier (`cls.seq_relationship`)
    on the pooled [CLS] vectors. The loss is MLM + NSP when both have labels (MLM alone without `nsp`)."""

    def __init__(self, config: BertConfig, nsp: bool):
        super().__init__()
        self.predictions = PredictionHead(config)
        self.nsp = nsp
        if nsp:
            self.seq_relationship = nn.Linear(config.hidden_size, 2)

    def forward(
        self, seq: torch.Tensor, batch: Batch, *, decoder_weight: torch.Tensor, pooler: nn.Module | None = None
    ) -> ModelOutput:
        out = self._mlm(seq, batch["masked_positions"], batch["masked_labels"], batch["labels"], decoder_weight)
        if not self.nsp:
            return ModelOutput(loss=out.get("mlm_loss"), **out)
        out.update(self._nsp(seq, batch["nsp_positions"], batch["nsp_labels"], pooler))
        if "mlm_loss" in out and "nsp_loss" in out:
            out["loss"] = out["mlm_loss"] + out["nsp_loss"]
        return ModelOutput(**out)

    def _mlm(self, seq, masked_positions, masked_labels, labels, decoder_weight) -> dict[str, torch.Tensor]:
        if masked_positions is None:  # dense reference path: every token
            logits = self.predictions(seq, decoder_weight)  # (B, T, V)
            out: dict[str, torch.Tensor] = {"mlm_logits": logits}
            if labels is not None:
                valid = labels != -100
                out["mlm_loss"] = F.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), ignore_index=-100
                )
                out["mlm_count"] = valid.sum()
                out["mlm_correct"] = ((logits.argmax(-1) == labels) & valid).sum()
            return out
        B, P = masked_positions.shape
        H = seq.shape[-1]
        x = seq.gather(1, masked_positions[:, :, None].expand(B, P, H)).reshape(B * P, H)  # gather first
        valid = masked_positions.reshape(-1) != 0  # (B*P,) slot 0 = empty (position 0 is [CLS])
        if masked_labels is None:
            return {"mlm_logits": self.predictions(x, decoder_weight)}  # (B*P, V)
        target = masked_labels.reshape(-1).masked_fill(~valid, -100)
        if self.training and fast_dropout_usable(x):
            # training in eager mode on CPU (the condition of the cheap dropout mask: a data-dependent shape costs
            # no device sync and no graph break there): only the n real slots reach the vocabulary projection,
            # the largest matmul; rows of varied length leave many slots empty
            keep = valid.nonzero().squeeze(1)  # (n,)
            x, valid, target = x.index_select(0, keep), valid[keep], target[keep]
        logits = self.predictions(x, decoder_weight)  # (B*P, V), or (n, V) when compacted
        return {"mlm_logits": logits, **_slot_scores("mlm", logits, target, valid, -100)}

    def _nsp(self, seq, nsp_positions, nsp_labels, pooler) -> dict[str, torch.Tensor]:
        B, _, H = seq.shape
        if nsp_positions is None:
            nsp_positions = torch.zeros(B, 1, dtype=torch.long, device=seq.device)  # one [CLS] at 0
        K = nsp_positions.shape[1]
        cls_h = seq.gather(1, nsp_positions[:, :, None].expand(B, K, H))  # (B, K, H): each sequence's [CLS]
        logits = self.seq_relationship(pooler(cls_h)).reshape(B * K, 2)  # (B*K, 2)
        out = {"nsp_logits": logits}
        if nsp_labels is not None:
            target = nsp_labels.reshape(-1)  # (B,) or (B, K) -> (B*K,); -1 = empty slot
            out.update(_slot_scores("nsp", logits, target, target != -1, -1))
        return out


def _slot_scores(name: str, logits, target, valid, ignore_index: int) -> dict[str, torch.Tensor]:
    """Loss (mean over the real slots), count and correct predictions of (N, C) logits at N slots."""
    count = valid.sum()
    # sum / count (not mean) so a batch with no real slot gives 0, not NaN
    logits32 = logits.float()
    ce = F.cross_entropy(logits32, target, ignore_index=ignore_index, reduction="sum")
    # argmax of the fp32 copy (the same values): CPU's bf16 argmax is ~6x slower, 0.6 s on a (2.5k, 50k) batch
    correct = (logits32.detach().argmax(-1) == target) & valid
    return {f"{name}_loss": ce / count.clamp(min=1), f"{name}_count": count, f"{name}_correct": correct.sum()}


def _modern_head(config: BertConfig) -> tuple[nn.Module | None, nn.Module]:
    """ModernBERT's task heads start with the prediction head (`head`: dense, act, norm) and dropout (at
    classifier_dropout, as transformers' ModernBert*For* heads); BERT's have neither (None, identity)."""
    if not config.modern:
        return None, nn.Identity()
    return Transform(config), Dropout(config.classifier_dropout_rate)


class SpanHead(nn.Linear):
    """`qa_outputs`: start and end logits of the answer span from every token (ModernBERT: after its `head`)."""

    def __init__(self, config: BertConfig):
        super().__init__(config.hidden_size, 2)
        self.head, self.drop = _modern_head(config)

    # the head is the bare Linear Hugging Face names `qa_outputs` (its weight/bias keys and BERT's Linear init
    # apply to it) and takes the head interface as its forward: a deliberate break of Linear.forward's signature
    def forward(self, seq: torch.Tensor, batch: Batch) -> ModelOutput:  # type: ignore[override]
        if self.head is not None:
            seq = self.drop(self.head(seq))  # (B, T, H)
        start, end = super().forward(seq).unbind(-1)  # (B, T, 2) -> 2 x (B, T)
        loss = None
        if batch["start_positions"] is not None and batch["end_positions"] is not None:
            # as Hugging Face: positions outside the window are clamped to T and ignored
            T = seq.shape[1]
            sp, ep = batch["start_positions"].clamp(0, T), batch["end_positions"].clamp(0, T)
            loss = (
                F.cross_entropy(start.float(), sp, ignore_index=T) + F.cross_entropy(end.float(), ep, ignore_index=T)
            ) / 2
        return ModelOutput(loss=loss, start_logits=start, end_logits=end)


def _class_loss(logits, labels):  # logits (B, L), labels (B,)
    return F.cross_entropy(logits.float(), labels.view(-1))


def _regression_loss(logits, labels):  # logits (B, 1), labels (B,)
    return F.mse_loss(logits.float().squeeze(-1), labels.float().view(-1))


def _token_loss(logits, labels):  # logits (B, T, L), labels (B, T), -100 = ignore
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)


class Classifier(nn.Linear):
    """`classifier`: dropout then a linear layer, on the pooled [CLS] vector (`pooled`, sequence tasks) or on
    every token; `loss_fn(logits, labels)` scores it. ModernBERT pools by `classifier_pooling` (first token or
    mean of the real tokens) and runs its `head` where BERT runs the tanh pooler."""

    def __init__(self, config: BertConfig, num_labels: int, loss_fn: Callable, pooled: bool):
        super().__init__(config.hidden_size, num_labels)
        # classifier_dropout, else the hidden rate: transformers' BERT/RoBERTa heads and ModernBERT's read it
        self.dropout = Dropout(config.classifier_dropout_rate)
        self.loss_fn, self.pooled = loss_fn, pooled
        self.head, _ = _modern_head(config)
        self.mean_pool = config.modern and config.classifier_pooling == "mean"
        # RoBERTa's classification head (fairseq, HF RobertaClassificationHead) drops the <s> vector before its
        # dense + tanh (our pooler) as well as after it; BERT's pooler output is dropped once
        self.drop_first = pooled and config.model_type == "roberta"

    # as SpanHead: the Linear Hugging Face names `classifier`, with the head interface as its forward
    def forward(  # type: ignore[override]
        self, seq: torch.Tensor, batch: Batch, *, pooler: nn.Module | None = None
    ) -> ModelOutput:
        if self.head is not None:
            x = self.head(self._pool(seq, batch["attention_mask"]) if self.pooled else seq)  # (B, H) / (B, T, H)
        elif not self.pooled:
            x = seq  # (B, T, H)
        elif pooler is None:
            raise ValueError("a pooled classifier needs the encoder's pooler (TaskHead.inputs names it)")
        else:
            cls = seq[:, 0]  # (B, H)
            x = pooler(self.dropout(cls) if self.drop_first else cls)  # (B, H) from [CLS]
        logits = super().forward(self.dropout(x))  # (B, L) or (B, T, L)
        loss = None if batch["labels"] is None else self.loss_fn(logits, batch["labels"])
        return ModelOutput(loss=loss, logits=logits)

    def _pool(self, seq: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """(B, T, H) -> (B, H): the first token, or the mean over the real tokens (HF ModernBERT)."""
        if not self.mean_pool:
            return seq[:, 0]
        real = (attention_mask != 0) if attention_mask is not None else seq.new_ones(seq.shape[:2], dtype=torch.bool)
        w = real.to(seq.dtype)[..., None]  # (B, T, 1)
        return (seq * w).sum(1) / w.sum(1)


# ------------------------------------------------------------------------------------------- table
@dataclass(frozen=True)
class TaskHead:
    name: str
    """The model attribute holding the head: its Hugging Face name (`cls`, `qa_outputs`, `classifier`)."""
    build: Callable[[BertConfig, int], nn.Module]
    """(config, num_labels) -> the head module."""
    inputs: tuple[str, ...]
    """Encoder pieces the head's forward takes by keyword: `decoder_weight`, `pooler`."""
    hf_bert: str
    """The `transformers` class with the same weights, for BERT."""
    hf_roberta: str | None
    """The same for RoBERTa (None: transformers has none, e.g. no NSP head)."""
    fixed_labels: int | None = None
    """Number of outputs when the task fixes it (regression: 1)."""
    hf_modernbert: str | None = None
    """The same for ModernBERT (None: no such head, e.g. NSP)."""

    def hf_class(self, model_type: str) -> str | None:
        """The `transformers` class holding this head's weights for a model type."""
        return {"bert": self.hf_bert, "roberta": self.hf_roberta, "modernbert": self.hf_modernbert}[model_type]

    @property
    def pooler(self) -> bool:
        """Whether the encoder keeps its pooler (NSP and sequence classification read it)."""
        return "pooler" in self.inputs


TASK_HEADS: dict[str, TaskHead] = {
    "pretraining": TaskHead(
        "cls", lambda c, n: PreTrainingHeads(c, nsp=True), ("decoder_weight", "pooler"), "BertForPreTraining", None
    ),
    "mlm": TaskHead(
        "cls",
        lambda c, n: PreTrainingHeads(c, nsp=False),
        ("decoder_weight",),
        "BertForMaskedLM",
        "RobertaForMaskedLM",
        hf_modernbert="ModernBertForMaskedLM",
    ),
    "qa": TaskHead(
        "qa_outputs",
        lambda c, n: SpanHead(c),
        (),
        "BertForQuestionAnswering",
        "RobertaForQuestionAnswering",
        hf_modernbert="ModernBertForQuestionAnswering",
    ),
    "classification": TaskHead(
        "classifier",
        lambda c, n: Classifier(c, n, _class_loss, pooled=True),
        ("pooler",),
        "BertForSequenceClassification",
        "RobertaForSequenceClassification",
        hf_modernbert="ModernBertForSequenceClassification",
    ),
    "regression": TaskHead(
        "classifier",
        lambda c, n: Classifier(c, 1, _regression_loss, pooled=True),
        ("pooler",),
        "BertForSequenceClassification",
        "RobertaForSequenceClassification",
        fixed_labels=1,
        hf_modernbert="ModernBertForSequenceClassification",
    ),
    "token_classification": TaskHead(
        "classifier",
        lambda c, n: Classifier(c, n, _token_loss, pooled=False),
        (),
        "BertForTokenClassification",
        "RobertaForTokenClassification",
        hf_modernbert="ModernBertForTokenClassification",
    ),
}
