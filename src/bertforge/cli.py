"""The `bertforge` command line: one dispatch table.

Each command names a module and two functions in it: `add(parser)` declares the arguments and `run(args)`
does the work and returns an exit status. Only the chosen command's module is imported, so `bertforge
--help` is instant. A `UserError` (bad path, bad value, corrupt file) is printed as one line, exit status 2;
argparse errors are one line too.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from typing import Callable, Sequence

from bertforge.errors import UserError


@dataclass(frozen=True)
class Command:
    name: str
    target: str
    """"module:prefix": the module defines `<prefix>_add(parser)` and `<prefix>_run(args) -> int`."""
    help: str


COMMANDS: list[Command] = [
    Command("info", "bertforge.info:info", "environment: versions, devices, bf16 support, threads, measured matmul peak"),
    Command("data", "bertforge.data.cli:data", "corpus -> documents -> vocab -> pre-training shards; inspect shards"),
    Command("pack", "bertforge.data.pack_cli:pack", "histogram-pack pre-training shards (SPFHP/LPFHP/NNLSHP)"),
    Command("pretrain", "bertforge.train.cli:pretrain", "two-phase BERT pre-training (LAMB, bf16/fp16, DDP, resume)"),
    Command("finetune", "bertforge.finetune.cli:finetune", "fine-tune on SQuAD v1.1/v2.0 or a GLUE task"),
    Command("score", "bertforge.finetune.cli:score", "score a SQuAD predictions file with the official metric"),
    Command("export", "bertforge.serve.cli:export", "export a model as a Hugging Face directory or ONNX"),
    Command("serve", "bertforge.serve.cli:serve", "serve a model with NVIDIA Triton (PyTriton), dynamic batching"),
    Command("predict", "bertforge.serve.cli:predict", "send requests to a running `bertforge serve`"),
    Command("bench", "bertforge.bench.cli:bench", "run a benchmark spec: ours vs the baseline, in one run"),
]


def _available(cmd: Command) -> bool:
    module = cmd.target.partition(":")[0]
    return importlib.util.find_spec(module) is not None


class ArgumentParser(argparse.ArgumentParser):
    """argparse with defaults shown in --help and errors on one line."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", argparse.ArgumentDefaultsHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # noqa: D401 - argparse API
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _resolve(cmd: Command) -> tuple[Callable, Callable]:
    module, _, prefix = cmd.target.partition(":")
    mod = importlib.import_module(module)
    return getattr(mod, f"{prefix}_add"), getattr(mod, f"{prefix}_run")


def build_parser(selected: str | None = None) -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="bertforge",
        description="BERT pre-training and fine-tuning: data, packing, LAMB pre-training, SQuAD/GLUE, export, serving.",
        epilog="Run `bertforge COMMAND --help` for a command's options. Docs: docs/ in the repository.",
    )
    parser.add_argument("--version", action="version", version=f"bertforge {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=ArgumentParser)
    for cmd in COMMANDS:
        if not _available(cmd):
            continue
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        if cmd.name == selected:
            add, run = _resolve(cmd)
            add(p)
            p.set_defaults(_run=run)
    return parser


def _version() -> str:
    from bertforge import __version__

    return __version__


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    names = {c.name for c in COMMANDS}
    selected = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(selected if selected in names else None)
    if not argv:
        parser.print_help()
        return 0
    args = parser.parse_args(argv)
    if not hasattr(args, "_run"):
        parser.print_help()
        return 0
    try:
        return int(args._run(args) or 0)
    except UserError as e:
        print(f"bertforge {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"bertforge {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `bertforge ... | head`: not an error; keep Python from complaining at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
