"""Model benchmarks: one pre-training optimizer step (forward + backward + AdamW), ours vs Hugging Face.

Both sides get the same architecture (a `MODEL_PRESETS` size, vocab 30522), the same inputs (full rows of
`seq` tokens, `masked` masked positions per row, an NSP label per row), dropout on (train mode), the same
optimizer (torch AdamW, fused where this torch supports it) and the same autocast. Ours takes the masked
positions as `masked_positions`/`masked_labels`; `transformers.BertForPreTraining` (SDPA attention) takes the
equivalent dense `labels` with -100 elsewhere, which is its only interface.

MFU = model FLOPs of useful work (`flops_per_sequence`: the MLM head counted at the masked slots only, for both
sides) x seq/s / the measured matmul peak of `bertforge.device.peak_flops` at the step's precision.
"""

from __future__ import annotations

import time

import torch

from bertforge import device as dev
from bertforge.bench.harness import SetupCache
from bertforge.model import BertConfig, build_model
from bertforge.model.flops import flops_per_sequence

_CACHE = SetupCache()


def _adamw(params) -> torch.optim.Optimizer:
    try:
        params = list(params)
        return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, fused=True)
    except (RuntimeError, TypeError, ValueError):  # fused not supported here: foreach for both sides
        return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, foreach=True)


def _inputs(batch: int, seq: int, masked: int, vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, vocab, (batch, seq), generator=g)
    ids[:, 0] = 101  # [CLS]
    ids[:, -1] = 102  # [SEP]
    types = (torch.arange(seq) >= seq // 2).long().expand(batch, seq).contiguous()
    # `masked` distinct positions in 1..seq-2 per row (never [CLS] at 0), sorted as the data pipeline writes them
    positions = torch.stack([torch.randperm(seq - 2, generator=g)[:masked] + 1 for _ in range(batch)]).sort(1).values
    labels = torch.randint(1000, vocab, (batch, masked), generator=g)
    dense = torch.full((batch, seq), -100, dtype=torch.long).scatter(1, positions, labels)
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": torch.ones_like(ids),
            "masked_positions": positions, "masked_labels": labels, "dense_labels": dense,
            "nsp_labels": torch.randint(0, 2, (batch,), generator=g)}


def _setup(impl: str, preset: str, batch: int, seq: int, masked: int, attention: str, compile: bool | str,
           device: torch.device, vocab: int = 30522):
    key = (impl, preset, batch, seq, masked, attention, compile, str(device), vocab)
    return _CACHE.get(key, lambda: _build(impl, preset, batch, seq, masked, attention, compile, device, vocab))


def _build(impl: str, preset: str, batch: int, seq: int, masked: int, attention: str, compile: bool | str,
           device: torch.device, vocab: int):
    dev.empty_cache(device)
    dev.reset_peak_memory(device)
    config = BertConfig.from_preset(preset, vocab_size=vocab)
    torch.manual_seed(0)
    # token ids stay below 30522 even when the embedding table is padded (NVIDIA's 30528)
    x = {k: v.to(device) for k, v in _inputs(batch, seq, masked, min(config.vocab_size, 30522)).items()}
    if impl == "ours":
        model = build_model(config, "pretraining", attention=attention)

        def step_loss(m):
            return m(x["input_ids"], x["attention_mask"], x["token_type_ids"], masked_positions=x["masked_positions"],
                     masked_labels=x["masked_labels"], nsp_labels=x["nsp_labels"]).loss
    elif impl == "hf":
        import transformers

        hf_cfg = transformers.BertConfig(**{k: v for k, v in config.to_dict().items() if k != "model_type"})
        model = transformers.BertForPreTraining._from_config(hf_cfg, attn_implementation="sdpa")

        def step_loss(m):
            return m(input_ids=x["input_ids"], attention_mask=x["attention_mask"], token_type_ids=x["token_type_ids"],
                     labels=x["dense_labels"], next_sentence_label=x["nsp_labels"]).loss
    else:
        raise ValueError(f"impl must be ours or hf, not {impl!r}")
    model.to(device).train()
    # compile: true (inductor default) or a mode name ("reduce-overhead": CUDA graphs)
    runner = torch.compile(model, mode=compile if isinstance(compile, str) else None) if compile else model
    opt = _adamw(model.parameters())
    return config, runner, opt, step_loss


def train_step(impl: str = "ours", preset: str = "tiny", precision: str = "fp32", batch: int = 32, seq: int = 128,
               masked: int = 20, steps: int = 2, attention: str = "auto", compile: bool | str = False,
               device: str = "cpu", vocab: int = 30522) -> dict[str, float]:
    """`steps` optimizer steps of pre-training on one fixed batch; seq/s, ms per step and MFU."""
    where = dev.resolve_device(device)
    config, model, opt, step_loss = _setup(impl, preset, batch, seq, masked, attention, compile, where, vocab)
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        with dev.autocast(where, precision):
            loss = step_loss(model)
        loss.backward()
        opt.step()
    dev.synchronize(where)
    elapsed = time.perf_counter() - t0
    seq_per_s = steps * batch / elapsed
    flops = flops_per_sequence(config, seq, masked) * seq_per_s
    return {"seq_per_s": seq_per_s, "step_ms": 1000 * elapsed / steps,
            "mfu": flops / dev.peak_flops(where, precision), "loss": loss.item()}
