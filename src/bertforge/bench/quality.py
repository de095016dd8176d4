"""Time to quality at equal budget: the same small BERT pre-trained from scratch on the same shards for the same
wall-clock budget by (a) the product — `bertforge pretrain` in a child process, with a preset's recipe and
defaults — and (b) the Hugging Face baseline (`bench.baseline`: BertForPreTraining + AdamW, linear schedule, in
a plain loop); both evaluate held-out masked-LM accuracy on the same held-out shard every `eval_every` steps
(evaluation time excluded from the clock). Then the GLUE suite (`finetune.suite`) fine-tunes both final models
with the same recipe.

Each side's schedule must end at the budget, so each first measures its own step rate in a short calibration run
(not counted) and trains for budget x rate steps; the curves are cut at the budget. The target is the baseline's
last held-out accuracy within the budget; each side's time to it is read off the curves (`bench.pretrain.
tta_from_curves`). Writes OUT/curve.jsonl, OUT/curves.png, OUT/glue_{ours,hf}/ and OUT/report.md.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from bertforge import device as dev
from bertforge.errors import UserError
from bertforge.runtime.io import strict_json, write_text
from bertforge.runtime.metrics import read_jsonl

# Turc et al. 2019 ("Well-Read Students Learn Better"), GLUE test-set averages of Google's BERT miniatures, each
# pre-trained for 1M steps of 256 sequences (seq 128 for 90%, 512 for 10%) on BooksCorpus + Wikipedia.
ANCHORS = {"BERT-Tiny (L2/H128)": 64.2, "BERT-Mini (L4/H256)": 65.8}
ANCHOR_SEQUENCES = 1_000_000 * 256


# ------------------------------------------------------------------------------------------- ours
def _pretrain(config: str, sets: list[str], timeout_s: float) -> Path:
    """`python -m bertforge pretrain --config CONFIG --set ...` as a user starts it; returns its output dir.
    A benchmark measures afresh: `--overwrite` replaces what an earlier run of it left in its own directory."""
    out = Path(next(s.split("=", 1)[1] for s in sets if s.startswith("train.output_dir=")))
    cmd = [sys.executable, "-m", "bertforge", "pretrain", "--config", config, "--overwrite"]
    cmd += [x for s in sets for x in ("--set", s)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=dict(os.environ))
    if proc.returncode:
        raise RuntimeError(f"bertforge pretrain failed ({proc.returncode}): {proc.stderr[-3000:]}")
    return out


def eval_curve(rows: list[dict[str, Any]]) -> list[dict[str, float]]:
    """(train_s, step, acc) at each held-out evaluation of a pre-training metrics.jsonl: train_s is the sum of
    the logged windows' `window_s` up to that step (the loop keeps evaluation and saving out of its windows), so
    log_every must divide eval_every."""
    curve, train_s, windows = [], 0.0, sorted((r for r in rows if "window_s" in r), key=lambda r: r["step"])
    for r in sorted((r for r in rows if "eval_mlm_acc" in r), key=lambda r: r["step"]):
        while windows and windows[0]["step"] <= r["step"]:
            train_s += float(windows.pop(0)["window_s"])
        curve.append({"train_s": round(train_s, 2), "step": int(r["step"]), "acc": float(r["eval_mlm_acc"])})
    return curve


def budget_steps(budget_s: float, eval_every: int, rate: float, side: str) -> int:
    """Updates that fill the budget at the measured rate; refused when that leaves no evaluation in it."""
    steps = int(budget_s * rate)
    if steps < eval_every:
        raise UserError(
            f"{side}: {budget_s:g} s at {rate:.3g} updates/s is {steps} updates, fewer than eval_every "
            f"{eval_every}; lower eval_every or the batch, or raise budget_s"
        )
    return steps


def update_rate(rows: list[dict[str, Any]]) -> float:
    """Updates per second of a run's metrics.jsonl: the median over its logged windows but the first (which holds
    the warm-up and compilation)."""
    logs = sorted((r for r in rows if "window_s" in r), key=lambda r: r["step"])
    rates = [(b["step"] - a["step"]) / b["window_s"] for a, b in zip([{"step": 0}, *logs], logs, strict=False)]
    return statistics.median(rates[1:] or rates)


def start_overhead(rows: list[dict[str, Any]], rate: float) -> float:
    """Seconds the first logged window of a run's metrics.jsonl took beyond its updates at `rate`: the warm-up
    and, in a compiled run, the compile. The budget run pays them again inside its curve's time (less with
    inductor's cache warm), so they come out of the budget that sets its length."""
    logs = sorted((r for r in rows if "window_s" in r), key=lambda r: r["step"])
    return max(0.0, float(logs[0]["window_s"]) - logs[0]["step"] / rate) if logs else 0.0


