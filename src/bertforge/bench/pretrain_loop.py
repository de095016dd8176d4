"""The product's own pre-training loop, measured: `bertforge pretrain` runs in a child process (the real entry
point, as a user starts it) and its metrics.jsonl is read back; the Hugging Face baseline
(`bench.baseline`: BertForPreTraining + AdamW in a plain loop) trains on the same data source in the same call.

Both read the synthetic source (`data.input_dir: synthetic`, `bertforge.data.synthetic`) with Wikipedia's
sequence-length histogram for the phase's length, unpacked or packed — never rows that are all full — unless
`data_dir` names real shards. Reported, as medians over the logged windows after `warmup_steps`:
real sequences/s and tokens/s, MFU over real tokens (`train.loop._mfu`), data-wait share, peak device memory,
and the seconds from set-up to the end of the first step (compile included).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bertforge import device as dev
from bertforge.errors import UserError
from bertforge.runtime.metrics import plot_lines, read_jsonl


def _data_overrides(
    seq_len: int, max_pred: int, pack: int, pack_algorithm: str, histogram: str, data_dir: str | None
) -> list[str]:
    if data_dir:
        return [f"data.input_dir={data_dir}"]
    return [
        "data.input_dir=synthetic",
        f"data.synthetic_seq_len={seq_len}",
        f"data.synthetic_max_pred={max_pred}",
        f"data.synthetic_pack={pack}",
        f"data.synthetic_pack_algorithm={pack_algorithm}",
        f"data.synthetic_histogram={histogram}",
    ]


def global_sequences(
    micro_batch: int, accum: int, seq_len: int, max_pred: int, pack: int, pack_algorithm: str, histogram: str
) -> int:
    """train.global_batch_size (sequences) for `accum` micro-batches of `micro_batch` rows per update. Packed, a
    row holds avg_seq_per_sample sequences and the loop takes global / avg_seq_per_sample rows, rounded to a
    multiple of the micro-batch (`packed_rows_per_update`): micro x accum sequences would be about half the
    rows at seq 512 (1.8 sequences per row), so the global batch is micro x accum rows' worth of sequences, as
    a multiple of the micro-batch (the config's rule): the nearest one is off by less than half a micro-batch of
    rows, so the loop's rounding gives micro x accum rows."""
    if not pack:
        return micro_batch * accum
    from bertforge.data.synthetic import pack_plan

    plan = pack_plan(seq_len, histogram, pack, max_pred, algorithm=pack_algorithm)
    return micro_batch * max(1, round(accum * plan.avg_seq_per_sample))


def loop_config(
    out: str,
    preset: str,
    seq_len: int,
    max_pred: int,
    pack: int,
    pack_algorithm: str,
    histogram: str,
    micro_batch: int,
    accum: int,
    steps: int,
    log_every: int,
    precision: str,
    device: str,
    data_dir: str | None,
    extra: list[str] | None,
    seed: int,
) -> tuple[str, list[str]]:
    """The preset and `--set` overrides of one `loop` entry (also loaded by a test of every shipped spec, so a
    mistyped key in a GPU spec fails on the CPU)."""
    synthetic_pack = 0 if data_dir else pack  # real shards: packed or not as they were written
    global_batch = global_sequences(micro_batch, accum, seq_len, max_pred, synthetic_pack, pack_algorithm, histogram)
    sets = [
        f"train.output_dir={out}",
        f"train.max_steps={steps}",
        f"train.log_every={log_every}",
        f"train.micro_batch_size={micro_batch}",
        f"train.global_batch_size={global_batch}",
        f"train.precision={precision}",
        f"train.device={device}",
        "train.save_every=0",
        "train.tensorboard=false",
        "train.plot=false",
        "train.init_checkpoint=null",
        "data.eval_dir=null",
        f"train.seed={seed}",
        "model.init_from=null",
        # the entries name every fast path they measure: none is left to the auto defaults (`resolve_auto`), so an
        # entry without extras is the eager step on every machine
        "train.compile=false",
        "train.cuda_graphs=false",
        "optim.compile=false",
        "train.low_precision_layernorm=false",
        *_data_overrides(seq_len, max_pred, pack, pack_algorithm, histogram, data_dir),
        *(extra or []),
    ]
    return f"pretrain_{preset}_{128 if seq_len <= 128 else 512}", sets


def loop(
    preset: str = "base",
    seq_len: int = 128,
    max_pred: int = 20,
    pack: int = 0,
    pack_algorithm: str = "lpfhp",
    histogram: str = "wiki",
    micro_batch: int = 64,
    accum: int = 1,
    steps: int = 80,
    warmup_steps: int = 20,
    log_every: int = 1,
    precision: str = "bf16",
    device: str = "auto",
    data_dir: str | None = None,
    timeout_s: float = 1200,
    extra: list[str] | None = None,
    seed: int = 12345,
    curve: str | None = None,
    cold_compile: bool = False,
) -> dict[str, float]:
    """Run `bertforge pretrain --config pretrain_<preset>_<128|512>` for `steps` updates and summarise;
    `curve`: also copy the run's metrics.jsonl there (loss curves of fast paths against eager); `cold_compile`:
    the child compiles with empty inductor and Triton caches of its own, so first_step_s is a first run's
    (otherwise entries that compile the same graphs share the user's caches)."""
    with tempfile.TemporaryDirectory(prefix="bertforge-loop-") as out:
        config, sets = loop_config(
            out, preset, seq_len, max_pred, pack, pack_algorithm, histogram, micro_batch, accum, steps, log_every,
            precision, device, data_dir, extra, seed,
        )  # fmt: skip
        cmd = [
            sys.executable,
            "-m",
            "bertforge",
            "pretrain",
            "--config",
            config,
            *(x for s in sets for x in ("--set", s)),
        ]
        t0 = time.perf_counter()
        env = dict(os.environ)
        if cold_compile:
            env |= {"TORCHINDUCTOR_CACHE_DIR": f"{out}/inductor", "TRITON_CACHE_DIR": f"{out}/triton"}
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
        except subprocess.TimeoutExpired:  # its message is the whole command line: the cause was cut off in tables
            raise RuntimeError(
                f"bertforge pretrain did not finish within timeout_s={timeout_s:g} s (stopped); raise timeout_s "
                "or lower steps"
            ) from None
        wall = time.perf_counter() - t0
        if proc.returncode:
            # the child's one-line error is its last line: first, since a report's table shows a message's start
            last = next((ln for ln in reversed(proc.stderr.splitlines()) if ln.strip()), "(no output)")
            raise RuntimeError(
                f"bertforge pretrain failed ({proc.returncode}): {last.strip()} -- stderr's end: {proc.stderr[-3000:]}"
            )
        rows = [r for r in read_jsonl(Path(out) / "metrics.jsonl") if "seq_per_s" in r]
        summary = json.loads((Path(out) / "summary.json").read_text())
        if curve:
            Path(curve).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(out) / "metrics.jsonl", curve)
    return {
        **summarise(rows, warmup_steps),
        "first_step_s": float(summary.get("first_step_s") or 0.0),
        "wall_s_child": wall,
    }


