"""Benchmark harness: named callables with parameters, repeated, summarised; ratios measured in one run.

A spec is YAML:

    title: Model training step, ours vs Hugging Face
    repeat: 3                  # default repeats (each benchmark may override)
    warmup: 1                  # untimed calls before the repeats
    benchmarks:
      - name: hf_tiny_fp32
        fn: bertforge.bench.model:train_step      # module:function
        params: {impl: hf, preset: tiny, precision: fp32}
      - name: ours_tiny_fp32
        fn: bertforge.bench.model:train_step
        params: {impl: ours, preset: tiny, precision: fp32}
    ratios:
      - {name: tiny_fp32_speedup, num: ours_tiny_fp32, den: hf_tiny_fp32, metric: seq_per_s, target: 4.0}

A benchmark callable runs once per repeat and returns a dict of metrics (floats, e.g. `seq_per_s`, `mfu`);
the harness adds `wall_s`, the call's wall time. Each metric is summarised as median / min / max over the
repeats. A ratio divides the numerator's median by the denominator's median for one metric; `target`, when
given, is the value the ratio must reach (or, with `lower_is_better: true`, stay under).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import importlib
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import yaml

from bertforge.errors import UserError

SPEC_DIRS = [Path.cwd() / "benchmarks", Path(__file__).resolve().parents[3] / "benchmarks"]


@dataclasses.dataclass
class BenchSpec:
    name: str
    fn: str
    params: dict[str, Any]
    repeat: int
    warmup: int


@dataclasses.dataclass
class RatioSpec:
    name: str
    num: str
    den: str
    metric: str
    target: float | None = None
    lower_is_better: bool = False


@dataclasses.dataclass
class Spec:
    title: str
    path: Path
    benchmarks: list[BenchSpec]
    ratios: list[RatioSpec]


def find_spec(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.is_file():
        return path
    for d in SPEC_DIRS:
        for cand in (d / name_or_path, d / f"{name_or_path}.yml", d / f"{name_or_path}.yaml"):
            if cand.is_file():
                return cand
    raise UserError(f"benchmark spec {name_or_path!r} not found (a path, or a name in benchmarks/)")


def load_spec(name_or_path: str) -> Spec:
    path = find_spec(name_or_path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise UserError(f"benchmark spec {path} is not valid YAML: {e}") from None
    unknown = set(raw) - {"title", "repeat", "warmup", "benchmarks", "ratios", "notes"}
    if unknown:
        raise UserError(f"benchmark spec {path}: unknown top-level keys {sorted(unknown)}")
    repeat, warmup = int(raw.get("repeat", 3)), int(raw.get("warmup", 1))
    benches = []
    for i, b in enumerate(raw.get("benchmarks") or []):
        if not isinstance(b, dict) or "name" not in b or "fn" not in b:
            raise UserError(f"benchmark spec {path}: benchmarks[{i}] needs a name and an fn (module:function)")
        benches.append(BenchSpec(b["name"], b["fn"], dict(b.get("params") or {}),
                                 int(b.get("repeat", repeat)), int(b.get("warmup", warmup))))
    names = [b.name for b in benches]
    if len(set(names)) != len(names):
        raise UserError(f"benchmark spec {path}: benchmark names must be unique")
    ratios = []
    for r in raw.get("ratios") or []:
        ratio = RatioSpec(**r)
        for side in (ratio.num, ratio.den):
            if side not in names:
                raise UserError(f"benchmark spec {path}: ratio {ratio.name!r} names unknown benchmark {side!r}")
        ratios.append(ratio)
    return Spec(raw.get("title", path.stem), path, benches, ratios)


def resolve_fn(target: str) -> Callable[..., dict[str, float] | None]:
    module, _, name = target.partition(":")
    if not name:
        raise UserError(f"benchmark fn {target!r} must be module:function")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise UserError(f"benchmark fn {target!r} cannot be loaded: {e}") from None


def summarise(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def run_one(b: BenchSpec, progress: Callable[[str], None] = print) -> dict[str, Any]:
    fn = resolve_fn(b.fn)
    for _ in range(b.warmup):
        fn(**b.params)
    samples: dict[str, list[float]] = {}
    for i in range(b.repeat):
        t0 = time.perf_counter()
        metrics = fn(**b.params) or {}
        metrics = {"wall_s": time.perf_counter() - t0, **{k: float(v) for k, v in metrics.items()}}
        for k, v in metrics.items():
            samples.setdefault(k, []).append(v)
        shown = ", ".join(f"{k} {v:.4g}" for k, v in metrics.items())
        progress(f"  {b.name} [{i + 1}/{b.repeat}] {shown}")
    return {"name": b.name, "fn": b.fn, "params": b.params,
            "metrics": {k: summarise(v) for k, v in samples.items()}, "samples": samples}


def compute_ratio(r: RatioSpec, results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    try:
        num = results[r.num]["metrics"][r.metric]["median"]
        den = results[r.den]["metrics"][r.metric]["median"]
    except KeyError:
        return {**dataclasses.asdict(r), "value": None, "met": None}
    value = num / den if den else float("inf")
    met = None
    if r.target is not None:
        met = value <= r.target if r.lower_is_better else value >= r.target
    return {**dataclasses.asdict(r), "value": value, "met": met}


def machine() -> dict[str, Any]:
    import torch

    from bertforge import __version__, device as dev

    return {"cpu": dev.cpu_model(), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "bertforge": __version__, "python": platform.python_version(),
            "devices": [d["name"] for d in dev.available_devices()]}


def run_spec(spec: Spec, only: list[str] | None = None, progress: Callable[[str], None] = print) -> dict[str, Any]:
    selected = [b for b in spec.benchmarks if not only or b.name in only or any(o in b.name for o in only)]
    if only and not selected:
        raise UserError(f"--only {only}: no benchmark of {spec.path} matches; names: "
                        f"{', '.join(b.name for b in spec.benchmarks)}")
    results: dict[str, dict[str, Any]] = {}
    for b in selected:
        progress(f"{b.name}: {b.fn} {b.params}")
        try:
            results[b.name] = run_one(b, progress)
        except Exception as e:  # one broken entry must not throw away the others' measurements
            progress(f"  {b.name} FAILED: {type(e).__name__}: {e}")
            results[b.name] = {"name": b.name, "fn": b.fn, "params": b.params, "metrics": {}, "samples": {},
                               "error": f"{type(e).__name__}: {e}"}
    ratios = [compute_ratio(r, results) for r in spec.ratios if r.num in results and r.den in results]
    return {"title": spec.title, "spec": str(spec.path), "date": _dt.datetime.now().isoformat(timespec="seconds"),
            "machine": machine(), "results": list(results.values()), "ratios": ratios}


def _fmt(v: float) -> str:
    return f"{v:.4g}" if abs(v) < 1e5 else f"{v:,.0f}"


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [f"### {report['title']}", "",
             f"{report['date']} · {m['cpu']} · {m['threads']} threads · torch {m['torch']} · bertforge {m['bertforge']}"
             f" · devices: {', '.join(m['devices'])}", "",
             "| benchmark | metric | median | min | max | n |", "|---|---|---|---|---|---|"]
    for res in report["results"]:
        if res.get("error"):
            lines.append(f"| {res['name']} | **failed** | {res['error'][:120]} | | | |")
        for metric, s in res["metrics"].items():
            lines.append(f"| {res['name']} | {metric} | {_fmt(s['median'])} | {_fmt(s['min'])} | {_fmt(s['max'])} | {s['n']} |")
    if report["ratios"]:
        lines += ["", "| ratio | = | metric | value | target | met |", "|---|---|---|---|---|---|"]
        for r in report["ratios"]:
            value = "n/a" if r["value"] is None else f"{r['value']:.2f}×"
            target = "" if r["target"] is None else ("≤ " if r["lower_is_better"] else "≥ ") + f"{r['target']}×"
            met = {True: "yes", False: "**no**", None: ""}[r["met"]]
            lines.append(f"| {r['name']} | {r['num']} / {r['den']} | {r['metric']} | {value} | {target} | {met} |")
    return "\n".join(lines) + "\n"


def write_outputs(report: dict[str, Any], json_out: str | None, md_out: str | None) -> None:
    for path, text in ((json_out, json.dumps(report, indent=1)), (md_out, markdown(report))):
        if path:
            p = Path(path)
            p.parent.mkdir(parents=True, exist_ok=True)
            tmp = p.with_name(p.name + ".tmp")
            tmp.write_text(text, encoding="utf-8")
            tmp.replace(p)