def budget_pretrain(
    config: str, sets: list[str], out: Path, budget_s: float, eval_every: int, calib_steps: int, timeout_s: float
) -> dict[str, Any]:
    """`bertforge pretrain --config CONFIG --set SETS` for `budget_s` of training: a calibration run of
    `calib_steps` updates (no evaluation, nothing saved) measures the step rate, then the run proper takes
    budget x rate updates, so that its schedule ends at the budget, with held-out evaluation every `eval_every`."""
    calib = [f"train.output_dir={out / 'calibration'}", f"train.max_steps={calib_steps}"]
    calib += [f"train.log_every={max(1, calib_steps // 4)}", "train.save_every=0", "data.eval_dir=null"]
    rows = read_jsonl(_pretrain(config, sets + calib, timeout_s) / "metrics.jsonl")
    rate = update_rate(rows)
    steps = budget_steps(budget_s - start_overhead(rows, rate), eval_every, rate, out.name)
    run = [f"train.output_dir={out / 'pretrain'}", f"train.max_steps={steps}", f"train.log_every={eval_every}"]
    run += [f"train.eval_every={eval_every}", f"train.save_every={steps}"]
    done = _pretrain(config, sets + run, timeout_s + 2 * budget_s)
    summary = json.loads((done / "summary.json").read_text(encoding="utf-8"))
    return {
        "curve": eval_curve(read_jsonl(done / "metrics.jsonl")),
        "model_dir": summary["model_dir"],
        "steps": steps,
        "steps_per_s": rate,
        "parameters": summary["parameters"],
    }


def in_budget(curve: list[dict[str, Any]], budget_s: float) -> list[dict[str, Any]]:
    """The evaluations a budget counts: those up to 2% past it (a calibration a little off)."""
    return [c for c in curve if c["train_s"] <= 1.02 * budget_s]


def ours_side(p: dict[str, Any], out: Path) -> dict[str, Any]:
    """The product with the preset's recipe: only data paths, batch, model size, device and seed are set."""
    return budget_pretrain(
        p["config"], _ours_sets(p), out, p["budget_s"], p["eval_every"], p["calib_steps"], p["timeout_s"]
    )


def _ours_sets(p: dict[str, Any]) -> list[str]:
    return [
        f"data.input_dir={p['data_dir']}",
        f"data.vocab={p['vocab']}",
        f"data.eval_dir={p['eval_dir']}",
        f"data.eval_batches={p['eval_batches']}",
        f"train.global_batch_size={p['batch']}",
        f"train.micro_batch_size={p['batch']}",
        f"model.preset={p['preset']}",
        f"model.max_position_embeddings={p['max_position_embeddings']}",
        f"train.precision={p['precision']}",
        f"train.device={p['device']}",
        f"train.seed={p['seed']}",
        "train.tensorboard=false",
        "train.plot=false",
        "model.init_from=null",
        "train.init_checkpoint=null",
        *p.get("ours_overrides", []),
    ]


def same_model(p: dict[str, Any], vocab_size: int):
    """The BertConfig ours' side trains (its preset, shape and dropout, with the side's overrides): the baseline
    trains the same model, so the two differ in how they train it, not in what (ours' demo recipe has no
    dropout; the preset's 0.1 on one side only made the baseline learn more slowly per update)."""
    from bertforge.config import load_config
    from bertforge.train.loop import build_bert_config, model_rows

    cfg = load_config("pretrain", p["config"], _ours_sets(p))
    return build_bert_config(cfg, model_rows(cfg, vocab_size, None))  # ours' rows: padded as ours pads them


