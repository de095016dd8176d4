"""Training-step benchmarks: ours is the product's own step (`bertforge.runtime.step.train_step`, built with
`TrainStep.build` as `bertforge pretrain` builds it), the baseline `bench.baseline.hf_step`, on the same
micro-batches, the same autocast and device.

- ours: `bertforge.model` (MLM head at the masked slots only, fused QKV, SDPA/varlen), LAMB (foreach) or AdamW,
  the grad scaler, global clipping and the non-finite check of the real step;
- hf: `transformers.BertForPreTraining` (SDPA) with dense MLM labels and AdamW in a plain loop.

On MLM-only shards (`data shards --objective mlm`) both train the MLM head alone, as `train.objective` mlm does:
ours without the NSP head, the baseline as `transformers.BertForMaskedLM` (what run_mlm.py trains).

ModernBERT presets (`modernbert-*`) train the MLM head alone (no NSP) against `transformers.ModernBertForMaskedLM`
(`hf_sparse`: its `sparse_prediction` option, off by default in transformers), on rows of varied length (padding
from `min_len` up, `mask_rate` of each row's real tokens masked: MLM-only batches before packing).

Batches come from real shards (`data_dir`: the first rows of a seeded loader, the same for both sides) or, without
one, full rows of random tokens with `masked` predictions. seq_per_s and MFU (training FLOPs of
`model.flops.flops_per_sequence`, the same useful work credited to both sides, over the measured matmul peak).
"""

from __future__ import annotations

import time

import torch

from bertforge import device as dev
from bertforge.bench.baseline import hf_pretraining, hf_step
from bertforge.bench.harness import SetupCache
from bertforge.data.loader import with_segments
from bertforge.data.shardset import ShardSet
from bertforge.model import MODEL_PRESETS, BertConfig, build_model
from bertforge.model.flops import flops_per_sequence
from bertforge.optim.lamb import build_optimizer
from bertforge.runtime.step import TrainStep, wants_segments
from bertforge.runtime.step import train_step as product_step
from bertforge.train.config import OBJECTIVE_TASKS

_CACHE = SetupCache()


