"""The Hugging Face baseline, built in one place for every benchmark: `transformers.BertForPreTraining` (SDPA
attention) with dense MLM labels (-100 off the masked slots) and torch AdamW in a plain loop — the usual way to
pre-train BERT with Hugging Face (run_mlm.py's model and optimizer without the Trainer). On MLM-only shards
(objective mlm: no NSP labels, for which `BertForPreTraining` returns no loss) it is `transformers.BertForMaskedLM`,
run_mlm.py's own model and the heads ours trains there. For a ModernBERT config it is
`transformers.ModernBertForMaskedLM` (SDPA; `sparse_prediction` as given: transformers' default is off, the
vocabulary projection then runs at every token).

    model, opt = hf_pretraining(config, device, objective=shards.objective)   # "mlm_nsp" (default) or "mlm"
    loss = hf_step(model, opt, batch, device, precision)   # forward, backward, clip 1.0, AdamW step
"""

from __future__ import annotations

from typing import Any

import torch

from bertforge import device as dev
from bertforge.errors import UserError

NO_DECAY = ("bias", "LayerNorm.weight", "norm.weight")


def dense_labels(b: dict[str, torch.Tensor]) -> torch.Tensor:
    """HF's MLM labels (B, T): the token id at each masked position, -100 elsewhere (slot 0 = empty, never a
    label). Packed rows are not something HF's model reads; baselines use unpacked batches."""
    labels = torch.full_like(b["input_ids"], -100)
    pos, lab = b["masked_positions"], b["masked_labels"]
    valid = pos > 0
    rows = torch.arange(pos.shape[0], device=pos.device).unsqueeze(1).expand_as(pos)
    labels[rows[valid], pos[valid]] = lab[valid]
    return labels


def hf_inputs(b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our batch (bertforge.data.loader names) as `BertForPreTraining`'s keyword arguments (an MLM-only batch,
    without token types and NSP labels, as `ModernBertForMaskedLM`'s)."""
    out = {
        "input_ids": b["input_ids"],
        "attention_mask": (b["attention_mask"] != 0).long(),
        "labels": dense_labels(b),
    }
    if "nsp_labels" in b:
        out.update(token_type_ids=b["token_type_ids"], next_sentence_label=b["nsp_labels"])
    return out


def hf_config(config: Any, sparse_prediction: bool = False):
    import transformers

    if config.model_type == "modernbert":
        from bertforge.model.hf_interop import config_to_hf

        raw = config_to_hf(config, "mlm", 2)
        return transformers.ModernBertConfig(
            **{k: v for k, v in raw.items() if k not in ("architectures", "model_type")},
            sparse_prediction=sparse_prediction,
        )
    return transformers.BertConfig(**{k: v for k, v in config.to_dict().items() if k != "model_type"})


def hf_pretraining(
    config: Any,
    device: torch.device,
    lr: float = 1e-4,
    weight_decay: float = 0.01,
    sparse_prediction: bool = False,
    objective: str = "mlm_nsp",
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """`BertForPreTraining` (`objective` mlm_nsp), `BertForMaskedLM` (mlm: MLM-only shards) or
    `ModernBertForMaskedLM` of our config (SDPA) on `device`, in train mode, and its AdamW (no decay on biases and
    norms; the kernel `bertforge.optim.build_optimizer` picks for ours: fused on CUDA and the CPU, foreach
    elsewhere)."""
    import transformers

    from bertforge.optim.lamb import adamw_kernel

    if objective not in ("mlm_nsp", "mlm"):
        raise ValueError(f"objective must be mlm_nsp or mlm (a ShardSet's objective), not {objective!r}")
    if config.model_type == "modernbert":
        cls: Any = transformers.ModernBertForMaskedLM
    else:
        cls = transformers.BertForPreTraining if objective == "mlm_nsp" else transformers.BertForMaskedLM
    model = cls._from_config(hf_config(config, sparse_prediction), attn_implementation="sdpa")
    model.to(device).train()
    groups = [
        {
            "params": [p for n, p in model.named_parameters() if not any(k in n for k in NO_DECAY)],
            "weight_decay": weight_decay,
        },
        {"params": [p for n, p in model.named_parameters() if any(k in n for k in NO_DECAY)], "weight_decay": 0.0},
    ]
    return model, torch.optim.AdamW(groups, lr=lr, **adamw_kernel(device.type))


def hf_step(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    batch: dict[str, torch.Tensor],
    device: torch.device,
    precision: str,
    max_grad_norm: float = 1.0,
) -> torch.Tensor:
    """The baseline's training step: forward under autocast, backward, clip, AdamW step. Returns the loss."""
    x = hf_inputs({k: v.to(device, non_blocking=True) for k, v in batch.items()})
    with dev.autocast(device, precision):
        loss = model(**x).loss
    if loss is None:  # BertForPreTraining computes its loss only with NSP labels: an MLM-only batch has none
        raise UserError(
            f"the HF baseline's {type(model).__name__} needs NSP labels, and these batches are MLM-only (shards of "
            "`data shards --objective mlm`): build it with hf_pretraining(..., objective='mlm') (BertForMaskedLM), "
            "or use sentence-pair shards"
        )
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm, foreach=None)  # True raises on MPS/HPU
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


@torch.no_grad()  # no autograd graph over (batch, seq, vocab) logits: evaluation must not cost minutes
def hf_mlm_accuracy(model: torch.nn.Module, batches: list[dict[str, torch.Tensor]]) -> float:
    """Masked-LM accuracy of the baseline at the masked slots of `batches`."""
    model.eval()
    ok = n = 0
    for x in batches:
        inputs = hf_inputs(x)  # token types only with NSP labels: ModernBERT and MLM-only rows have none
        labels = inputs.pop("labels")
        inputs.pop("next_sentence_label", None)
        out = model(**inputs)
        # BertForPreTraining's MLM logits are prediction_logits; BertForMaskedLM's and ModernBERT's are logits
        logits = out.prediction_logits if hasattr(out, "prediction_logits") else out.logits
        m = labels != -100
        ok += int((logits.argmax(-1)[m] == labels[m]).sum())
        n += int(m.sum())
    model.train()
    return ok / max(n, 1)