def ours_data(p: dict[str, Any]) -> tuple[Any, list[dict[str, torch.Tensor]]]:
    """The baseline's training loader and held-out batches, masked as ours' run masks them (`train.loop`'s
    `build_loader` and `evaluate_run`): on shards the loader masks (dynamic masking), ours' rate and split and
    random words below the data's vocab rows; for the held-out batches also ours' batch, count and seed. The
    loader's defaults drew random words below 30,522 (ids past a smaller vocab's embedding: an IndexError at the
    first step) and masked at the shards' 15% with seed 0, where ours trains and evaluates at its
    data.mlm_probability with train.seed: another held-out task than ours'."""
    from bertforge.config import load_config
    from bertforge.data.loader import PretrainLoader, eval_batches
    from bertforge.train.loop import resolve_vocab

    cfg = load_config("pretrain", p["config"], _ours_sets(p))
    d, t = cfg.data, cfg.train
    rows, _, _ = resolve_vocab(cfg, None)
    loader = PretrainLoader.from_dir(
        p["data_dir"],
        p["batch"],
        p["batch"],
        0,
        1,
        seed=t.seed,
        num_workers=1,
        vocab_size=rows,
        mlm_probability=d.mlm_probability,
        mask_split=d.mask_split,
    )
    held_out = eval_batches(
        d.eval_dir, t.micro_batch_size, 0, 1, d.eval_batches or None, rows, t.seed, **d.eval_masking
    )
    return loader, list(held_out)


# ------------------------------------------------------------------------------------------- baseline
def _hf_rate(config, loader, device, precision: str, steps: int, objective: str = "mlm_nsp") -> float:
    """Updates per second of the baseline on a throwaway model (after 3 warm-up steps)."""
    from bertforge.bench.baseline import hf_pretraining, hf_step

    model, opt = hf_pretraining(config, device, objective=objective)
    for _ in range(3):
        hf_step(model, opt, next(loader), device, precision)
    dev.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        hf_step(model, opt, next(loader), device, precision)
    dev.synchronize(device)
    return steps / (time.perf_counter() - t0)


def hf_side(p: dict[str, Any], out: Path) -> dict[str, Any]:
    """The baseline for the budget: AdamW with linear warm-up and decay over budget x its measured step rate,
    held-out accuracy every eval_every steps (not timed); the final model saved in Hugging Face format."""
    from bertforge.bench.baseline import hf_mlm_accuracy, hf_pretraining, hf_step
    from bertforge.optim.schedule import lr_at
    from bertforge.runtime.step import set_lr

    device = dev.resolve_device(p["device"])
    precision = dev.resolve_precision(p["precision"], device)
    from bertforge.data.vocab import load_tokenizer, vocab_rows

    config = same_model(p, vocab_rows(load_tokenizer(Path(p["vocab"], "vocab.txt"))))
    loader, held_out = ours_data(p)
    # MLM-only shards carry no NSP labels: the baseline is then BertForMaskedLM (run_mlm.py's), as ours drops NSP
    objective = loader.shards.objective
    it = loader.iterate()
    torch.manual_seed(p["seed"])
    rate = _hf_rate(config, it, device, precision, p["calib_steps"], objective)
    steps = budget_steps(p["budget_s"], p["eval_every"], rate, "hf")
    evals = [{k: v.to(device) for k, v in b.items()} for b in held_out]
    torch.manual_seed(p["seed"])
    model, opt = hf_pretraining(config, device, lr=p["hf_lr"], weight_decay=0.01, objective=objective)
    curve, train_s, step = [], 0.0, 0
    while step < steps and train_s < p["budget_s"]:
        t0 = time.perf_counter()
        for _ in range(min(p["eval_every"], steps - step)):
            step += 1
            set_lr(opt, lr_at(step, p["hf_lr"], steps, p["hf_warmup"], "linear"))
            hf_step(model, opt, next(it), device, precision)
        dev.synchronize(device)
        train_s += time.perf_counter() - t0
        with dev.autocast(device, precision):
            acc = hf_mlm_accuracy(model, evals)
        curve.append({"train_s": round(train_s, 2), "step": step, "acc": acc})
    model_dir = out / "hf_model"
    model.save_pretrained(model_dir)  # type: ignore[operator]  # transformers' PreTrainedModel method
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if Path(p["vocab"], name).is_file():
            shutil.copyfile(Path(p["vocab"], name), model_dir / name)
    return {"curve": curve, "model_dir": str(model_dir), "steps": steps, "steps_per_s": steps / max(train_s, 1e-9)}


# ------------------------------------------------------------------------------------------- both, GLUE
DEFAULTS: dict[str, Any] = {
    "config": "demo_tiny_128",
    "preset": "tiny",
    "batch": 32,
    "max_position_embeddings": 512,
    "precision": "fp32",
    "device": "cpu",
    "seed": 12345,
    "eval_every": 50,
    "eval_batches": 20,
    "calib_steps": 20,
    "hf_lr": 1e-3,
    "hf_warmup": 0.05,
    "timeout_s": 600,
    "sides": ["ours", "hf"],
    "glue_seeds": [1, 2, 3],
    "glue_lrs": [],
    "glue_tasks": [],
    "glue_max_train_examples": 0,
    "glue_epochs": None,
    "glue_overrides": [],
    "glue_device": None,  # where GLUE fine-tunes, when not where the sides trained (`device`, which the report names)
}


