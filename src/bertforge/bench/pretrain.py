"""Pre-training benchmarks: the full training step, ours vs `transformers.BertForPreTraining` + AdamW.

`train_step` times whole optimizer updates — forward, backward, gradient clipping, optimizer step — on the same
micro-batches for both sides:

- ours: `bertforge.model` (MLM head only at the masked slots, fused QKV, SDPA), LAMB (`bertforge.optim`,
  foreach), the loop's pieces (`device.autocast`, the grad scaler, clip_grad_norm_, the metric sums of
  `train.loop`), as `bertforge pretrain` runs them;
- hf: `transformers.BertForPreTraining` (SDPA attention) with dense MLM labels (-100 off the masked slots) and
  `torch.optim.AdamW` (foreach) in a plain loop — the usual way to pre-train with Hugging Face.

Batches come from real shards (`data_dir`, the first `batch` rows of a seeded loader: the same rows for both
sides) or, without one, random tokens of full length with `masked` predictions. Metrics: seq_per_s and MFU
(training FLOPs of `model.flops.flops_per_sequence` over the measured matmul peak of `device.peak_flops`; the
same FLOP count for both sides, i.e. useful work: HF's dense vocabulary projection is not credited).

`time_to_accuracy` trains both sides on shards until a held-out masked-LM accuracy target (or a time limit)
and reports the seconds it took: see docs/BENCHMARKS.md for what was run.
"""

from __future__ import annotations

import json
import math
import os
import time

import torch

from bertforge import device as dev
from bertforge.bench.harness import SetupCache
from bertforge.runtime.metrics import save_figure
from bertforge.errors import UserError

_CACHE = SetupCache()