def summarise(rows: list[dict[str, Any]], warmup_steps: int) -> dict[str, float]:
    """Medians of the logged windows after the warm-up steps (at least 50 steps' worth is the spec's rule). A
    logged row is a window since the row before it: only windows that start after the warm-up count (with
    log_every 10 and 8 warm-up steps, the row of step 10 also timed steps 1..8, compilation included)."""
    step = lambda r: r.get("step_in_phase", r["step"])  # noqa: E731 (the phase-local step where logged)
    starts = [0, *(step(r) for r in rows[:-1])]  # the step each logged window starts after
    measured = [(start, r) for start, r in zip(starts, rows) if start >= warmup_steps]
    after = [r for _, r in measured]
    if not after:
        raise UserError(
            f"no logged window starts after the {warmup_steps} warm-up steps; raise steps (or lower log_every)"
        )
    med = {
        k: statistics.median(float(r[k]) for r in after if r.get(k) is not None)
        for k in ("seq_per_s", "tokens_per_s", "rows_per_s", "mfu", "data_wait", "peak_mem_gb")
        if any(r.get(k) is not None for r in after)
    }
    # rows per update as run (micro-batches per update x micro-batch): a logged window spans the updates since
    # the row before it
    per_update = [
        float(r["rows_per_s"]) * float(r["window_s"]) / (step(r) - step(prev))
        for prev, r in zip(rows, rows[1:])
        if step(prev) >= warmup_steps and "window_s" in r
    ]
    return {
        **med,
        **({"rows_per_update": statistics.median(per_update)} if per_update else {}),
        "steps_measured": float(step(after[-1]) - measured[0][0]),
        "final_loss": float(after[-1]["loss"]),
    }


