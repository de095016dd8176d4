"""`bertforge pack`: histogram-pack NVIDIA-format pre-training shards into packed shards (DESIGN §3.3)."""

from __future__ import annotations

import argparse


def pack_add(parser: argparse.ArgumentParser) -> None:
    from bertforge.data.packing_algorithms import ALGORITHMS  # local: it imports numpy (`bertforge --help`)

    parser.add_argument("--in", dest="input_dir", required=True, help="directory of NVIDIA-format (masked) shards")
    parser.add_argument("--out", dest="output_dir", required=True, help="directory for the packed shards")
    parser.add_argument(
        "--algorithm",
        choices=list(ALGORITHMS),
        default="lpfhp",
        help="spfhp / lpfhp: greedy, well under a second; nnlshp: least squares, tighter at small "
        "K, seconds to minutes (cost depends on the sequence length, not on the data size)",
    )
    parser.add_argument("--max-per-pack", type=int, default=3, help="K: at most this many sequences per row")
    parser.add_argument("--seed", type=int, default=12345, help="seed of the sample-to-pack assignment and shuffle")
    parser.add_argument("--shards", type=int, default=None, help="number of output shards (default: as many as in)")
    parser.add_argument("--chunk-rows", type=int, default=4096, help="rows read from an input shard at a time")
    parser.add_argument(
        "--buffer-mb", type=int, default=256, help="memory for rows on their way to the output-shard buckets"
    )


def pack_run(args: argparse.Namespace) -> int:
    from bertforge.data.packing import PackConfig, pack_shards
    from bertforge.runtime.io import refuse_empty_paths
    from bertforge.runtime.signals import sigterm_interrupts

    # `--out "$OUT"` with OUT unset: Path("") is the working directory, where the packed shards would land (and
    # --in "" would read the shards found there)
    refuse_empty_paths((("--in", args.input_dir), ("--out", args.output_dir)))
    cfg = PackConfig(
        input_dir=args.input_dir,
        output_dir=args.output_dir,
        algorithm=args.algorithm,
        max_per_pack=args.max_per_pack,
        seed=args.seed,
        shards=args.shards,
        chunk_rows=args.chunk_rows,
        buffer_mb=args.buffer_mb,
    )
    with sigterm_interrupts():  # SIGTERM ends as Ctrl-C does: one line, exit 143, the same command resumes
        meta = pack_shards(cfg)
    print(
        f"{meta['sequences']} sequences in {meta['packs']} packs: {meta['avg_seq_per_sample']:.3f} per row, "
        f"padding {meta['padding_fraction_before']:.1%} -> {meta['padding_fraction_after']:.1%}, "
        f"theoretical speed-up {meta['theoretical_speedup']:.3f}x"
    )
    if meta["packing_efficiency"] < 0.97 and args.algorithm != "nnlshp":
        # the greedy algorithms are weak at small K on Wikipedia-shaped data (docs/packing.md)
        print(
            f"hint: {meta['packing_efficiency']:.1%} efficiency; --algorithm nnlshp (slower, independent of the "
            "data size) or a larger --max-per-pack usually packs tighter"
        )
    return 0
