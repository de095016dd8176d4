"""Accelerator benchmarks and checks (CUDA and other PyTorch devices): what a CPU cannot show.

- `parity`: our model against `transformers` on the same weights, on the device, in fp32 and under bf16
  autocast, for padded rows, packed rows (vs the same sequences one per row) and every attention kernel.
- `train_step`: a pre-training optimizer step (forward + backward + optimizer) of BERT-base/large at phase-1
  (seq 128, 20 masked) and phase-2 (seq 512, 80 masked) shapes, ours vs `transformers.BertForPreTraining`
  (SDPA) with the same optimizer and autocast, seq/s and MFU against the measured matmul peak.

The spec `benchmarks/accel_pretrain_step.yml` runs these; results are in docs/BENCHMARKS.md.
"""

from __future__ import annotations

import tempfile
import time
from typing import Any

import torch

from bertforge import device as dev
from bertforge.model import BertConfig, build_model
from bertforge.model.flops import flops_per_sequence

_CACHE: dict[tuple, Any] = {}


def _inputs(batch: int, seq: int, masked: int, vocab: int, device: torch.device, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, vocab, (batch, seq), generator=g)
    ids[:, 0], ids[:, -1] = 101, 102
    types = (torch.arange(seq) >= seq // 2).long().expand(batch, seq).contiguous()
    positions = torch.stack([torch.randperm(seq - 2, generator=g)[:masked] + 1 for _ in range(batch)]).sort(1).values
    labels = torch.randint(1000, vocab, (batch, masked), generator=g)
    dense = torch.full((batch, seq), -100, dtype=torch.long).scatter(1, positions, labels)
    x = {"input_ids": ids, "token_type_ids": types, "attention_mask": torch.ones_like(ids),
         "masked_positions": positions, "masked_labels": labels, "dense_labels": dense,
         "nsp_labels": torch.randint(0, 2, (batch,), generator=g)}
    return {k: v.to(device) for k, v in x.items()}


def _optimizer(params, device: torch.device):
    kind = "fused" if device.type == "cuda" else "foreach"
    return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, **{kind: True})


def _setup(impl, preset, batch, seq, masked, attention, compile, device_spec):
    key = (impl, preset, batch, seq, masked, attention, compile, device_spec)
    if key in _CACHE:
        return _CACHE[key]
    _CACHE.clear()
    device = dev.resolve_device(device_spec)
    dev.empty_cache(device)
    dev.reset_peak_memory(device)
    config = BertConfig.from_preset(preset, vocab_size=30528)  # padded to a multiple of 8 as NVIDIA does
    torch.manual_seed(0)
    x = _inputs(batch, seq, masked, 30522, device)
    if impl == "ours":
        model = build_model(config, "pretraining", attention=attention).to(device)

        def step_loss(m):
            return m(x["input_ids"], x["attention_mask"], x["token_type_ids"], masked_positions=x["masked_positions"],
                     masked_labels=x["masked_labels"], nsp_labels=x["nsp_labels"]).loss
    else:
        import transformers

        hf_cfg = transformers.BertConfig(**{k: v for k, v in config.to_dict().items() if k != "model_type"})
        model = transformers.BertForPreTraining._from_config(hf_cfg, attn_implementation="sdpa").to(device)

        def step_loss(m):
            return m(input_ids=x["input_ids"], attention_mask=x["attention_mask"], token_type_ids=x["token_type_ids"],
                     labels=x["dense_labels"], next_sentence_label=x["nsp_labels"]).loss
    model.train()
    runner = torch.compile(model) if compile else model
    opt = _optimizer(model.parameters(), device)
    _CACHE[key] = (device, config, runner, opt, step_loss)
    return _CACHE[key]