def hf_loop(
    preset: str = "base",
    seq_len: int = 128,
    max_pred: int = 20,
    histogram: str = "wiki",
    micro_batch: int = 64,
    steps: int = 60,
    warmup_steps: int = 10,
    precision: str = "bf16",
    device: str = "auto",
) -> dict[str, float]:
    """The baseline in a plain loop on the same synthetic source (unpacked: HF's model reads no packed rows);
    per-step time with a device sync, median after the warm-up."""
    from bertforge.bench.baseline import hf_pretraining, hf_step
    from bertforge.data.synthetic import SyntheticLoader
    from bertforge.model import BertConfig
    from bertforge.model.flops import flops_per_sequence

    if steps <= warmup_steps:  # else a median of no steps, after building the model
        raise UserError(f"hf_loop: steps {steps} must exceed warmup_steps {warmup_steps}: no step would be timed")
    where = dev.resolve_device(device)
    precision = dev.resolve_precision(precision, where)
    config = BertConfig.from_preset(preset, vocab_size=30522, max_position_embeddings=512)
    torch.manual_seed(0)
    model, opt = hf_pretraining(config, where)
    data = SyntheticLoader(
        seq_len=seq_len,
        max_pred=max_pred,
        vocab_size=30522,
        global_batch=micro_batch,
        micro_batch=micro_batch,
        rank=0,
        world_size=1,
        seed=0,
        histogram=histogram,
    ).iterate()
    dev.reset_peak_memory(where)
    times, tokens, masked = [], [], []
    for i in range(steps):
        b = next(data)
        dev.synchronize(where)
        t0 = time.perf_counter()
        hf_step(model, opt, b, where, precision)
        dev.synchronize(where)
        if i >= warmup_steps:
            times.append(time.perf_counter() - t0)
            tokens.append(int((b["attention_mask"] != 0).sum()))
            masked.append(int((b["masked_positions"] != 0).sum()))
    step_s = statistics.median(times)
    seq_per_s = micro_batch / step_s
    mean_len = sum(tokens) / len(tokens) / micro_batch
    flops = flops_per_sequence(config, mean_len, sum(masked) / len(masked) / micro_batch)
    # the CPU tracks no peak: reported as 0 GB it read as measured; `loop` leaves it out there too
    peak = {} if where.type == "cpu" else {"peak_mem_gb": dev.max_memory_allocated(where) / 2**30}
    del model, opt  # hand the device memory back: the next entry's child process needs it
    dev.empty_cache(where)
    return {
        "seq_per_s": seq_per_s,
        "tokens_per_s": seq_per_s * mean_len,
        "mfu": flops * seq_per_s / dev.peak_flops(where, precision),
        **peak,
        "step_ms": 1000 * step_s,
    }


def compare_curves(
    reference: str,
    noise: str,
    fast: list[str],
    png: str | None = None,
    skip_steps: int = 20,
) -> dict[str, float]:
    """Does a fast path track the eager loss? `reference`: the eager run's metrics.jsonl (a `loop(curve=...)`
    copy); `noise`: the eager run with another seed on the same data, whose distance from the reference is the
    bf16 noise band; `fast`: runs with the same seed as the reference and fast paths on. Distance = mean
    |loss difference| over the logged windows after `skip_steps` (each logged loss is already a window's mean).
    A fast run tracks the reference when it is no farther from it than the other seed is (`<name>_over_band`
    ≤ 1). Also draws every curve to `png`."""
    paths = (reference, noise, *fast)
    if len({Path(p).stem for p in paths}) < len(paths):  # one name would stand for two curves (a band of 0)
        raise UserError(f"compare_curves: {', '.join(paths)}: give each curve its own file name (it names its results)")
    curves = {Path(p).stem: _losses(p) for p in paths}
    ref = curves[Path(reference).stem]
    band = _distance(ref, curves[Path(noise).stem], skip_steps)
    out = {"band": band, "reference_final_loss": ref[max(ref)]}
    for path in fast:
        name = Path(path).stem
        out[f"{name}_distance"] = _distance(ref, curves[name], skip_steps)
        out[f"{name}_over_band"] = out[f"{name}_distance"] / band if band else math.inf
    if png:
        series = {name: (list(losses), list(losses.values())) for name, losses in curves.items()}
        plot_lines(series, png, "step", "training loss (MLM + NSP)")
    return out


def _losses(path: str) -> dict[int, float]:
    """step → logged loss of a run's metrics.jsonl."""
    rows = read_jsonl(path)
    losses = {int(r["step"]): float(r["loss"]) for r in rows if r.get("loss") is not None and "seq_per_s" in r}
    if not losses:
        raise UserError(f"{path}: no logged training loss (a bertforge pretrain metrics.jsonl is expected)")
    return losses


def _distance(a: dict[int, float], b: dict[int, float], skip_steps: int) -> float:
    steps = [s for s in a if s in b and s > skip_steps]
    if not steps:
        raise UserError(f"the curves share no logged step after step {skip_steps}: were they logged alike?")
    return sum(abs(a[s] - b[s]) for s in steps) / len(steps)