def _batches(data_dir: str | None, batch: int, seq: int, masked: int, vocab: int, n: int = 2) -> list[dict]:
    if data_dir:
        from bertforge.data.loader import PretrainLoader

        it = PretrainLoader.from_dir(data_dir, batch, batch, 0, 1, seed=0, num_workers=0).iterate()
        return [next(it) for _ in range(n)]
    out = []
    g = torch.Generator().manual_seed(0)
    for _ in range(n):
        ids = torch.randint(5, vocab, (batch, seq), generator=g)
        ids[:, 0], ids[:, -1] = 2, 3
        pos = torch.stack([torch.randperm(seq - 2, generator=g)[:masked] + 1 for _ in range(batch)]).sort(1).values
        out.append({"input_ids": ids, "token_type_ids": (torch.arange(seq) >= seq // 2).long().expand(batch, seq).clone(),
                    "attention_mask": torch.ones_like(ids), "masked_positions": pos,
                    "masked_labels": torch.randint(5, vocab, (batch, masked), generator=g),
                    "nsp_labels": torch.randint(0, 2, (batch,), generator=g)})
    return out


def _dense_labels(b: dict[str, torch.Tensor]) -> torch.Tensor:
    """HF's MLM labels: the token id at each masked position, -100 elsewhere (slot 0 = empty, never a label)."""
    labels = torch.full_like(b["input_ids"], -100)
    pos, lab = b["masked_positions"], b["masked_labels"]
    valid = pos > 0
    rows = torch.arange(pos.shape[0]).unsqueeze(1).expand_as(pos)
    labels[rows[valid], pos[valid]] = lab[valid]
    return labels


def _setup(impl: str, preset: str, precision: str, batch: int, seq: int, masked: int, data_dir: str | None,
           vocab: int, threads: int | None):
    key = (impl, preset, precision, batch, seq, masked, data_dir, vocab, threads)
    return _CACHE.get(key, lambda: _build(impl, preset, batch, seq, masked, data_dir, vocab))


def _build(impl: str, preset: str, batch: int, seq: int, masked: int, data_dir: str | None, vocab: int):
    from bertforge.model import BertConfig, build_model
    from bertforge.optim.lamb import build_optimizer

    device = dev.resolve_device("cpu")
    batches = _batches(data_dir, batch, seq, masked, vocab)
    seq = batches[0]["input_ids"].shape[1]
    vocab = max(vocab, int(max(b["input_ids"].max() for b in batches)) + 1)
    config = BertConfig.from_preset(preset, vocab_size=vocab, max_position_embeddings=max(seq, 128))
    torch.manual_seed(0)
    if impl == "ours":
        model = build_model(config, "pretraining")
        opt = build_optimizer(model, "lamb", 1e-3, 0.01, (0.9, 0.999), 1e-6, device.type)
        inputs = batches
    elif impl == "hf":
        import transformers

        hf_cfg = transformers.BertConfig(**{k: v for k, v in config.to_dict().items() if k != "model_type"})
        model = transformers.BertForPreTraining._from_config(hf_cfg, attn_implementation="sdpa")
        no_decay = ("bias", "LayerNorm.weight")
        groups = [{"params": [p for n, p in model.named_parameters() if not any(k in n for k in no_decay)],
                   "weight_decay": 0.01},
                  {"params": [p for n, p in model.named_parameters() if any(k in n for k in no_decay)],
                   "weight_decay": 0.0}]
        opt = torch.optim.AdamW(groups, lr=1e-4, foreach=True)
        inputs = [{"input_ids": b["input_ids"], "token_type_ids": b["token_type_ids"],
                   "attention_mask": (b["attention_mask"] != 0).long(), "labels": _dense_labels(b),
                   "next_sentence_label": b["nsp_labels"]} for b in batches]
    else:
        raise ValueError(f"impl must be ours or hf, not {impl!r}")
    model.train()
    return device, config, model, opt, inputs, seq, masked if not data_dir else batches[0]["masked_positions"].shape[1]


def train_step(impl: str = "ours", preset: str = "tiny", precision: str = "fp32", batch: int = 32, seq: int = 128,
               masked: int = 20, steps: int = 5, data_dir: str | None = None, vocab: int = 30522,
               threads: int | None = None) -> dict[str, float]:
    """`steps` full optimizer updates of one micro-batch each; returns seq_per_s and mfu."""
    from bertforge.model.flops import flops_per_sequence
    from bertforge.train.loop import _Window

    with dev.threads(threads):
        device, config, model, opt, inputs, seq, masked = _setup(impl, preset, precision, batch, seq, masked,
                                                                 data_dir, vocab, threads)
        scaler = dev.grad_scaler(device, precision)
        window = _Window(device)
        t0 = time.perf_counter()
        for i in range(steps):
            x = inputs[i % len(inputs)]
            with dev.autocast(device, precision):
                out = model(**x)
            if impl == "ours":
                scaler.scale(out.loss).backward()
                window.add(out, x)  # the loop's metric sums, on the device
                scaler.unscale_(opt)
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
                if torch.isfinite(norm).item():
                    scaler.step(opt)
                scaler.update()
            else:
                out.loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
                opt.step()
            opt.zero_grad(set_to_none=True)
        elapsed = time.perf_counter() - t0
    seq_per_s = steps * batch / elapsed
    flops = flops_per_sequence(config, seq, masked, task="pretraining", training=True)
    return {"seq_per_s": seq_per_s, "mfu": flops * seq_per_s / dev.peak_flops(device, precision)}


def time_to_accuracy(impl: str = "ours", preset: str = "mini", data_dir: str = "", eval_dir: str = "",
                     target: float = 0.10, batch: int = 32, lr: float | None = None, max_seconds: float = 600,
                     eval_every: int = 25, eval_batches: int = 10, threads: int | None = None,
                     precision: str = "fp32", horizon: int = 2000, curve: str | None = None) -> dict[str, float]:
    """Train from scratch on `data_dir` until held-out MLM accuracy on `eval_dir` reaches `target`.

    ours: LAMB (lr 5e-3 by default, poly warmup over the first 5% of a `horizon`-step schedule), masked-only
    head; hf: BertForPreTraining + AdamW (lr 1e-3 by default, linear warmup and decay over the same steps),
    plain loop. Both train and evaluate under the same autocast (`precision`). Evaluation time is excluded.
    `curve`: a JSON-lines file that gets (train_s, step, acc) after every evaluation. Returns seconds (inf if
    the limit was reached), steps and final accuracy.
    """
    from bertforge.data.loader import PretrainLoader, eval_batches as eval_iter
    from bertforge.data.shardset import ShardSet
    from bertforge.model import BertConfig, build_model
    from bertforge.optim.lamb import build_optimizer
    from bertforge.optim.schedule import lr_at

    cpu = torch.device("cpu")
    precision = dev.resolve_precision(precision, cpu)
    with dev.threads(threads):
        torch.manual_seed(0)
        loader = PretrainLoader.from_dir(data_dir, batch, batch, 0, 1, seed=0, num_workers=1)
        it = loader.iterate()
        evals = list(eval_iter(eval_dir, batch, max_batches=eval_batches))
        vocab = ShardSet.open(data_dir).vocab_size or _vocab_from_shards(data_dir, 8)
        config = BertConfig.from_preset(preset, vocab_size=vocab, max_position_embeddings=512)
        if impl == "ours":
            model = build_model(config, "pretraining")
            base_lr = lr or 5e-3
            opt = build_optimizer(model, "lamb", base_lr, 0.01, (0.9, 0.999), 1e-6, "cpu")
            kind = "poly"
        else:
            import transformers

            hf_cfg = transformers.BertConfig(**{k: v for k, v in config.to_dict().items() if k != "model_type"})
            model = transformers.BertForPreTraining._from_config(hf_cfg, attn_implementation="sdpa")
            base_lr = lr or 1e-3
            opt = torch.optim.AdamW(model.parameters(), lr=base_lr, weight_decay=0.01, foreach=True)
            kind = "linear"
        train_s, step, acc = 0.0, 0, 0.0
        while train_s < max_seconds:
            t0 = time.perf_counter()
            for _ in range(eval_every):
                step += 1
                for g in opt.param_groups:
                    g["lr"] = lr_at(step, base_lr, horizon, 0.05, kind)
                x = next(it)
                with dev.autocast(cpu, precision):
                    if impl == "ours":
                        loss = model(**x).loss
                    else:
                        loss = model(input_ids=x["input_ids"], token_type_ids=x["token_type_ids"],
                                     attention_mask=(x["attention_mask"] != 0).long(), labels=_dense_labels(x),
                                     next_sentence_label=x["nsp_labels"]).loss
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
                opt.step()
                opt.zero_grad(set_to_none=True)
            train_s += time.perf_counter() - t0
            with dev.autocast(cpu, precision):
                acc = _mlm_accuracy(model, impl, evals)
            if curve:
                with open(curve, "a", encoding="utf-8") as f:
                    f.write(json.dumps({"impl": impl, "train_s": round(train_s, 2), "step": step, "acc": acc}) + "\n")
            if acc >= target:
                break
    return {"seconds_to_target": train_s if acc >= target else math.inf, "steps": float(step),
            "final_eval_mlm_acc": acc, "train_s": train_s}


def _vocab_from_shards(data_dir: str, at_least: int) -> int:
    import h5py

    from bertforge.data.shardset import ShardSet

    top = at_least
    for f in ShardSet.open(data_dir).files:
        with h5py.File(f, "r") as h:
            top = max(top, int(h["input_ids"][:].max()) + 1, int(h["masked_lm_ids"][:].max()) + 1)
    return top


@torch.no_grad()
def _mlm_accuracy(model, impl: str, evals: list[dict]) -> float:
    model.eval()
    ok = n = 0
    for x in evals:
        if impl == "ours":
            out = model(**x)
            ok += int(out.mlm_correct)
            n += int(out.mlm_count)
        else:
            labels = _dense_labels(x)
            logits = model(input_ids=x["input_ids"], token_type_ids=x["token_type_ids"],
                           attention_mask=(x["attention_mask"] != 0).long()).prediction_logits
            m = labels != -100
            ok += int((logits.argmax(-1)[m] == labels[m]).sum())
            n += int(m.sum())
    model.train()
    return ok / max(n, 1)


def tta_from_curves(curve: str, baseline: str = "hf", at_seconds: float | None = None) -> dict[str, float]:
    """Time to accuracy read off the curves `time_to_accuracy(curve=...)` wrote (runs with an unreachable target):
    the target is the held-out accuracy of the baseline's last evaluation at or before `at_seconds` (default: its
    last), and each side's time is that of its first evaluation at or above the target (inf if never)."""
    from bertforge.runtime.metrics import read_jsonl

    by: dict[str, list[dict]] = {}
    for r in read_jsonl(curve):
        by.setdefault(r["impl"], []).append(r)
    if baseline not in by:
        raise UserError(f"{curve}: no evaluations of {baseline!r}; run benchmarks/pretrain_tta.yml to write it")
    base = [r for r in by[baseline] if at_seconds is None or r["train_s"] <= at_seconds]
    target = base[-1]["acc"]
    out: dict[str, float] = {"target": target}
    for impl, rs in by.items():
        hit = next((r for r in rs if r["acc"] >= target), None)
        out[f"{impl}_seconds"] = hit["train_s"] if hit else math.inf
        out[f"{impl}_steps"] = hit["step"] if hit else math.inf
    others = [k for k in by if k != baseline]
    for impl in others:
        out[f"{baseline}_over_{impl}"] = out[f"{baseline}_seconds"] / out[f"{impl}_seconds"]
    return out


def plot_curves(curve: str, png: str, target: float | None = None) -> str:
    """Held-out MLM accuracy against training seconds for each side of a curve file, as a PNG (atomic)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bertforge.runtime.metrics import read_jsonl

    rows = read_jsonl(curve)
    fig, ax = plt.subplots(figsize=(7, 4))
    for impl in dict.fromkeys(r["impl"] for r in rows):
        pts = [(r["train_s"], r["acc"]) for r in rows if r["impl"] == impl]
        ax.plot(*zip(*pts), marker=".", label=impl)
    if target is not None:
        ax.axhline(target, color="grey", linestyle="--", label=f"target {target:.4f}")
    ax.set_xlabel("training seconds (evaluation excluded)")
    ax.set_ylabel("held-out MLM accuracy")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    save_figure(fig, png)
    return png


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="time to accuracy from time_to_accuracy's curve file")
    ap.add_argument("curve", help="JSON-lines curve file (time_to_accuracy curve=...)")
    ap.add_argument("--at-seconds", type=float, default=None, help="the baseline's accuracy at this time is the target")
    ap.add_argument("--png", default=None, help="also plot both curves and the target to this PNG")
    a = ap.parse_args()
    res = tta_from_curves(a.curve, at_seconds=a.at_seconds)
    if a.png:
        plot_curves(a.curve, a.png, res["target"])
    print(json.dumps(res, indent=1))