def train_step(impl: str = "ours", preset: str = "base", precision: str = "bf16", batch: int = 64, seq: int = 128,
               masked: int = 20, steps: int = 10, attention: str = "auto", compile: bool = False,
               device: str = "auto") -> dict[str, float]:
    """`steps` optimizer steps on one fixed batch: seq/s, tokens/s, ms per step, MFU, peak memory."""
    dev_, config, model, opt, step_loss = _setup(impl, preset, batch, seq, masked, attention, compile, device)
    dev.synchronize(dev_)
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        with dev.autocast(dev_, precision):
            loss = step_loss(model)
        loss.backward()
        opt.step()
    dev.synchronize(dev_)
    elapsed = time.perf_counter() - t0
    seq_per_s = steps * batch / elapsed
    flops = flops_per_sequence(config, seq, masked) * seq_per_s
    return {"seq_per_s": seq_per_s, "tokens_per_s": seq_per_s * seq, "step_ms": 1000 * elapsed / steps,
            "mfu": flops / dev.peak_flops(dev_, precision), "loss": float(loss.item()),
            "peak_mem_gb": dev.max_memory_allocated(dev_) / 2**30}


def parity(device: str = "auto", preset: str = "tiny", seq: int = 64, batch: int = 4) -> dict[str, float]:
    """Max |ours - transformers| on the device for every attention kernel, fp32 and bf16 autocast, plus the
    packed-vs-padded difference. Raises if a difference is beyond its tolerance, so a benchmark run fails loudly."""
    import transformers

    from bertforge.model.hf_interop import load_pretrained

    d = dev.resolve_device(device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    hf_cfg = transformers.BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=512, max_position_embeddings=512)
    torch.manual_seed(0)
    hf = transformers.BertForPreTraining._from_config(hf_cfg, attn_implementation="eager").eval().to(d)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 1000, (batch, seq), generator=g)
    lengths = torch.tensor([seq, seq - 7, seq // 2, 9][:batch])
    mask = (torch.arange(seq)[None] < lengths[:, None]).long()
    types = torch.zeros_like(ids)
    ids, mask, types = ids.to(d), mask.to(d), types.to(d)
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp)
        for attention in ("eager", "sdpa", "varlen"):
            ours, _ = load_pretrained(tmp, "pretraining", attention=attention)
            ours = ours.eval().to(d)
            for precision, tol in (("fp32", 1e-4), ("bf16", 0.15)):
                with torch.inference_mode(), dev.autocast(d, precision):
                    ref = hf(input_ids=ids, attention_mask=mask, token_type_ids=types)
                    hidden_ref = hf.bert(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
                    pos = torch.arange(1, 6, device=d).expand(batch, 5)
                    o = ours(ids, mask, types, masked_positions=pos)
                    h = ours.bert(ids, mask, types)
                real = mask.bool()
                diff_h = (h.float() - hidden_ref.float())[real].abs().max().item()
                mlm_ref = ref.prediction_logits.gather(1, pos[..., None].expand(-1, -1, ref.prediction_logits.shape[-1]))
                diff_mlm = (o.mlm_logits.float().view_as(mlm_ref) - mlm_ref.float()).abs().max().item()
                diff_nsp = (o.nsp_logits.float() - ref.seq_relationship_logits.float()).abs().max().item()
                worst = max(diff_h, diff_mlm, diff_nsp)
                out[f"{attention}_{precision}_maxdiff"] = worst
                if worst > tol:
                    raise AssertionError(f"{attention} {precision} on {d}: max diff {worst:.3g} > {tol}")
            # packed: the first two sequences in one row vs each on its own row
            la, lb = int(lengths[2]), 9
            row_ids = torch.cat([ids[2, :la], ids[3, :lb]])[None]
            row_mask = torch.cat([torch.full((la,), 1), torch.full((lb,), 2)])[None].to(d)
            row_pos = torch.cat([torch.arange(la), torch.arange(lb)])[None].to(d)
            with torch.inference_mode():
                packed = ours.bert(row_ids, row_mask, torch.zeros_like(row_ids), position_ids=row_pos)
                single = ours.bert(ids[2:4], mask[2:4], types[2:4])
            diff_p = max((packed[0, :la] - single[0, :la]).abs().max().item(),
                         (packed[0, la:la + lb] - single[1, :lb]).abs().max().item())
            out[f"{attention}_packed_maxdiff"] = diff_p
            if diff_p > 1e-4:
                raise AssertionError(f"{attention} packed vs padded on {d}: max diff {diff_p:.3g}")
    return out