GLUE_DROPOUT = ("model.hidden_dropout=0.1", "model.attention_dropout=0.1")
"""Fine-tuning dropout for both models: BERT's fine-tuning rate (Devlin et al., Google's run_classifier)."""


def _glue(p: dict[str, Any], model_dir: str, out: Path, cache) -> dict[str, Any]:
    from bertforge.finetune.suite import SuiteOptions, run_suite

    opts = SuiteOptions(
        glue_dir=p["glue_dir"],
        model=model_dir,
        output_dir=str(out),
        seeds=list(p["glue_seeds"]),
        lrs=list(p["glue_lrs"]),
        tasks=list(p["glue_tasks"]),
        max_train_examples=p["glue_max_train_examples"],
        epochs=p["glue_epochs"],
        overrides=[
            f"train.device={p['glue_device'] or p['device']}",
            "train.tensorboard=false",
            *GLUE_DROPOUT,  # the same for both models, not each checkpoint's own rate
            *p["glue_overrides"],
        ],
        # OUT/glue_<side>/ is this benchmark's own: a call that pre-trained afresh (new weights) re-runs its GLUE
        # runs instead of refusing the last call's after the whole budget; the same model's results are reused
        overwrite=True,
    )
    return run_suite(opts, log=lambda s: None, cache=cache)


def run_sides(p: dict[str, Any], out: Path) -> dict[str, dict[str, Any]]:
    """Run the sides named in p["sides"]; a side not named is read from an earlier call's OUT/<side>/side.json."""
    fns = {"ours": ours_side, "hf": hf_side}
    unknown = [k for k in p["sides"] if k not in fns]
    if unknown:
        raise UserError(f"quality_budget sides: {', '.join(unknown)}; choose from ours, hf")
    sides = {}
    for k, fn in fns.items():
        record = out / k / "side.json"
        if k in p["sides"]:
            sides[k] = fn(p, out / k)
            write_text(record, json.dumps(sides[k], indent=1))
        elif record.is_file():
            sides[k] = json.loads(record.read_text(encoding="utf-8"))
    return sides


