"""The `bertforge` command line: one dispatch table.

Each command holds two functions: `add(parser)` declares the arguments and `run(args)` does the work and
returns an exit status. The handler modules are imported here directly (so tools and readers see them) and
import nothing heavy at module level: torch, transformers, h5py and the like load inside the run functions,
and only the chosen command's `add` runs, so `bertforge --help` stays instant (tests/test_cli.py checks that
importing this module imports no torch). A `UserError` (bad path, bad value, corrupt file) is printed as one
line, exit status 2; argparse errors are one line too.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bertforge import info
from bertforge.bench import cli as bench_cli
from bertforge.data import cli as data_cli
from bertforge.data import pack_cli
from bertforge.errors import UserError
from bertforge.finetune import cli as finetune_cli
from bertforge.runtime.signals import Terminated, interrupts_kept
from bertforge.serve import cli as serve_cli
from bertforge.train import cli as train_cli


@dataclass(frozen=True)
class Command:
    name: str
    add: Callable[[argparse.ArgumentParser], None]
    """Declares the command's arguments."""
    run: Callable[[argparse.Namespace], int]
    """Does the work; returns the exit status."""
    help: str


COMMANDS: list[Command] = [
    Command(
        "info",
        info.info_add,
        info.info_run,
        "environment: versions, devices, bf16 support, threads, measured matmul peak",
    ),
    Command(
        "data",
        data_cli.data_add,
        data_cli.data_run,
        "corpus -> documents -> vocab -> pre-training shards; inspect shards",
    ),
    Command("pack", pack_cli.pack_add, pack_cli.pack_run, "histogram-pack pre-training shards (SPFHP/LPFHP/NNLSHP)"),
    Command(
        "pretrain",
        train_cli.pretrain_add,
        train_cli.pretrain_run,
        "two-phase BERT pre-training (LAMB, bf16/fp16, DDP, resume)",
    ),
    Command(
        "finetune", finetune_cli.finetune_add, finetune_cli.finetune_run, "fine-tune on SQuAD v1.1/v2.0 or a GLUE task"
    ),
    Command(
        "score",
        finetune_cli.score_add,
        finetune_cli.score_run,
        "score a SQuAD predictions file with the official metric",
    ),
    Command("export", serve_cli.export_add, serve_cli.export_run, "export a model as a Hugging Face directory or ONNX"),
    Command(
        "serve",
        serve_cli.serve_add,
        serve_cli.serve_run,
        "serve a model with NVIDIA Triton (PyTriton), dynamic batching",
    ),
    Command("predict", serve_cli.predict_add, serve_cli.predict_run, "send requests to a running `bertforge serve`"),
    Command(
        "bench", bench_cli.bench_add, bench_cli.bench_run, "run a benchmark spec: ours vs the baseline, in one run"
    ),
]


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's default in --help, except where there is none to show (None) or the help says it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default is None or "default" in text.lower():
            return text
        return super()._get_help_string(action)


class ArgumentParser(argparse.ArgumentParser):
    """argparse with defaults shown in --help and errors on one line."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # noqa: D401 - argparse API
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(selected: str | None = None) -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="bertforge",
        description="BERT pre-training and fine-tuning: data, packing, LAMB pre-training, SQuAD/GLUE, export, serving.",
        epilog="Run `bertforge COMMAND --help` for a command's options. Docs: docs/ in the repository.",
    )
    parser.add_argument("--version", action="version", version=f"bertforge {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=ArgumentParser)
    for cmd in COMMANDS:
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        if cmd.name == selected:  # only the chosen command's arguments: some `add`s import their stage's module
            cmd.add(p)
            p.set_defaults(_run=cmd.run)
    return parser


def _version() -> str:
    from bertforge import __version__

    return __version__


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    names = {c.name for c in COMMANDS}
    selected = next((a for a in argv if not a.startswith("-")), None)
    try:
        parser = build_parser(selected if selected in names else None)  # imports torch: seconds
    except KeyboardInterrupt:  # Ctrl-C while it loads: one line, as later, not an import's traceback
        print(f"bertforge {selected}: interrupted" if selected else "bertforge: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
    if not argv:
        parser.print_help()
        return 0
    args = parser.parse_args(argv)
    if not hasattr(args, "_run"):
        parser.print_help()
        return 0
    try:
        with interrupts_kept():  # Ctrl-C in a destructor (h5py's) stops the command too
            return int(args._run(args) or 0)
    except UserError as e:
        print(f"bertforge {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM where a command turns it into one (`sigterm_interrupts`)
        print(f"bertforge {args.command}: interrupted", file=sys.stderr)
        return 128 + (signal.SIGTERM if isinstance(e, Terminated) else signal.SIGINT)
    except BrokenPipeError:
        # `bertforge ... | head`: not an error; keep Python from complaining at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
