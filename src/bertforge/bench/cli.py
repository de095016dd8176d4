"""`bertforge bench --spec FILE.yml [--only NAME] [--json OUT] [--md OUT] [--repeat N]
[--interleave | --concurrent]`."""

from __future__ import annotations

import argparse


def bench_add(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spec", required=True, help="benchmark spec: a YAML path or a name in benchmarks/")
    p.add_argument(
        "--only",
        action="append",
        default=None,
        help="run only benchmarks whose name equals or contains this (repeatable)",
    )
    p.add_argument("--json", dest="json_out", default=None, help="write the full report (every sample) as JSON")
    p.add_argument("--md", dest="md_out", default=None, help="write the markdown table to this file")
    p.add_argument("--repeat", type=int, default=None, help="override every benchmark's repeat count")
    p.add_argument(
        "--interleave",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run repeats round-robin across the benchmarks (default: the spec's `interleave`)",
    )
    p.add_argument(
        "--concurrent",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run every benchmark at once, each in its own process (default: the spec's `concurrent`)",
    )


def bench_run(args: argparse.Namespace) -> int:
    from bertforge.bench import harness

    spec = harness.load_spec(args.spec)
    if args.repeat is not None:
        for b in spec.benchmarks:
            b.repeat = max(1, args.repeat)
    report = harness.run_spec(spec, args.only, interleave=args.interleave, concurrent=args.concurrent)
    print()
    print(harness.markdown(report))
    harness.write_outputs(report, args.json_out, args.md_out)
    return 0
