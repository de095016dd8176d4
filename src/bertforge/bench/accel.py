"""Accelerator benchmarks and checks (CUDA and other PyTorch devices): what a CPU cannot show.

- `parity`: our model against `transformers` on the same weights, on the device, in fp32 and under bf16
  autocast, for padded rows, packed rows (vs the same sequences one per row) and every attention kernel.

The spec `benchmarks/accel_pretrain_step.yml` runs it next to `bertforge.bench.step:train_step` (the product's
step at BERT-base/large phase-1 and phase-2 shapes); results are in docs/BENCHMARKS.md.
"""

from __future__ import annotations

import tempfile

import torch

from bertforge import device as dev


def parity(device: str = "auto", preset: str = "tiny", seq: int = 64, batch: int = 4) -> dict[str, float]:
    """Max |ours - transformers| on the device for every attention kernel, fp32 and bf16 autocast, plus the
    packed-vs-padded difference. Raises if a difference is beyond its tolerance, so a benchmark run fails loudly."""
    import transformers

    from bertforge.model.hf_interop import load_pretrained

    d = dev.resolve_device(device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    hf_cfg = transformers.BertConfig(
        vocab_size=1000,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=512,
        max_position_embeddings=512,
    )
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
                mlm_ref = ref.prediction_logits.gather(
                    1, pos[..., None].expand(-1, -1, ref.prediction_logits.shape[-1])
                )
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
            diff_p = max(
                (packed[0, :la] - single[0, :la]).abs().max().item(),
                (packed[0, la : la + lb] - single[1, :lb]).abs().max().item(),
            )
            out[f"{attention}_packed_maxdiff"] = diff_p
            if diff_p > 1e-4:
                raise AssertionError(f"{attention} packed vs padded on {d}: max diff {diff_p:.3g}")
    return out
