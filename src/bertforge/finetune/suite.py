"""The GLUE suite: fine-tune and score every GLUE task present in a `glue_data` directory, over seeds and a
learning-rate grid, and report the table in the GLUE papers' form.

    bertforge finetune --task glue --glue-dir glue_data --model M --seeds 1,2,3 --lrs 2e-5,3e-5,5e-5 --output-dir D

One (task, lr, seed) is one call of the ordinary fine-tuning function (`runner.run_finetune`) into
D/runs/<task>/lr<lr>_seed<seed>/; its result (the best dev evaluation over the run's epochs, the official
metrics x 100) goes to D/results/<task>/lr<lr>_seed<seed>.json, written atomically. A re-run reads the result
files that exist and runs only the missing ones, so a crash or a kill loses at most the run in progress. A
result written for another model or recipe (its `fingerprint`) is refused unless `overwrite`, and a model, task
file or config file (a preset too) that changes while the grid runs stops it: one table, one recipe.

Per task, the learning rate kept is the one with the best median task score over seeds; the table shows the
metrics of the run with that median score (`median_run_metrics`) and the seed spread (max - min of the task
score). A task's score is its
metric, or the mean of its two (MRPC and QQP F1/accuracy, STS-B Pearson/Spearman, MNLI matched/mismatched), and
the average is the mean of the task scores (GLUE's convention); `avg_no_wnli` leaves WNLI out as BERT's paper
does. Tokenized features are built once per task, tokenizer and max_seq_len and reused over seeds and learning
rates (`FeatureCache`). Writes D/glue_results.{md,json,png}.

A run that stops on non-finite steps (fine-tuning's `train.max_nonfinite_steps`) is recorded as diverged (its
result file says so, and a re-run of the same recipe does not retry it) and the grid goes on: the lr choice and
the medians leave diverged runs out, a task whose every run diverged shows `diverged` and no score (the averages
are then `-`), and the table and JSON name the diverged runs. Any other error still stops the suite.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.errors import Diverged, UserError, first_line
from bertforge.finetune import glue
from bertforge.runtime.io import write_text

# the GLUE papers' column order and headings
GLUE_ORDER = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli")
HEADINGS = {
    "cola": "CoLA (MCC)",
    "sst2": "SST-2 (acc)",
    "mrpc": "MRPC (F1/acc)",
    "stsb": "STS-B (P/S corr)",
    "qqp": "QQP (F1/acc)",
    "mnli": "MNLI (m/mm acc)",
    "qnli": "QNLI (acc)",
    "rte": "RTE (acc)",
    "wnli": "WNLI (acc)",
}
# a dev file's short name in a metric key (MNLI: m / mm)
DEV_NAMES = {"dev_matched": "m", "dev_mismatched": "mm"}


@dataclasses.dataclass
class SuiteOptions:
    """What `bertforge finetune --task glue` runs."""

    glue_dir: str
    model: str
    output_dir: str
    seeds: list[int] = dataclasses.field(default_factory=lambda: [42])
    lrs: list[float] = dataclasses.field(default_factory=list)
    """Learning-rate grid (empty: the config's optim.lr)."""
    tasks: list[str] = dataclasses.field(default_factory=list)
    """Only these tasks (empty: every task whose files are present)."""
    max_train_examples: int = 0
    """Train on a random subset of this many rows per task (seeded, the same subset for every run; 0: all)."""
    epochs: float | None = None
    config: str = "glue_default"
    overrides: list[str] = dataclasses.field(default_factory=list)
    keep_models: bool = False
    """Keep each run's best/ model (otherwise deleted once its result is written: a grid of runs is many GB)."""
    overwrite: bool = False
    """Re-run results that another model or recipe wrote instead of refusing them."""


# ------------------------------------------------------------------------------------------- tasks, metrics
def present_tasks(glue_dir: str | Path, only: Sequence[str] = (), say: Callable[[str], None] = print) -> list[str]:
    """The GLUE tasks whose train.tsv and dev file(s) are in `glue_dir`, in the papers' order."""
    if not Path(glue_dir).is_dir():
        raise UserError(f"--glue-dir {glue_dir} is not a directory")
    unknown = [t for t in only if t not in GLUE_ORDER]
    if unknown:
        raise UserError(f"--tasks: {', '.join(unknown)} not GLUE tasks; choose from {', '.join(GLUE_ORDER)}")
    found = []
    for task in GLUE_ORDER:
        if only and task not in only:
            continue
        train, devs = glue.default_files(task, glue_dir)
        missing = [p.name for p in (train, *devs) if not p.is_file()]
        if missing and task in only:  # asked for by name: not a quiet skip after the other tasks ran
            raise UserError(f"--tasks {task}: {Path(glue_dir) / glue.get_task(task).dir} lacks {', '.join(missing)}")
        if missing:
            if (Path(glue_dir) / glue.get_task(task).dir).is_dir():
                say(f"glue suite: skipping {task}: {glue.get_task(task).dir}/ lacks {', '.join(missing)}")
            continue
        found.append(task)
    known = {glue.get_task(t).dir for t in GLUE_ORDER}
    for other in sorted(p.name for p in Path(glue_dir).iterdir() if p.is_dir() and p.name not in known):
        say(f"glue suite: ignoring {other}/ (GLUE's folders are named {', '.join(sorted(known))})")
    if not found:
        raise UserError(f"--glue-dir {glue_dir}: no GLUE task with its train.tsv and dev file(s) there")
    return found


def task_metrics(task: str, best: dict[str, Any]) -> dict[str, float]:
    """The task's official metrics x 100 from a fine-tuning summary's `best` evaluation (MNLI: `m_accuracy` and
    `mm_accuracy`)."""
    spec = glue.get_task(task)
    names = [Path(f).stem for f in spec.dev_files]
    out = {}
    for name in names:
        for metric in spec.metrics:
            key = metric if len(names) == 1 else f"{name}/{metric}"
            out[metric if len(names) == 1 else f"{DEV_NAMES.get(name, name)}_{metric}"] = 100.0 * float(best[key])
    return out


def task_score(metrics: dict[str, float]) -> float:
    """GLUE's per-task score: the metric, or the unweighted mean of the task's metrics."""
    return float(np.mean(list(metrics.values())))


# ------------------------------------------------------------------------------------------- aggregation
def median_run_metrics(runs: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The metrics of the run with the median task score (the mean of the two middle runs' for an even count):
    a cell's two metrics (MRPC F1/acc, MNLI m/mm) come from the same run(s) and average to the median score.
    Per-metric medians could pair one seed's F1 with another's accuracy."""
    ranked = sorted(runs, key=lambda r: (task_score(r["metrics"]), r["seed"]))
    mid = ranked[(len(ranked) - 1) // 2 : len(ranked) // 2 + 1]  # (B=1 or 2) middle runs
    return {k: float(np.mean([r["metrics"][k] for r in mid])) for k in ranked[0]["metrics"]}


def aggregate(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per task: the lr with the best median score over seeds, the median run's metrics (`median_run_metrics`) and
    the median score at it, the seed spread; then the averages over tasks."""
    tasks: dict[str, Any] = {}
    for task in [t for t in GLUE_ORDER if any(r["task"] == t for r in results)]:
        rows = [r for r in results if r["task"] == task]
        # a diverged run has no score: left out of the medians, so the lr choice is among the runs that trained
        ok = [r for r in rows if not r.get("diverged")]
        diverged = sorted(
            ({"lr": r["lr"], "seed": r["seed"]} for r in rows if r.get("diverged")), key=lambda d: (d["lr"], d["seed"])
        )
        per_lr: dict[float, float | None] = {}
        for lr in sorted({r["lr"] for r in rows}):
            lr_scores = [task_score(r["metrics"]) for r in ok if r["lr"] == lr]
            per_lr[lr] = statistics.median(lr_scores) if lr_scores else None  # None: every seed diverged
        medians = {k: v for k, v in per_lr.items() if v is not None}
        # ties: the smaller lr (sorted first); no lr at all where every run of the task diverged: no score, not a
        # made-up one
        lr = max(medians, key=lambda k: medians[k]) if medians else None
        kept = sorted((r for r in ok if r["lr"] == lr), key=lambda r: r["seed"])
        scores = [task_score(r["metrics"]) for r in kept]
        tasks[task] = {
            "lr": lr,
            "seeds": [r["seed"] for r in kept],
            "metrics": median_run_metrics(kept) if kept else None,
            "score": statistics.median(scores) if scores else None,
            "seed_scores": scores,
            "spread": max(scores) - min(scores) if scores else None,
            "std": (float(np.std(scores, ddof=1)) if len(scores) > 1 else 0.0) if scores else None,
            "median_score_per_lr": {f"{k:g}": v for k, v in per_lr.items()},
            "diverged": diverged,
        }
    scored = {t: v["score"] for t, v in tasks.items()}
    no_wnli = [v for t, v in scored.items() if t != "wnli"]
    return {
        "tasks": tasks,
        # None, not NaN, where there is nothing to average: json.dumps writes NaN, which JSON does not have; and
        # None where a task has no score (every run diverged): an average of the other tasks is not GLUE's average
        "average": _mean(list(scored.values())),
        "avg_no_wnli": _mean(no_wnli),
        "diverged": [{"task": t, **d} for t, v in tasks.items() for d in v["diverged"]],
    }


def _mean(scores: Sequence[float | None]) -> float | None:
    """The mean of the task scores; None when there are none, or when a task has none (every run diverged)."""
    if not scores or any(s is None for s in scores):
        return None
    return float(np.mean([s for s in scores if s is not None]))


def _cell(metrics: dict[str, float] | None) -> str:
    return "diverged" if metrics is None else "/".join(f"{v:.1f}" for v in metrics.values())


def _seeds_cell(v: dict[str, Any]) -> str:
    """Seeds in the kept lr's median, and its seeds that diverged (every seed of every lr, when all did)."""
    lost = [d for d in v.get("diverged", []) if v["lr"] is None or d["lr"] == v["lr"]]
    return f"{len(v['seeds'])}" + (f" (+{len(lost)} diverged)" if lost else "")


def markdown_table(table: dict[str, Any], name: str = "model") -> str:
    """The GLUE papers' table: one row of official metrics per task and the averages, then spread and lr rows;
    then a line naming the runs that diverged, if any."""
    tasks = table["tasks"]
    heads = [HEADINGS[t] for t in tasks] + ["Avg", "Avg w/o WNLI"]
    avgs = [f"{a:.1f}" if a is not None else "-" for a in (table["average"], table["avg_no_wnli"])]
    avgs[1] = avgs[1] if "wnli" in tasks else "-"
    rows = [
        [name] + [_cell(v["metrics"]) for v in tasks.values()] + avgs,
        ["seed spread (max-min)"] + [_num(v["spread"], ".1f") for v in tasks.values()] + ["", ""],
        ["lr"] + [_num(v["lr"], "g") for v in tasks.values()] + ["", ""],
        ["seeds"] + [_seeds_cell(v) for v in tasks.values()] + ["", ""],
    ]
    lines = ["| | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    diverged = [(t, d) for t, v in tasks.items() for d in v.get("diverged", [])]
    if diverged:
        runs = ", ".join(f"{t} lr {d['lr']:g} seed {d['seed']}" for t, d in diverged)
        lines += ["", f"Diverged (stopped on non-finite steps; left out of the medians and the lr choice): {runs}."]
        if none := [t for t, v in tasks.items() if v["metrics"] is None]:
            lines.append(f"Every run of {', '.join(none)} diverged: no score there, and no average that counts it.")
    return "\n".join(lines) + "\n"


def _num(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def plot_table(results: Sequence[dict[str, Any]], table: dict[str, Any], png: str | Path) -> Path:
    """Task score of every run (dots, one colour per lr) and the kept lr's median (bar), as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bertforge.runtime.metrics import save_figure

    tasks = list(table["tasks"])
    lrs = sorted({r["lr"] for r in results})
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(tasks)), 4))
    bars = [table["tasks"][t]["score"] for t in tasks]
    ax.bar(range(len(tasks)), [np.nan if b is None else b for b in bars], color="lightgrey", label="median (kept lr)")
    for j, lr in enumerate(lrs):
        off = (j - (len(lrs) - 1) / 2) * 0.15
        runs = [r for r in results if r["lr"] == lr and not r.get("diverged")]  # a diverged run has no score
        pts = [(tasks.index(r["task"]) + off, task_score(r["metrics"])) for r in runs]
        if pts:
            ax.scatter(*zip(*pts), s=14, label=f"lr {lr:g}", zorder=3)
    ax.set_xticks(
        range(len(tasks)),
        [HEADINGS[t].split(" ")[0] + (" (diverged)" if b is None else "") for t, b in zip(tasks, bars, strict=True)],
    )
    ax.set_ylabel("task score (x100)")
    ax.set_title(f"GLUE dev, average {_num(table['average'], '.1f')}")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, png)


# ------------------------------------------------------------------------------------------- features
class FeatureCache:
    """Tokenized task data per (task, tokenizer files, max_seq_len, task files, subset): built once, reused over
    seeds and learning rates (and over models that share a tokenizer, when a caller keeps one cache)."""

    def __init__(self) -> None:
        self.entries: dict[tuple, Any] = {}
        self.built = 0

    def get(self, opts: SuiteOptions, task: str, task_cfg) -> Any:
        from bertforge.data.vocab import load_tokenizer
        from bertforge.finetune.runner import FinetuneRun, glue_task_data
        from bertforge.runtime.io import files_digest

        train, devs = glue.default_files(task, opts.glue_dir)
        # the task files by their bytes, not their folder: an edited TSV is tokenized again (a caller's cache lives
        # over several suites), the same files elsewhere are not
        key = (
            task,
            tokenizer_sha(opts.model),
            task_cfg.max_seq_len,
            files_digest([train, *devs]),
            opts.max_train_examples,
        )
        if key not in self.entries:
            run = FinetuneRun(task, opts.model, str(train), [str(d) for d in devs])
            data = glue_task_data(run, task_cfg, load_tokenizer(opts.model))
            if opts.max_train_examples and data.train is not None and len(data.train) > opts.max_train_examples:
                data = dataclasses.replace(data, train=subset(data.train, opts.max_train_examples))
            self.entries[key] = data
            self.built += 1
        return self.entries[key]

    def drop(self, task: str) -> None:
        self.entries = {k: v for k, v in self.entries.items() if k[0] != task}


def tokenizer_sha(model_dir: str) -> str:
    """What identifies a model's tokenizer: the bytes of its tokenizer files."""
    from bertforge.finetune.runner import TOKENIZER_FILES

    h = hashlib.sha256()
    for name in TOKENIZER_FILES:
        p = Path(model_dir) / name
        if p.is_file():
            h.update(name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:16]


def subset(data, n: int, seed: int = 0):
    """`n` rows of an `Encoded`, drawn without replacement by `seed`, in their original order."""
    rows = np.sort(np.random.default_rng(seed).choice(len(data), n, replace=False))
    return dataclasses.replace(
        data,
        input_ids=[data.input_ids[i] for i in rows],
        token_type_ids=[data.token_type_ids[i] for i in rows],
        targets={k: v[rows] for k, v in data.targets.items()},
    )


# ------------------------------------------------------------------------------------------- running
def fingerprint(opts: SuiteOptions, task: str) -> dict[str, Any]:
    """What a result of `task` depends on besides its (lr, seed): a result of another model or recipe is not
    reused. Files by their names and bytes, not their paths or times: new weights at the same --model, an edited
    TSV of the task or an edited config file make another recipe (another task's files do not), and the same
    model or glue_data copied or re-deployed elsewhere keeps its results."""
    from bertforge.config import find_preset
    from bertforge.runtime.io import files_digest

    # the file load_config reads: a preset's name (the default glue_default) too, not only a path, so that an
    # edited preset is another recipe
    config = find_preset("finetune", opts.config) if opts.config else None
    train, devs = glue.default_files(task, opts.glue_dir)
    model = Path(opts.model)
    return {
        "model": files_digest(sorted(f for f in model.iterdir() if f.is_file()) if model.is_dir() else [model]),
        "data": files_digest([train, *devs]),
        "config": opts.config,
        "config_file": files_digest([config]) if config is not None else None,
        "overrides": sorted(opts.overrides),  # their order changes nothing
        "epochs": opts.epochs,
        "max_train_examples": opts.max_train_examples,
    }


def result_path(out: Path, task: str, lr: float, seed: int) -> Path:
    return out / "results" / task / f"lr{lr:g}_seed{seed}.json"


def read_result(path: Path, fp: dict[str, Any], overwrite: bool) -> dict[str, Any] | None:
    """A finished run's result, None when it must (still) run."""
    if not path.is_file():
        return None
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
    except ValueError:
        return None  # written atomically, so only a hand-edited file gets here: run it again
    if not isinstance(rec, dict) or not isinstance(rec.get("metrics"), dict) or not {"lr", "seed"} <= rec.keys():
        return None  # hand-edited too: not a result the table can use
    if not rec["metrics"] and not rec.get("diverged"):
        return None  # no metrics and not a diverged run's record: hand-edited as well
    if (old := rec.get("fingerprint")) != fp:
        if overwrite:
            return None
        what = _differences(old, fp)
        raise UserError(
            f"{path} is the result of another model or recipe ({what} differ); pass --overwrite to re-run it, or "
            "choose another --output-dir"
        )
    return rec


def _differences(old: Any, fp: dict[str, Any]) -> str:
    """What differs between two fingerprints, in words."""
    old = old if isinstance(old, dict) else {}
    changed = [k for k in fp if old.get(k) != fp[k]] or ["recipe"]
    names = {"data": "the task's files", "config_file": f"the settings in --config {fp.get('config')}"}
    return ", ".join(names.get(k, k) for k in changed)


def run_config(opts: SuiteOptions, lr: float | None = None, seed: int | None = None, run_dir: Path | None = None):
    """The fine-tuning config of one run: the preset, the user's overrides, then the suite's own."""
    from bertforge.config import load_config

    sets = list(opts.overrides) + ([f"train.epochs={opts.epochs}"] if opts.epochs is not None else [])
    sets += [f"optim.lr={lr}"] if lr is not None else []
    sets += [f"train.seed={seed}"] if seed is not None else []
    sets += [f"train.output_dir={run_dir}"] if run_dir is not None else []
    return load_config("finetune", opts.config, sets)


def run_one(opts: SuiteOptions, task: str, lr: float, seed: int, data, log: Callable[[str], None]) -> dict[str, Any]:
    """Fine-tune one (task, lr, seed) with the ordinary fine-tuning function and return its result record."""
    from bertforge.finetune.runner import FinetuneRun, run_finetune

    run_dir = Path(opts.output_dir) / "runs" / task / f"lr{lr:g}_seed{seed}"
    fp = fingerprint(opts, task)  # before the config is read: the recipe this run trains with
    cfg = run_config(opts, lr, seed, run_dir)
    train, devs = glue.default_files(task, opts.glue_dir)
    # the run dir is this suite's scratch for this (task, lr, seed): an interrupted attempt's best/ goes
    run = FinetuneRun(task, opts.model, str(train), [str(d) for d in devs], overwrite=True, task_data=data)
    t0 = time.perf_counter()
    try:
        summary = run_finetune(run, cfg, log)
    except Diverged as e:  # any other UserError (a bad file or setting) stops the suite
        # one lr of a grid diverging is an outcome of the sweep, not the user's mistake: record it and go on
        # what happened, without the runner's advice and its "best model so far is in best/", deleted below
        summary = {"best": None, "train_s": None, "diverged": first_line(e).split(";")[0]}
    if not opts.keep_models:
        shutil.rmtree(run_dir / "best", ignore_errors=True)
    best = summary["best"]
    rec = {
        "task": task,
        "lr": lr,
        "seed": seed,
        "metrics": task_metrics(task, best) if best is not None else {},
        "best_epoch": best.get("epoch") if best is not None else None,
        "train_rows": len(data.train) if data.train is not None else 0,
        "train_s": summary["train_s"],
        "wall_s": time.perf_counter() - t0,
        "fingerprint": fp,
    }
    return {**rec, "diverged": summary["diverged"]} if "diverged" in summary else rec


def run_suite(
    opts: SuiteOptions, log: Callable[[str], None] = print, cache: FeatureCache | None = None
) -> dict[str, Any]:
    """Every (task, lr, seed) not yet done, then the table (returned and written to output_dir). Every input is
    checked first (`preflight`): a bad file or setting fails before the first run, not hours into the grid.
    SIGTERM/SIGINT raise `Preempted` (after the run in progress saved its interrupted/); a re-run goes on."""
    from bertforge.finetune.runner import preempted
    from bertforge.runtime.preempt import Preempted
    from bertforge.runtime.signals import sigterm_interrupts

    out = Path(opts.output_dir)
    resume = f"the finished runs are in {out / 'results'}: run the same command again to go on"
    try:
        with sigterm_interrupts():  # while tokenizing too (the runs' own set-up and training catch their own)
            return _run_grid(opts, out, log, cache)
    except Preempted as e:
        raise Preempted(f"{e}; {resume}", e.exit_code - 128) from None
    except KeyboardInterrupt as e:
        raise preempted(e, f"stopped the GLUE suite; {resume}") from None


_SUITE_KEYS = {"train.output_dir": "--output-dir", "train.seed": "--seeds", "optim.lr": "--lrs"}
"""Keys the suite sets for every run (`run_config`): a --set of one would be silently replaced."""


def _check_overrides(opts: SuiteOptions) -> None:
    from bertforge.config import config_class, renamed_keys

    # the old flat names (`--set seed=3`) still set these keys: the suite's own value would replace them as well
    moved = renamed_keys(config_class("finetune"))
    for entry in opts.overrides:
        given = entry.partition("=")[0].strip()
        for key in moved.get(given, (given,)):
            if key in _SUITE_KEYS and (key != "optim.lr" or opts.lrs):
                raise UserError(f"--set {given} is the suite's to set for each run: use {_SUITE_KEYS[key]} instead")


def preflight(opts: SuiteOptions, log: Callable[[str], None]) -> tuple[list[str], list[float], Any]:
    """Check every input of the grid before the first run: the seeds, each task's TSV files (read, then
    dropped: memory stays one file's), each (lr, seed)'s config, the model's config.json and tokenizer against
    the config. Returns the tasks, the lrs and the base config."""
    from bertforge.data.vocab import load_tokenizer
    from bertforge.finetune.runner import check_model_dir, check_seq_len, check_vocab

    if not opts.seeds:
        raise UserError("--seeds: give at least one seed")
    _check_overrides(opts)
    tasks = present_tasks(opts.glue_dir, opts.tasks, log)
    base = run_config(opts)
    lrs = list(opts.lrs) or [base.optim.lr]
    for lr in lrs:
        for seed in opts.seeds:
            try:
                run_config(opts, lr, seed)
            except UserError as e:
                raise UserError(f"--task glue, lr {lr:g}, seed {seed}: {e}") from None
    check_model_dir(opts.model)
    mconfig = _model_config(opts.model)
    check_vocab(opts.model, load_tokenizer(opts.model), mconfig.vocab_size)
    check_seq_len(opts.model, base.task.max_seq_len, mconfig)
    for task in tasks:
        train, devs = glue.default_files(task, opts.glue_dir)
        for path in (train, *devs):
            glue.read_tsv(path, glue.get_task(task))
    return tasks, lrs, base


def _model_config(model_dir: str):
    """The BertConfig of a model directory's config.json."""
    from bertforge.model.hf_interop import config_from_hf, read_config

    raw, path = read_config(model_dir)
    return config_from_hf(raw, str(path))


def _run_grid(opts: SuiteOptions, out: Path, log: Callable[[str], None], cache: FeatureCache | None) -> dict[str, Any]:
    tasks, lrs, base = preflight(opts, log)
    fps = {task: fingerprint(opts, task) for task in tasks}
    grid = [(task, lr, seed) for task in tasks for lr in lrs for seed in opts.seeds]
    # every result file before the first run: one of another recipe is refused now, not hours in
    done = {key: read_result(result_path(out, *key), fps[key[0]], opts.overwrite) for key in grid}
    own_cache = cache is None
    cache = cache or FeatureCache()
    results, t0 = [], time.perf_counter()
    for task, lr, seed in grid:
        path = result_path(out, task, lr, seed)
        rec = done[(task, lr, seed)]
        if rec is None:
            log(f"glue suite: {task} lr {lr:g} seed {seed}")
            rec = run_one(opts, task, lr, seed, cache.get(opts, task, base.task), log)
            if rec["fingerprint"] != fps[task]:
                # the config file, the task's files or the model changed while the grid ran (a preset edited for
                # the next experiment): this run and the next would be of another recipe than the runs before
                raise UserError(
                    f"glue suite: {_differences(rec['fingerprint'], fps[task])} changed while the suite ran "
                    f"({task} lr {lr:g} seed {seed} not recorded): put them back and run the command again, or pass "
                    "--overwrite to re-run the grid with the new ones"
                )
            path.parent.mkdir(parents=True, exist_ok=True)
            write_text(path, json.dumps(rec, indent=1))
            if rec.get("diverged"):
                log(
                    f"glue suite: {task} lr {lr:g} seed {seed} diverged ({rec['diverged']}); recorded in {path} "
                    "(delete it to run it again), going on with the next run"
                )
        else:
            diverged = " (diverged)" if rec.get("diverged") else ""
            log(f"glue suite: {task} lr {lr:g} seed {seed}: done earlier{diverged} ({path})")
        results.append(rec)
        if own_cache and lr == lrs[-1] and seed == opts.seeds[-1]:
            cache.drop(task)  # this task's rows are not needed again
    results += _earlier_tasks(opts, out, tasks, lrs, log) if opts.tasks else []
    table = aggregate(results)
    table.update(model=opts.model, seeds=list(opts.seeds), lrs=lrs, wall_s=time.perf_counter() - t0)
    write_outputs(out, results, table)
    return table


def _earlier_tasks(
    opts: SuiteOptions, out: Path, ran: Sequence[str], lrs: Sequence[float], log: Callable[[str], None]
) -> list[dict[str, Any]]:
    """With --tasks, the other present tasks' results of this same recipe and grid, so that the table a partial
    re-run rewrites still holds them; a task with any run of the grid missing or of another recipe is left out."""
    found: list[dict[str, Any]] = []
    for task in present_tasks(opts.glue_dir, (), lambda _: None):
        if task in ran:
            continue
        fp = fingerprint(opts, task)
        recs = [read_result(result_path(out, task, lr, seed), fp, overwrite=True) for lr in lrs for seed in opts.seeds]
        have = [r for r in recs if r is not None]
        if len(have) == len(recs):
            log(f"glue suite: the table keeps {task} from the earlier runs in {out / 'results' / task}")
            found += have
        elif have:
            log(
                f"glue suite: the table leaves {task} out: {len(have)} of its {len(recs)} runs of this grid and "
                f"recipe are done (add it to --tasks to run the rest)"
            )
    return found


def write_outputs(out: Path, results: Sequence[dict[str, Any]], table: dict[str, Any]) -> None:
    md = markdown_table(table, "/".join(Path(table.get("model", "model")).parts[-2:]))  # e.g. runs/best
    write_text(out / "glue_results.md", md)
    write_text(out / "glue_results.json", json.dumps({**table, "runs": list(results)}, indent=1))
    plot_table(results, table, out / "glue_results.png")
    print(md, file=sys.stdout, flush=True)
