"""`bertforge bench --spec FILE.yml [--only NAME] [--json OUT] [--md OUT] [--repeat N]
[--interleave | --concurrent] [--stop-after S] [--resume]`; `bertforge bench --show REPORT.json [--md OUT]`."""

from __future__ import annotations

import argparse
import contextlib
import math
from pathlib import Path
from typing import Any

from bertforge.errors import UserError
from bertforge.runtime.io import read_json_object, refuse_empty_paths, writable_file
from bertforge.runtime.signals import sigterm_interrupts


def bench_add(p: argparse.ArgumentParser) -> None:
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--spec", help="benchmark spec: a YAML path or a name in benchmarks/")
    what.add_argument("--show", metavar="REPORT", help="print the tables of a report written by --json (no run)")
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
    p.add_argument(
        "--stop-after",
        type=float,
        default=None,
        metavar="S",
        help="start no benchmark (or interleaved round) after S seconds; the rest are reported as not run",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="keep the finished entries of the --json report of an earlier run of this spec and run the rest",
    )
    p.add_argument(
        "--overwrite", action="store_true", help="replace an existing --json or --md file (refused otherwise)"
    )


def bench_run(args: argparse.Namespace) -> int:
    from bertforge.bench import harness

    # an empty value read as not given: --show "" ran no spec (a traceback), --json/--md "" wrote no file, and
    # --only "" (contained in every name) ran every benchmark
    flags = [("--spec", args.spec), ("--show", args.show), ("--json", args.json_out), ("--md", args.md_out)]
    refuse_empty_paths([*flags, *(("--only", name) for name in args.only or [])])
    _check_outputs(args)
    if args.show:
        _refuse_run_flags(args)
        report = _read_report(Path(args.show), "--show")
        try:
            text = harness.markdown(report)
        except (KeyError, TypeError, AttributeError, ValueError):
            raise UserError(f"--show: {args.show} is not a report written by `bertforge bench --json`") from None
        print(text)
        harness.write_outputs(report, None, args.md_out)
        return 0
    if args.repeat is not None and args.repeat < 1:
        raise UserError(f"--repeat must be at least 1, not {args.repeat}")
    if args.stop_after is not None and not (math.isfinite(args.stop_after) and args.stop_after >= 0):
        raise UserError(f"--stop-after must be a number of seconds >= 0, not {args.stop_after:g}")
    spec = harness.load_spec(args.spec)
    if args.repeat is not None:
        for b in spec.benchmarks:
            b.repeat = args.repeat
    previous = _previous_report(args, spec) if args.resume else None
    # SIGTERM stops as Ctrl-C does: the report so far is kept, and a concurrent run's children are stopped
    with sigterm_interrupts():
        report = _run(args, spec, previous)
    print()
    print(harness.markdown(report))
    harness.write_outputs(report, args.json_out, args.md_out)
    if report["not_run"] and args.json_out:
        print(f"to measure the rest: the same command with --resume (reads {args.json_out})")
    return 0


def _refuse_run_flags(args: argparse.Namespace) -> None:
    """--show runs nothing: a flag that shapes a run would be ignored (--json named no file), so it is refused."""
    given = [
        flag
        for flag, value in (
            ("--json", args.json_out),
            ("--only", args.only),
            ("--repeat", args.repeat),
            ("--interleave/--no-interleave", args.interleave),
            ("--concurrent/--no-concurrent", args.concurrent),
            ("--stop-after", args.stop_after),
            ("--resume", args.resume or None),
        )
        if value is not None
    ]
    if given:
        raise UserError(
            f"{', '.join(given)} shape a run, and --show {args.show} runs nothing (it prints a report's tables, and "
            "--md writes them): drop them, or run a spec with --spec"
        )


def _run(args: argparse.Namespace, spec: Any, previous: dict[str, Any] | None) -> dict[str, Any]:
    from bertforge.bench import harness

    return harness.run_spec(
        spec,
        args.only,
        interleave=args.interleave,
        concurrent=args.concurrent,
        stop_after=args.stop_after,
        previous=previous,
        on_update=lambda partial: harness.write_outputs(partial, args.json_out, args.md_out),
    )


def _check_outputs(args: argparse.Namespace) -> None:
    """--json and --md can be written, before anything is measured (a bad path used to throw the first entry's
    measurement away), and neither replaces a file unasked: a report of other entries, or a user's file. With
    --resume, --json is the earlier report and --md a table this command wrote (it starts with `### `)."""
    outs = [(flag, Path(p)) for flag, p in (("--json", args.json_out), ("--md", args.md_out)) if p]
    if len(outs) == 2 and outs[0][1].resolve() == outs[1][1].resolve():
        raise UserError(f"--json and --md name the same file {outs[0][1]}; give each its own")
    for flag, path in outs:
        writable_file(path, flag)
        if not path.exists() or args.overwrite or (args.resume and not args.show and _ours(flag, path)):
            continue
        raise UserError(f"{flag} {path} exists; pass --overwrite to replace it, or --resume to go on from it")


def _ours(flag: str, path: Path) -> bool:
    """Whether --resume may rewrite `path`: the --json report (checked by `check_resumable`), or a markdown
    table of this command."""
    if flag == "--json":
        return True
    with contextlib.suppress(OSError, UnicodeDecodeError):
        return path.read_text(encoding="utf-8").startswith("### ")
    return False


def _previous_report(args: argparse.Namespace, spec: Any) -> dict[str, Any] | None:
    from bertforge.bench import harness

    if not args.json_out:
        raise UserError("--resume needs --json FILE: the report of the earlier run, rewritten with this one's")
    path = Path(args.json_out)
    if not path.exists():
        return None  # nothing measured yet: a first run, so scripts can always pass --resume
    previous = _read_report(path, "--resume")
    harness.check_resumable(previous, spec, str(path))
    return previous


def _read_report(path: Path, flag: str) -> dict[str, Any]:
    if path.is_dir():
        raise UserError(f"{flag}: {path} is a directory; name a report file written by `bertforge bench --json`")
    if not path.is_file():
        raise UserError(f"{flag}: {path} does not exist")
    return read_json_object(path, "delete it or choose another file", f"{flag}: ")
