"""`bertforge pretrain`: one pre-training phase from a preset or YAML file, with --set overrides."""

from __future__ import annotations

import argparse
import gc
import sys

from bertforge.errors import UserError


def pretrain_add(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default="demo_tiny_128", help="preset name (configs/pretrain/) or a YAML file")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, e.g. --set train.max_steps=100 (repeatable)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from the newest complete checkpoint in train.output_dir/checkpoints",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="train.output_dir holds an earlier run: delete its checkpoints and metrics and start afresh "
        "(without --resume or --overwrite such a directory is refused)",
    )
    p.add_argument(
        "--allow-changed",
        action="store_true",
        help="with --resume: continue although the data (global or micro batch, train.seed, data.input_dir and its "
        "shards, data.chunk_rows, the masking), the schedule (optim.lr, optim.warmup, optim.schedule, "
        "train.max_steps, ...) or the optimizer's settings differ from the checkpoint's run (refused without it; "
        "the refusal names what changed)",
    )
    p.add_argument(
        "--json-summary",
        default=None,
        metavar="FILE",
        help="also write dllogger-compatible JSON lines (NVIDIA DeepLearningExamples format) here",
    )
    p.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="record N steps (after one warm-up step) with torch.profiler into train.output_dir/profile "
        "(trace.json opens in Perfetto or TensorBoard) and print the top kernels by time",
    )
    p.add_argument("--print-config", action="store_true", help="print the resolved config as YAML and exit")
    p.add_argument("--list-keys", action="store_true", help="list every config key with its default and meaning")


def pretrain_run(args: argparse.Namespace) -> int:
    # local: bertforge.config loads yaml; `bertforge --help` imports this module
    from bertforge.config import describe, load_config
    from bertforge.runtime.io import refuse_empty_paths
    from bertforge.train.config import PretrainConfig

    # an empty --json-summary read as not given writes no summary; an empty --config read "" as a directory
    refuse_empty_paths((("--config", args.config), ("--json-summary", args.json_summary)))

    if args.list_keys:
        for key, default, doc in describe(PretrainConfig):
            print(f"{key} = {default}\n    {doc}")
        return 0
    cfg = load_config("pretrain", args.config, args.overrides)
    if args.print_config:
        import yaml

        from bertforge.config import to_dict

        yaml.safe_dump(to_dict(cfg), sys.stdout, sort_keys=False)
        return 0

    from bertforge.runtime import distributed
    from bertforge.runtime.io import writable_dir, writable_file
    from bertforge.runtime.preempt import Preempted
    from bertforge.train.loop import check_output_dir, run_pretrain, start_inputs, unstarted_removed

    if args.profile < 0:
        raise UserError(f"--profile N records N steps; N must be >= 0 (0: no profile), got {args.profile}")
    if args.allow_changed and not args.resume:
        raise UserError("--allow-changed only applies with --resume (it accepts a changed config on resuming)")
    info = distributed.env_info()
    # an earlier run's directory is refused before anything is written (run_pretrain checks it too)
    check_output_dir(cfg.train.output_dir, args.resume, args.overwrite, start_inputs(cfg))
    try:
        with unstarted_removed(cfg.train.output_dir, info.is_main):
            if info.is_main:
                # every output path now, before the model is built: not a traceback at the first write
                if args.json_summary:
                    writable_file(args.json_summary, "--json-summary")
                writable_dir(cfg.train.output_dir, "train.output_dir")
            summary = run_pretrain(
                cfg,
                resume=args.resume,
                json_summary=args.json_summary,
                profile_steps=args.profile,
                overwrite=args.overwrite,
                allow_changed=args.allow_changed,
            )
    except Preempted as e:
        if info.is_main:
            print(f"bertforge pretrain: {e}", file=sys.stderr, flush=True)
        return e.exit_code
    finally:
        gc.collect()  # the run's DDP reducer (in reference cycles) before its process group: gloo can hang after
        distributed.cleanup()
    if info.is_main:
        acc = summary.get("final_eval_mlm_acc", summary.get("final_mlm_acc"))
        print(
            f"done: phase {summary['phase']} step {summary['step']}, MLM accuracy "
            f"{acc if acc is None else f'{acc:.3f}'}; model: {summary['model_dir'] or 'not saved (train.save_every=0)'}"
        )
    return 0
