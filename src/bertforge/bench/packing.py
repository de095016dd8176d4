"""Packing benchmarks (specs: benchmarks/packing*.yml): algorithm speed and quality on 16M lengths, peak memory
of `bertforge pack` as the data grows 10x, and training throughput on packed vs unpacked shards.

The length distribution is `bertforge.data.synthetic.wiki_like_lengths`, the parametric imitation of the
published Wikipedia seq-512 histogram (23.4% full-length rows, a log-normal with its mode near 50 tokens, ~51%
padding) that the synthetic data source uses too; its docstring says where the numbers come from.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.bench.data import shards_argv
from bertforge.data import packing as pk
from bertforge.data import packing_algorithms as pa
from bertforge.data import packing_rows as pr
from bertforge.data.synthetic import wiki_like_lengths


def algorithm(
    algorithm: str = "lpfhp", n: int = 16_000_000, max_per_pack: int = 3, seq_len: int = 512, assign: bool = False
) -> dict[str, float]:
    """Histogram + strategy for n lengths (the packing algorithm proper); optionally the index assignment too."""
    lengths = wiki_like_lengths(n, seq_len)  # cached: generated during the untimed warm-up call
    t0 = time.perf_counter()
    hist = pa.length_histogram(lengths, seq_len)
    strategy = pa.pack_histogram(hist, seq_len, max_per_pack, algorithm)
    seconds = time.perf_counter() - t0
    strategy.check(hist)
    out = {
        "pack_s": seconds,
        "efficiency": strategy.efficiency,
        "speedup": n / strategy.packs,
        "padding_before": 1 - lengths.sum(dtype=np.int64) / (n * seq_len),
        "sequences": float(n),
    }
    if assign:
        t1 = time.perf_counter()
        pa.assign_packs(lengths, strategy, np.random.default_rng(0))
        out["assign_s"] = time.perf_counter() - t1
    return out


def _fake_shards(directory: Path, rows: int, shards: int, seq_len: int, max_pred: int) -> None:
    """Input shards of random tokens with Wikipedia-like lengths (written once per size, reused)."""
    from bertforge.data.shards import write_shard

    if (directory / "done").is_file():
        return
    lengths = wiki_like_lengths(rows, seq_len, seed=1)
    rng = np.random.default_rng(1)
    for s, idx in enumerate(np.array_split(np.arange(rows), shards)):
        n = len(idx)
        col = np.arange(seq_len)[None, :]
        real = col < lengths[idx][:, None]
        k = np.minimum(max_pred, np.maximum(1, np.rint(0.15 * lengths[idx]))).astype(int)
        pos = np.where(np.arange(max_pred)[None, :] < k[:, None], np.arange(1, max_pred + 1)[None, :], 0)
        write_shard(
            directory / f"shard_{s}.hdf5",
            {
                "input_ids": np.where(real, rng.integers(1000, 30000, (n, seq_len)), 0).astype(np.int32),
                "input_mask": real.astype(np.int8),
                "segment_ids": (real & (col > 100)).astype(np.int8),
                "masked_lm_positions": pos.astype(np.int32),
                "masked_lm_ids": np.where(pos > 0, 103, 0).astype(np.int32),
                "next_sentence_labels": rng.integers(0, 2, n).astype(np.int8),
            },
        )
    (directory / "done").write_text("ok")


def memory(
    rows: int = 4000,
    rows_per_shard: int = 1000,
    seq_len: int = 512,
    max_pred: int = 80,
    buffer_mb: int = 16,
    workdir: str | None = None,
) -> dict[str, float]:
    """Peak RSS of `bertforge pack` in a fresh process on `rows` input rows, shards of a fixed size (more data
    means more shards, as in real use). Memory should stay near: interpreter + one chunk + the bucket buffer
    (`--buffer-mb`) + one output shard, whatever the number of rows."""
    base = Path(workdir or Path(tempfile.gettempdir()) / "bertforge-bench-packing")
    base.mkdir(parents=True, exist_ok=True)
    src = base / f"in_{rows}_{rows_per_shard}"
    _fake_shards(src, rows, max(1, rows // rows_per_shard), seq_len, max_pred)
    out = Path(tempfile.mkdtemp(dir=base))
    # The child reports its own VmHWM (peak RSS of its address space): ru_maxrss from wait4 would include the
    # parent's RSS at fork time (Linux carries it over exec), i.e. this benchmark's 16M-length arrays.
    child = (
        "import sys; from bertforge.cli import main; rc = main(sys.argv[1:]); "
        "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0]; "
        "print('VMHWM', hwm.split()[1]); sys.exit(rc)"
    )
    cmd = [
        sys.executable,
        "-c",
        child,
        "pack",
        "--in",
        str(src),
        "--out",
        str(out),
        "--chunk-rows",
        "1024",
        "--buffer-mb",
        str(buffer_mb),
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode:
        raise RuntimeError(f"bertforge pack failed: {proc.stderr[-2000:]}")
    import shutil

    shutil.rmtree(out, ignore_errors=True)
    hwm_kb = int(next(line.split()[1] for line in proc.stdout.splitlines() if line.startswith("VMHWM")))
    dataset_mb = rows * (seq_len * 6 + max_pred * 8 + 1) / 2**20  # the input arrays, uncompressed
    return {"peak_rss_mb": hwm_kb / 1024, "dataset_mb": dataset_mb, "pack_s": seconds, "rows": float(rows)}


def _batches(directory: str, kind: str, micro_batch: int, count: int, seed: int = 0) -> list[dict[str, Any]]:
    """`count` batches of rows drawn at random from all shards (so their padding is the data set's)."""
    from bertforge.data.shards import read_shard
    from bertforge.data.shardset import ShardSet

    parts = [read_shard(f) for f in ShardSet.open(directory).files]  # benchmark-sized data: fine to read whole
    rows = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    pick = np.random.default_rng(seed).permutation(len(rows["input_ids"]))[: micro_batch * count]
    if len(pick) < micro_batch * count:
        raise ValueError(f"{directory}: fewer than {count} batches of {micro_batch} rows")
    convert = pr.packed_model_inputs if kind == "packed" else pr.unpacked_model_inputs
    out = []
    for b in range(count):
        batch = {k: v[pick[b * micro_batch : (b + 1) * micro_batch]] for k, v in rows.items()}
        inputs = convert(batch)
        inputs["_tokens"] = int((batch["input_mask"] > 0).sum())
        inputs["_seqs"] = int(batch["next_sentence_weights"].sum()) if kind == "packed" else micro_batch
        out.append(inputs)
    return out


def packed_vs_unpacked(
    unpacked_dir: str,
    packed_dir: str,
    preset: str = "mini",
    micro_batch: int = 8,
    steps: int = 4,
    precision: str = "fp32",
    threads: int | None = None,
    device: str = "cpu",
    attention: str = "sdpa",
) -> dict[str, float]:
    """fwd + bwd + LAMB step on batches of `micro_batch` rows from both formats, interleaved step by step (so
    machine load hits both alike); throughput in real tokens/s and sequences/s, and the measured speed-up as a
    fraction of the theoretical one (unpacked rows / packed rows for the same sequences, from packing.json)."""
    import json

    import torch

    from bertforge import device as dev
    from bertforge.model import BertConfig, build_model
    from bertforge.optim.lamb import build_optimizer
    from bertforge.runtime.step import TrainStep, train_step

    if threads:
        torch.set_num_threads(threads)
    meta = json.loads((Path(packed_dir) / pk.METADATA).read_text())
    data = {
        "unpacked": _batches(unpacked_dir, "unpacked", micro_batch, steps + 1),
        "packed": _batches(packed_dir, "packed", micro_batch, steps + 1),
    }
    where = dev.resolve_device(device)
    precision = dev.resolve_precision(precision, where)
    cfg = BertConfig.from_preset(preset, max_position_embeddings=max(512, meta["seq_len"]))
    torch.manual_seed(0)
    runs = {}
    for k in data:  # the product's step, one per format
        model = build_model(cfg, "pretraining", attention=attention).to(where)
        opt = build_optimizer(model, "lamb", 1e-4, 0.01, (0.9, 0.999), 1e-6, where.type)
        runs[k] = TrainStep.build(model, opt, where, precision)
    times: dict[str, list[float]] = {k: [] for k in data}
    tokens = {k: 0 for k in data}
    seqs = {k: 0 for k in data}
    for step in range(steps + 1):  # step 0 warms up both
        for kind in ("unpacked", "packed") if step % 2 == 0 else ("packed", "unpacked"):
            batch = dict(data[kind][step])
            n_tok, n_seq = batch.pop("_tokens"), batch.pop("_seqs")
            batch = {n: t.to(where) for n, t in batch.items()}
            dev.synchronize(where)
            t0 = time.perf_counter()
            train_step(runs[kind], [batch], 1)
            dev.synchronize(where)
            dt = time.perf_counter() - t0
            if step:
                times[kind].append(dt)
                tokens[kind] += n_tok
                seqs[kind] += n_seq
    # every step of both formats does the same work (micro_batch rows of seq_len); the median step time is
    # robust to the load spikes of a shared machine. Throughput = mean real tokens per step / median step time.
    step_s = {k: float(np.median(v)) for k, v in times.items()}
    tps = {k: tokens[k] / steps / step_s[k] for k in data}
    speedup = tps["packed"] / tps["unpacked"]
    # the same work per row in both formats: the most packing can give is the ratio of real tokens per row
    # of the batches fed (≈ the data set's theoretical speed-up, which is reported too)
    allowed = tokens["packed"] / tokens["unpacked"]
    return {
        "unpacked_tokens_per_s": tps["unpacked"],
        "packed_tokens_per_s": tps["packed"],
        "unpacked_seq_per_s": seqs["unpacked"] / steps / step_s["unpacked"],
        "packed_seq_per_s": seqs["packed"] / steps / step_s["packed"],
        "unpacked_step_s": step_s["unpacked"],
        "packed_step_s": step_s["packed"],
        "speedup": speedup,
        "theoretical_speedup_batches": allowed,
        "theoretical_speedup_dataset": meta["theoretical_speedup"],
        "fraction_of_theoretical": speedup / allowed,
        "padding_before": meta["padding_fraction_before"],
        "padding_after": meta["padding_fraction_after"],
    }


def wikitext_shards(
    workdir: str | None = None,
    seq_len: int = 512,
    max_pred: int = 80,
    dupe_factor: int = 5,
    algorithm: str = "lpfhp",
    max_per_pack: int = 3,
) -> tuple[Path, Path]:
    """Seq-512 NVIDIA-format shards of WikiText-2 (valid + test, ../shared/data) with the BERT uncased vocab,
    made by `bertforge data docs/shards`, and their packed version by `bertforge pack`; cached in workdir."""
    from bertforge.cli import main

    data = Path(os.environ.get("BERTFORGE_SHARED_DATA", Path(__file__).resolve().parents[3].parent / "shared" / "data"))
    base = Path(workdir or Path(tempfile.gettempdir()) / "bertforge-bench-packing") / f"wikitext2_{seq_len}"
    unpacked, packed = base / "shards", base / f"packed_{algorithm}_k{max_per_pack}"
    if not (unpacked / "manifest.json").is_file():
        for i, src in enumerate(("tokens/wiki.valid.tokens", "raw/wiki.test.raw")):
            if main(
                [
                    "data",
                    "docs",
                    "--source",
                    str(data / "wikitext-2" / src),
                    "--out",
                    str(base / f"docs{i}"),
                    "--shards",
                    "2",
                    "--workers",
                    "1",
                ]
            ):
                raise RuntimeError("bertforge data docs failed")
        vocab = data / "bert_vocab" / "bert-base-uncased-vocab.txt"
        if main(shards_argv(base / "docs*" / "*.txt", vocab, unpacked, seq_len, max_pred, dupe_factor, 4, 1)):
            raise RuntimeError("bertforge data shards failed")
    if not (packed / pk.METADATA).is_file() and main(
        [
            "pack",
            "--in",
            str(unpacked),
            "--out",
            str(packed),
            "--algorithm",
            algorithm,
            "--max-per-pack",
            str(max_per_pack),
        ]
    ):
        raise RuntimeError("bertforge pack failed")
    return unpacked, packed


def wikitext_training(
    preset: str = "mini",
    micro_batch: int = 4,
    steps: int = 8,
    precision: str = "fp32",
    threads: int | None = 1,
    algorithm: str = "lpfhp",
    max_per_pack: int = 3,
    workdir: str | None = None,
    device: str = "cpu",
    attention: str = "sdpa",
) -> dict[str, float]:
    """`packed_vs_unpacked` on WikiText-2 seq-512 shards (made on first use)."""
    unpacked, packed = wikitext_shards(workdir, algorithm=algorithm, max_per_pack=max_per_pack)
    return packed_vs_unpacked(
        str(unpacked), str(packed), preset, micro_batch, steps, precision, threads, device, attention
    )