def quality_budget(
    out_dir: str,
    data_dir: str,
    eval_dir: str,
    vocab: str,
    budget_s: float = 1200,
    glue_dir: str | None = None,
    **params: Any,
) -> dict[str, float]:
    """Both sides for `budget_s` training seconds each (one after another), the curves, the time to the baseline's
    final held-out accuracy, then (with `glue_dir`) the GLUE suite on both final models. `params`: the keys of
    DEFAULTS (`config`: ours' pretrain preset; `ours_overrides`: extra `--set`s for it)."""
    from bertforge.bench.pretrain import plot_curves, tta_from_curves
    from bertforge.finetune.suite import FeatureCache

    unknown = sorted(set(params) - set(DEFAULTS) - {"ours_overrides"})
    if unknown:
        raise UserError(f"quality_budget: unknown parameters {', '.join(unknown)}; known: {', '.join(DEFAULTS)}")
    p = {**DEFAULTS, **params, "data_dir": data_dir, "eval_dir": eval_dir, "vocab": vocab, "budget_s": budget_s}
    p["glue_dir"] = glue_dir
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sides = run_sides(p, out)
    if len(sides) < 2:  # the other side runs in a call of its own (one GPU lease per side)
        return one_side(p, out, sides)
    # the budget is the comparison: evaluations past it (a calibration a little off) are not counted
    rows = [{"impl": k, **r} for k, s in sides.items() for r in in_budget(s["curve"], budget_s)]
    if not all(any(r["impl"] == k for r in rows) for k in sides):
        raise UserError(f"a side has no evaluation within {budget_s:g} s; lower eval_every or raise the budget")
    curve = write_text(out / "curve.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    tta = tta_from_curves(str(curve), "hf")
    plot_curves(str(curve), str(out / "curves.png"), tta["target"])
    result: dict[str, Any] = {"target_acc": tta["target"]}
    for k in sides:
        last = [r for r in rows if r["impl"] == k][-1]
        result.update({f"{k}_final_acc": last["acc"], f"{k}_train_s": last["train_s"], f"{k}_steps": last["step"]})
        result[f"{k}_seconds_to_target"] = tta[f"{k}_seconds"]
    result["ours_time_share"] = result["ours_seconds_to_target"] / result["hf_seconds_to_target"]
    tables = {}
    if glue_dir:
        cache = FeatureCache()  # both models share the corpus vocab: tokenize each task once
        tables = {k: _glue(p, s["model_dir"], out / f"glue_{k}", cache) for k, s in sides.items()}
        result.update({f"{k}_glue_avg": t["average"] for k, t in tables.items()})
    write_text(out / "report.md", report(p, result, tables))
    record = {"params": p, "result": result, "glue": tables}
    write_text(out / "result.json", strict_json(record, indent=1, default=str))  # a target never reached: null
    return measured(result)


def measured(result: dict[str, Any]) -> dict[str, float]:
    """What the bench harness records (it takes every value as a float): a GLUE average that does not exist
    (a task whose every run diverged: `finetune.suite.aggregate`) is left out; report.md and result.json say it."""
    return {k: v for k, v in result.items() if v is not None}


def one_side(p: dict[str, Any], out: Path, sides: dict[str, dict[str, Any]]) -> dict[str, float]:
    """A call that has one side's record: its final accuracy, and (with glue_dir) its GLUE table. The GPU plan
    trains each side in a lease of its own and fine-tunes its model where the model came back to, so each GLUE
    table is finished (and its results reused by the suite's resume) before the other side exists."""
    from bertforge.finetune.suite import FeatureCache

    if not sides:
        raise UserError(f"quality_budget: no side trained here and no side.json under {out}/ours or {out}/hf")
    k, s = next(iter(sides.items()))
    # the last evaluation the budget counts, as the comparison of two sides reads it (`in_budget`)
    counted = in_budget(s["curve"], p["budget_s"]) or s["curve"][:1]
    result = {f"{k}_final_acc": counted[-1]["acc"], f"{k}_steps": float(s["steps"])}
    if p["glue_dir"]:
        result[f"{k}_glue_avg"] = _glue(p, s["model_dir"], out / f"glue_{k}", FeatureCache())["average"]
    return measured(result)


# ------------------------------------------------------------------------------------------- recipes
def equal_time(
    out_dir: str,
    runs: dict[str, dict[str, Any]],
    budget_s: float = 360,
    eval_every: int = 50,
    calib_steps: int = 20,
    sets: list[str] | None = None,
    timeout_s: float = 600,
    common_eval: dict[str, Any] | None = None,
) -> dict[str, float]:
    """Product recipes at equal time: each of `runs` (name -> {"config": a pretrain preset, "sets": [...]}) is
    `bertforge pretrain` for `budget_s` training seconds (`budget_pretrain`), one after another, with `sets`
    common to all (e.g. data.eval_mlm_probability=0.15, so runs trained at different masking rates are scored on
    one task). `common_eval` ({dir, batch, batches, mlm_probability}): every run's final model is also scored on
    that one held-out directory (runs whose own held-out rows differ, e.g. in length, on the same rows).
    Writes OUT/curve.jsonl, OUT/curves.png and OUT/report.md (parameters, updates, final held-out accuracy of
    each run)."""
    for name, r in runs.items():
        if "config" not in r or set(r) - {"config", "sets"}:
            raise UserError(f"equal_time run {name!r}: give config (a pretrain preset) and optionally sets, not {r}")
    common = _common_eval(common_eval)
    out = Path(out_dir)
    rows: list[dict[str, Any]] = []
    result: dict[str, float] = {}
    table = ["| run | config | parameters | updates | train s | final held-out MLM acc |", "|---|---|---|---|---|---|"]
    if common:
        table = [table[0][:-1] + f"| final model on {common['dir']} |", table[1] + "---|"]
    for name, r in runs.items():
        run_sets = [*(sets or []), *r.get("sets", []), "train.tensorboard=false", "train.plot=false"]
        side = budget_pretrain(r["config"], run_sets, out / name, budget_s, eval_every, calib_steps, timeout_s)
        curve = in_budget(side["curve"], budget_s) or side["curve"][:1]
        rows += [{"impl": name, **c} for c in curve]
        last = curve[-1]
        result.update({f"{name}_final_acc": last["acc"], f"{name}_steps": last["step"]})
        result[f"{name}_parameters"] = side["parameters"]
        row = f"| {name} | {r['config']} | {side['parameters'] / 1e6:.2f}M | {last['step']} | "
        row += f"{last['train_s']:.0f} | {last['acc']:.4f} |"
        if common:
            result[f"{name}_common_acc"] = score_model(side["model_dir"], common)
            row += f" {result[f'{name}_common_acc']:.4f} (update {side['steps']}) |"
        table.append(row)
    curve_file = write_text(out / "curve.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    from bertforge.bench.pretrain import plot_curves

    plot_curves(str(curve_file), str(out / "curves.png"))
    head = f"{budget_s:g} s of training per run (evaluation excluded); common settings: {', '.join(sets or []) or '-'}"
    write_text(out / "report.md", "\n".join([head, "", *table]) + "\n")
    return result


def _common_eval(spec: dict[str, Any] | None) -> dict[str, Any] | None:
    """`equal_time`'s common_eval with its defaults, checked before any training starts."""
    if not spec:
        return None
    allowed = {"dir", "batch", "batches", "mlm_probability", "seed"}
    if "dir" not in spec or set(spec) - allowed:
        raise UserError(
            f"equal_time common_eval: give dir and optionally batch, batches, mlm_probability, seed; not {spec}"
        )
    if not Path(spec["dir"]).is_dir():
        raise UserError(f"equal_time common_eval: held-out directory {spec['dir']} does not exist")
    return {"batch": 32, "batches": 20, "mlm_probability": 0.15, "seed": 12345, **spec}


def score_model(model_dir: str, common: dict[str, Any]) -> float:
    """Held-out MLM accuracy of a saved pre-trained model on `common`'s directory, as `bertforge pretrain`'s own
    evaluation computes it (the same batches and masks for every model given the same settings)."""
    from bertforge.model.hf_interop import load_pretrained
    from bertforge.runtime.distributed import DistInfo
    from bertforge.train.loop import evaluate

    model, config = load_pretrained(model_dir, "mlm")
    where = dev.resolve_device("auto")
    masking = {"mlm_probability": common["mlm_probability"]}
    r = evaluate(
        model.to(where),
        common["dir"],
        where,
        dev.resolve_precision("auto", where),
        common["batch"],
        common["batches"],
        DistInfo(),
        config.vocab_size,
        common["seed"],
        masking,
    )
    return r["eval_mlm_acc"]


def _finite(v: float | None) -> float | None:
    """A time to the target, None where it was not reached (inf, or null in a result.json)."""
    return v if v is not None and math.isfinite(v) else None


def report(p: dict[str, Any], r: dict[str, Any], tables: dict[str, Any]) -> str:
    """The Markdown summary: curves, time to the target, both GLUE tables and the miniatures as anchors."""
    from bertforge.finetune.suite import markdown_table

    names = {"ours": "bertforge pretrain", "hf": "HF baseline"}
    lines = [
        f"BERT-{p['preset']} seq 128, batch {p['batch']}, {p['budget_s']:g} s of training per side "
        f"({p['device']}, {p['precision']}); held-out MLM accuracy on {p['eval_batches']} batches of {p['eval_dir']}.",
        "",
        "| side | steps | train s | final held-out MLM acc | s to baseline's final acc |",
        "|---|---|---|---|---|",
    ]
    reached = {k: _finite(r[f"{k}_seconds_to_target"]) for k in ("ours", "hf")}
    for k in ("ours", "hf"):
        lines.append(
            f"| {names[k]} | {r[f'{k}_steps']:.0f} | {r[f'{k}_train_s']:.0f} | {r[f'{k}_final_acc']:.4f} | "
            f"{f'{reached[k]:.0f}' if reached[k] is not None else 'not reached'} |"
        )
    share = _finite(r["ours_time_share"])
    said = f"ours reached it in {share:.0%} of the baseline's time" if share is not None else "ours did not reach it"
    lines += ["", f"Target {r['target_acc']:.4f}; {said}.", ""]
    for k, t in tables.items():
        lines += [
            f"GLUE dev, {names[k]} (median over seeds {', '.join(map(str, t['seeds']))}):",
            "",
            markdown_table(t, names[k]),
        ]
    if tables:
        seqs = max(r["ours_steps"], r["hf_steps"]) * p["batch"]
        lines.append(
            "Anchors (GLUE test, Turc et al. 2019): "
            + ", ".join(f"{n} {v}" for n, v in ANCHORS.items())
            + f" — pre-trained on {ANCHOR_SEQUENCES / seqs:,.0f}x the sequences of these runs."
            if math.isfinite(seqs) and seqs
            else ""
        )
    return "\n".join(lines) + "\n"
