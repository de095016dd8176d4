"""Pre-training time to accuracy: ours (the product's `train_step`, LAMB) vs the Hugging Face baseline
(`bench.baseline`: `BertForPreTraining` + AdamW in a plain loop), trained from scratch on the same shards until a
held-out masked-LM accuracy target (or a time limit); `tta_from_curves` / `plot_curves` read the curves back.

The step throughput benchmarks are in `bench.step`; see docs/BENCHMARKS.md for what was run.
"""

from __future__ import annotations

import json
import math
import time

import torch

from bertforge import device as dev
from bertforge.bench.baseline import hf_mlm_accuracy, hf_pretraining, hf_step
from bertforge.errors import UserError
from bertforge.model import BertConfig, build_model
from bertforge.optim.lamb import build_optimizer
from bertforge.optim.schedule import lr_at
from bertforge.runtime.metrics import plot_lines, read_jsonl
from bertforge.runtime.step import TrainStep, set_lr
from bertforge.runtime.step import train_step as product_step
from bertforge.train.config import OBJECTIVE_TASKS


def _tta_side(impl: str, config, base_lr: float | None, precision: str, objective: str = "mlm_nsp"):
    """(lr, schedule, one-update function) for a side of `time_to_accuracy`: ours is the product's step with LAMB,
    the baseline `hf_step` with AdamW. `objective`: the shards' (`ShardSet.objective`); on MLM-only shards ours
    has no NSP head (train.objective mlm) and the baseline is `BertForMaskedLM`: the NSP models get no loss
    without NSP labels."""
    cpu = torch.device("cpu")
    if impl == "ours":
        model: torch.nn.Module = build_model(config, OBJECTIVE_TASKS[objective])
        lr = base_lr or 5e-3
        step = TrainStep.build(
            model, build_optimizer(model, "lamb", lr, 0.01, (0.9, 0.999), 1e-6, "cpu"), cpu, precision
        )
        return model, step.optimizer, lr, "poly", lambda x: product_step(step, [x], 1)
    model, opt = hf_pretraining(config, cpu, weight_decay=0.01, objective=objective)
    lr = base_lr or 1e-3
    return model, opt, lr, "linear", lambda x: hf_step(model, opt, x, cpu, precision)


def time_to_accuracy(
    impl: str = "ours",
    preset: str = "mini",
    data_dir: str = "",
    eval_dir: str = "",
    target: float = 0.10,
    batch: int = 32,
    lr: float | None = None,
    max_seconds: float = 600,
    eval_every: int = 25,
    eval_batches: int = 10,
    threads: int | None = None,
    precision: str = "fp32",
    horizon: int = 2000,
    curve: str | None = None,
) -> dict[str, float]:
    """Train from scratch on `data_dir` until held-out MLM accuracy on `eval_dir` reaches `target`.

    ours: the product's step with LAMB (lr 5e-3 by default, poly warmup over the first 5% of a `horizon`-step
    schedule), masked-only head; hf: the baseline helper (BertForPreTraining + AdamW, lr 1e-3 by default, linear
    warmup and decay over the same steps). On MLM-only shards (`data shards --objective mlm`) both train the MLM
    head alone: ours as train.objective mlm, the baseline as BertForMaskedLM. Both train and evaluate under the
    same autocast (`precision`).
    Evaluation time is excluded. `curve`: a JSON-lines file that gets (train_s, step, acc) after every
    evaluation. Returns seconds (inf if the limit was reached), steps and final accuracy.
    """
    from bertforge.data.loader import PretrainLoader
    from bertforge.data.loader import eval_batches as eval_iter
    from bertforge.data.shardset import ShardSet

    cpu = torch.device("cpu")
    precision = dev.resolve_precision(precision, cpu)
    with dev.threads(threads):
        torch.manual_seed(0)
        it = PretrainLoader.from_dir(data_dir, batch, batch, 0, 1, seed=0, num_workers=1).iterate()
        evals = list(eval_iter(eval_dir, batch, max_batches=eval_batches))
        shards = ShardSet.open(data_dir)
        vocab = shards.vocab_size or _vocab_from_shards(data_dir, 8)
        config = BertConfig.from_preset(preset, vocab_size=vocab, max_position_embeddings=512)
        model, opt, base_lr, kind, update = _tta_side(impl, config, lr, precision, shards.objective)
        train_s, step, acc = 0.0, 0, 0.0
        while train_s < max_seconds:
            t0 = time.perf_counter()
            for _ in range(eval_every):
                step += 1
                set_lr(opt, lr_at(step, base_lr, horizon, 0.05, kind))
                update(next(it))
            train_s += time.perf_counter() - t0
            with dev.autocast(cpu, precision):
                acc = _mlm_accuracy(model, evals) if impl == "ours" else hf_mlm_accuracy(model, evals)
            if curve:
                with open(curve, "a", encoding="utf-8") as f:
                    f.write(json.dumps({"impl": impl, "train_s": round(train_s, 2), "step": step, "acc": acc}) + "\n")
            if acc >= target:
                break
    return {
        "seconds_to_target": train_s if acc >= target else math.inf,
        "steps": float(step),
        "final_eval_mlm_acc": acc,
        "train_s": train_s,
    }


def _vocab_from_shards(data_dir: str, at_least: int) -> int:
    import h5py

    from bertforge.data.shardset import ShardSet

    top = at_least
    for f in ShardSet.open(data_dir).files:
        with h5py.File(f, "r") as h:
            top = max(top, int(h["input_ids"][:].max()) + 1, int(h["masked_lm_ids"][:].max()) + 1)
    return top


@torch.no_grad()
def _mlm_accuracy(model, evals: list[dict]) -> float:
    model.eval()
    ok = n = 0
    for x in evals:
        out = model(**x)
        ok += int(out.mlm_correct)
        n += int(out.mlm_count)
    model.train()
    return ok / max(n, 1)


def tta_from_curves(curve: str, baseline: str = "hf", at_seconds: float | None = None) -> dict[str, float]:
    """Time to accuracy read off the curves `time_to_accuracy(curve=...)` wrote (runs with an unreachable target):
    the target is the held-out accuracy of the baseline's last evaluation at or before `at_seconds` (default: its
    last), and each side's time is that of its first evaluation at or above the target (inf if never)."""

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

    rows = read_jsonl(curve)
    series = {
        impl: ([r["train_s"] for r in rows if r["impl"] == impl], [r["acc"] for r in rows if r["impl"] == impl])
        for impl in dict.fromkeys(r["impl"] for r in rows)
    }
    hline = None if target is None else (target, f"target {target:.4f}")
    plot_lines(series, png, "training seconds (evaluation excluded)", "held-out MLM accuracy", ".", hline)
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