def random_batches(batch: int, seq: int, masked: int, vocab: int, n: int = 2, seed: int = 0) -> list[dict]:
    """Full rows of random tokens: [CLS] ... [SEP], two segments, `masked` sorted distinct positions."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(1000, vocab, (batch, seq), generator=g)
        ids[:, 0], ids[:, -1] = 101, 102
        pos = torch.stack([torch.randperm(seq - 2, generator=g)[:masked] + 1 for _ in range(batch)]).sort(1).values
        out.append(
            {
                "input_ids": ids,
                "token_type_ids": (torch.arange(seq) >= seq // 2).long().expand(batch, seq).clone(),
                "attention_mask": torch.ones_like(ids),
                "masked_positions": pos,
                "masked_labels": torch.randint(1000, vocab, (batch, masked), generator=g),
                "nsp_labels": torch.randint(0, 2, (batch,), generator=g),
            }
        )
    return out


def mlm_batches(
    batch: int, seq: int, vocab: int, mask_rate: float = 0.3, min_len: int | None = None, n: int = 2, seed: int = 0
) -> list[dict]:
    """MLM-only rows (no token types, no NSP) of lengths uniform in [min_len, seq] (default seq // 4), padded to
    seq; round(mask_rate x length) masked positions per row, in (B, P) slots with 0 = empty."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        lengths = torch.randint(min_len or seq // 4, seq + 1, (batch,), generator=g)
        mask = (torch.arange(seq)[None] < lengths[:, None]).long()  # (B, T)
        ids = torch.randint(1000, vocab, (batch, seq), generator=g) * mask
        counts = [round(mask_rate * int(n_real)) for n_real in lengths]
        pos = torch.zeros(batch, max(counts), dtype=torch.long)  # (B, P)
        for r, (k, n_real) in enumerate(zip(counts, lengths.tolist())):
            pos[r, :k] = (torch.randperm(n_real - 1, generator=g)[:k] + 1).sort().values  # never slot 0
        labels = torch.randint(1000, vocab, pos.shape, generator=g) * (pos > 0)
        out.append({"input_ids": ids, "attention_mask": mask, "masked_positions": pos, "masked_labels": labels})
    return out


def shard_batches(data_dir: str, batch: int, n: int = 2) -> list[dict]:
    from bertforge.data.loader import PretrainLoader

    it = PretrainLoader.from_dir(data_dir, batch, batch, 0, 1, seed=0, num_workers=0).iterate()
    return [next(it) for _ in range(n)]


def _build(impl, preset, precision, batch, seq, masked, data_dir, vocab, attention, compile, device, optimizer, mlm):
    where = dev.resolve_device(device)
    dev.empty_cache(where)
    dev.reset_peak_memory(where)
    modern = MODEL_PRESETS[preset].model_type == "modernbert"
    # the shards' objective picks both sides' heads, as train.objective does for `bertforge pretrain`: MLM-only
    # shards (`data shards --objective mlm`) have no NSP labels, on which the NSP models return no loss
    objective = ShardSet.open(data_dir).objective if data_dir else "mlm_nsp"
    task = "mlm" if modern else OBJECTIVE_TASKS[objective]
    if data_dir:
        inputs = shard_batches(data_dir, batch)
    elif modern:
        inputs = mlm_batches(batch, seq, min(vocab, 30522), mlm["mask_rate"], mlm["min_len"])
    else:
        inputs = random_batches(batch, seq, masked, min(vocab, 30522))
    seq, masked = inputs[0]["input_ids"].shape[1], inputs[0]["masked_positions"].shape[1]
    vocab = max(vocab, int(max(b["input_ids"].max() for b in inputs)) + 1)
    config = BertConfig.from_preset(preset, vocab_size=vocab, max_position_embeddings=max(seq, 512))
    if modern:  # the useful work of varied rows: their mean real length and number of masked slots
        seq = sum(int(b["attention_mask"].sum()) for b in inputs) / (len(inputs) * batch)
        masked = sum(int((b["masked_positions"] > 0).sum()) for b in inputs) / (len(inputs) * batch)
    torch.manual_seed(0)
    if impl == "hf":
        model, opt = hf_pretraining(config, where, sparse_prediction=mlm["hf_sparse"], objective=objective)
        return where, config, (model, opt), inputs, seq, masked, task
    if impl != "ours":
        raise ValueError(f"impl must be ours or hf, not {impl!r}")
    if wants_segments(where, attention, packed="position_ids" in inputs[0], fixed=bool(compile)):
        inputs = [with_segments(b) for b in inputs]  # as the product's loaders give them (runtime.step)
    model = build_model(config, task, attention=attention).to(where).train()
    opt = build_optimizer(
        model, optimizer, 1e-4 if optimizer == "adamw" else 1e-3, 0.01, (0.9, 0.999), 1e-6, where.type
    )
    step = TrainStep.build(model, opt, where, dev.resolve_precision(precision, where), 1.0, compile)
    return where, config, step, inputs, seq, masked, task


def train_step(
    impl: str = "ours",
    preset: str = "tiny",
    precision: str = "fp32",
    batch: int = 32,
    seq: int = 128,
    masked: int = 20,
    steps: int = 2,
    attention: str = "auto",
    compile: bool | str = False,
    device: str = "cpu",
    vocab: int = 30522,
    data_dir: str | None = None,
    optimizer: str = "lamb",
    threads: int | None = None,
    mask_rate: float = 0.3,
    min_len: int | None = None,
    hf_sparse: bool = False,
) -> dict[str, float]:
    """`steps` optimizer updates of one micro-batch each; seq/s, tokens/s, ms per step, MFU, peak memory.
    `mask_rate`, `min_len`, `hf_sparse`: ModernBERT presets only (see the module doc)."""
    mlm = {"mask_rate": mask_rate, "min_len": min_len, "hf_sparse": hf_sparse}
    key = (impl, preset, precision, batch, seq, masked, data_dir, vocab, attention, compile, device, optimizer)
    with dev.threads(threads):
        built = _CACHE.get(key + tuple(mlm.values()), lambda: _build(*key, mlm))
        where, config, runner, inputs, seq, masked, task = built
        precision = dev.resolve_precision(precision, where)
        t0 = time.perf_counter()
        for i in range(steps):
            x = inputs[i % len(inputs)]
            if impl == "hf":
                model, opt = runner  # the baseline's (model, AdamW); ours is a TrainStep
                loss = hf_step(model, opt, x, where, precision)
            else:
                loss = product_step(runner, [x], 1).loss
        dev.synchronize(where)
        elapsed = time.perf_counter() - t0
    seq_per_s = steps * batch / elapsed
    real_tokens = sum(int((b["attention_mask"] != 0).sum()) for b in inputs) / len(inputs)
    return {
        "seq_per_s": seq_per_s,
        "tokens_per_s": seq_per_s * real_tokens / batch,
        "step_ms": 1000 * elapsed / steps,
        "mfu": flops_per_sequence(config, seq, masked, task=task, training=True)
        * seq_per_s
        / dev.peak_flops(where, precision),
        "peak_mem_gb": dev.max_memory_allocated(where) / 2**30,
        "loss": float(loss),
    }
