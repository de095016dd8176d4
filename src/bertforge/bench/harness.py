"""Benchmark harness: named callables with parameters, repeated, summarised; ratios measured in one run.

A spec is YAML:

    title: Model training step, ours vs Hugging Face
    repeat: 3                  # default repeats (each benchmark may override)
    warmup: 1                  # untimed calls before the repeats
    interleave: false          # true: repeats round-robin across the benchmarks (see below)
    requires: cuda             # optional: refused where there is no CUDA GPU (accelerator: any but the CPU)
    benchmarks:
      - name: hf_tiny_fp32
        fn: bertforge.bench.step:train_step       # module:function
        params: {impl: hf, preset: tiny, precision: fp32}
      - name: ours_tiny_fp32
        fn: bertforge.bench.step:train_step
        params: {impl: ours, preset: tiny, precision: fp32}
    ratios:
      - {name: tiny_fp32_speedup, num: ours_tiny_fp32, den: hf_tiny_fp32, metric: seq_per_s, target: 4.0}

A benchmark callable runs once per repeat and returns a dict of metrics (floats, e.g. `seq_per_s`, `mfu`);
the harness adds `wall_s`, the call's wall time. Each metric is summarised as median / min / max over the
repeats. A ratio divides the numerator's median by the denominator's median for one metric; `target`, when
given, is the value the ratio must reach (or, with `lower_is_better: true`, stay under).

On a machine whose speed drifts (a VM sharing memory bandwidth with neighbours), running all repeats of one
benchmark before the next lets a drift land on one side of a ratio. `interleave: true` (or `--interleave`)
runs every warm-up first, then round r calls each benchmark once, so both sides of a ratio see the same
conditions; ratios then also report the median of the per-round ratios (`paired`) and their range.

`concurrent: true` (or `--concurrent`) runs every benchmark at the same time, each in a fresh process of its own
(give each a `threads` parameter so they share the cores fairly). It is for long one-shot runs — a fine-tuning
run per side — where the baseline cannot use a second core anyway: both sides see the same machine over the
same hours, and the whole spec takes as long as its slowest entry instead of the sum.

Long specs on a machine lent for a bounded time: `--json` is rewritten after every finished benchmark (or
interleaved round), so a run killed from outside keeps what it measured; `--stop-after S` starts no benchmark
after S seconds and reports the rest as not run; `--resume` reads the `--json` report of an earlier run of the
same spec on the same machine kind (devices, CPU, thread count, torch) and the same git commit where both runs
know theirs, and runs only what it lacks (entries that failed, did not finish, or whose params or warm-up
changed). A ratio with a side that failed or stopped short has no value (`why` says which); one whose sides
come from different runs says so (`across_runs`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import importlib
import inspect
import math
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from bertforge.errors import UserError
from bertforge.runtime.io import strict_json, write_text

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
    interleave: bool = False
    concurrent: bool = False
    requires: str | None = None
    """`cuda`: the spec measures a CUDA GPU and is refused on a machine without one (instead of running
    BERT-large on the CPU for hours); `accelerator`: any device but the CPU."""


REQUIREMENTS = ("cuda", "accelerator")


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
    from bertforge.config import read_yaml

    path = find_spec(name_or_path)
    raw = read_yaml(path, f"benchmark spec {path}", "fix it or pass another --spec") or {}
    if not isinstance(raw, dict):
        raise UserError(
            f"benchmark spec {path}: expected a mapping with `benchmarks:` (a list), found a {type(raw).__name__}"
        )
    known = {"title", "repeat", "warmup", "interleave", "concurrent", "requires", "benchmarks", "ratios", "notes"}
    unknown = set(raw) - known
    if unknown:
        raise UserError(f"benchmark spec {path}: unknown top-level keys {sorted(unknown, key=str)}")
    repeat, warmup = _count(raw, "repeat", 3, path, least=1), _count(raw, "warmup", 1, path)
    benches = [_bench(b, i, repeat, warmup, path) for i, b in enumerate(_listed(raw, "benchmarks", path))]
    if not benches:
        raise UserError(f"benchmark spec {path}: `benchmarks` lists nothing to measure")
    names = [b.name for b in benches]
    if len(set(names)) != len(names):
        raise UserError(f"benchmark spec {path}: benchmark names must be unique")
    ratios = [_ratio(r, i, names, path) for i, r in enumerate(_listed(raw, "ratios", path))]
    return Spec(
        str(raw.get("title", path.stem)),
        path,
        benches,
        ratios,
        _switch(raw, "interleave", path),
        _switch(raw, "concurrent", path),
        _requires(raw, path),
    )


def _switch(raw: dict[str, Any], key: str, where: Path | str) -> bool:
    """A yes/no key: YAML's true or false only (bool("no") would be True)."""
    v = raw.get(key, False)
    if not isinstance(v, bool):
        raise UserError(f"benchmark spec {where}: `{key}` must be true or false, not {v!r}")
    return v


def _requires(raw: dict[str, Any], path: Path) -> str | None:
    value = raw.get("requires")
    if value is not None and value not in REQUIREMENTS:
        raise UserError(f"benchmark spec {path}: `requires` must be one of {', '.join(REQUIREMENTS)}, not {value!r}")
    return value


def check_requires(spec: Spec) -> None:
    """Refuse a spec whose device this machine lacks, before anything runs."""
    from bertforge import device as dev

    if spec.requires is None:
        return
    types = {d["device"].split(":")[0] for d in dev.available_devices()}
    if not ("cuda" in types if spec.requires == "cuda" else types - {"cpu"}):
        what = "a CUDA GPU" if spec.requires == "cuda" else "a GPU or other accelerator"
        raise UserError(
            f"benchmark spec {spec.path} measures {what} (requires: {spec.requires}) and this machine has none; "
            "run it where one is (scripts/bench_gpu.sh)"
        )


def _listed(raw: dict[str, Any], key: str, path: Path) -> list[Any]:
    items = raw.get(key) or []
    if not isinstance(items, list):
        raise UserError(f"benchmark spec {path}: `{key}` must be a list, not a {type(items).__name__}")
    return items


def _count(raw: dict[str, Any], key: str, default: int, where: Path | str, least: int = 0) -> int:
    v = raw.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < least:
        raise UserError(f"benchmark spec {where}: `{key}` must be a whole number >= {least}, not {v!r}")
    return v


BENCH_KEYS = ("name", "fn", "params", "repeat", "warmup")


def _bench(b: Any, i: int, repeat: int, warmup: int, path: Path) -> BenchSpec:
    if not isinstance(b, dict) or "name" not in b or "fn" not in b:
        raise UserError(f"benchmark spec {path}: benchmarks[{i}] needs a name and an fn (module:function)")
    if unknown := [str(k) for k in b if k not in BENCH_KEYS]:
        raise UserError(
            f"benchmark spec {path}: benchmarks[{i}] has unknown keys {', '.join(unknown)} "
            f"(an entry's keys: {', '.join(BENCH_KEYS)})"
        )
    params = b.get("params") or {}
    if not isinstance(params, dict):
        raise UserError(f"benchmark spec {path}: benchmarks[{i}].params must be a mapping")
    where = f"{path} benchmarks[{i}]"
    return BenchSpec(
        str(b["name"]),
        str(b["fn"]),
        dict(params),
        _count(b, "repeat", repeat, where, least=1),
        _count(b, "warmup", warmup, where),
    )


def _ratio(r: Any, i: int, names: list[str], path: Path) -> RatioSpec:
    fields = {f.name for f in dataclasses.fields(RatioSpec)}
    if not isinstance(r, dict) or not {"name", "num", "den", "metric"} <= set(r) or set(r) - fields:
        raise UserError(
            f"benchmark spec {path}: ratios[{i}] needs name, num, den and metric (optional: target, "
            "lower_is_better) and nothing else"
        )
    ratio = RatioSpec(**r)
    t = ratio.target
    if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t)):
        raise UserError(f"benchmark spec {path}: ratio {ratio.name!r}: `target` must be a number, not {t!r}")
    if not isinstance(ratio.lower_is_better, bool):
        raise UserError(
            f"benchmark spec {path}: ratio {ratio.name!r}: `lower_is_better` must be true or false, "
            f"not {ratio.lower_is_better!r}"
        )
    for side in (ratio.num, ratio.den):
        if side not in names:
            raise UserError(f"benchmark spec {path}: ratio {ratio.name!r} names unknown benchmark {side!r}")
    return ratio


def resolve_fn(target: str) -> Callable[..., dict[str, float] | None]:
    module, _, name = target.partition(":")
    if not name:
        raise UserError(f"benchmark fn {target!r} must be module:function")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise UserError(f"benchmark fn {target!r} cannot be loaded: {e}") from None


def check_params(b: BenchSpec, path: Path, strict: bool = True) -> None:
    """The entry's params fit its fn's signature, or one line naming both (`strict`; otherwise, for an entry
    not selected to run, only the conversion). YAML reads 1e-2 as text: a param annotated float takes it as the
    number (float's own parsing)."""
    try:
        sig = inspect.signature(resolve_fn(b.fn))
    except UserError:
        if strict:
            raise
        return
    for name, value in b.params.items():
        hint = sig.parameters[name].annotation if name in sig.parameters else None
        floats = hint is float or (isinstance(hint, str) and hint.split("|")[0].strip() == "float")
        if isinstance(value, str) and floats:
            with contextlib.suppress(ValueError):  # not a number: the callable says what it makes of it
                b.params[name] = float(value)
    if not strict:
        return
    try:
        sig.bind(**b.params)
    except TypeError as e:
        raise UserError(f"benchmark spec {path}: {b.name}'s params do not fit {b.fn}{sig}: {e}") from None


def summarise(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


class _Runner:
    """One benchmark's warm-up and timed calls, with its samples so far."""

    def __init__(self, b: BenchSpec, progress: Callable[[str], None]):
        self.b, self.progress, self.fn = b, progress, resolve_fn(b.fn)
        self.samples: dict[str, list[float]] = {}
        self.done = 0
        self.error: str | None = None

    def call(self) -> dict[str, float] | None:
        """One call of the benchmark. torch's thread count is put back after it: a callable with a `threads`
        parameter sets it for the whole process, and every later entry ran (and the report said) that many."""
        from bertforge import device as dev

        with dev.threads(None):
            return self.fn(**self.b.params)

    def warmup(self) -> None:
        for _ in range(self.b.warmup):
            self.call()

    def once(self) -> None:
        t0 = time.perf_counter()
        metrics = self.call() or {}
        metrics = {"wall_s": time.perf_counter() - t0, **{k: float(v) for k, v in metrics.items()}}
        for k, v in metrics.items():
            self.samples.setdefault(k, []).append(v)
        self.done += 1
        shown = ", ".join(f"{k} {v:.4g}" for k, v in metrics.items())
        self.progress(f"  {self.b.name} [{self.done}/{self.b.repeat}] {shown}")

    def all_repeats(self) -> None:
        self.warmup()
        for _ in range(self.b.repeat):
            self.once()

    def attempt(self, call: Callable[[], None]) -> None:
        try:
            call()
        except Exception as e:  # one broken entry must not throw away the others' measurements
            self.progress(f"  {self.b.name} FAILED: {type(e).__name__}: {e}")
            self.error = f"{type(e).__name__}: {e}"

    def result(self) -> dict[str, Any]:
        out = {
            "name": self.b.name,
            "fn": self.b.fn,
            "params": self.b.params,
            "warmup": self.b.warmup,  # --resume keeps an entry only when measured after as many untimed calls
            "metrics": {k: summarise(v) for k, v in self.samples.items()},
            "samples": self.samples,
        }
        return {**out, "error": self.error} if self.error else out


class SetupCache:
    """What benchmark callables build once and reuse across calls (models, optimizers, batches), keyed by their
    parameters. It keeps the `keep` most recently used: with interleaved repeats both sides of a ratio stay
    set up and warm, while a long spec never holds more than a couple of models (base + AdamW ~1.3 GB)."""

    def __init__(self, keep: int = 2):
        self.keep = keep
        self.items: dict[Any, Any] = {}

    def get(self, key: Any, build: Callable[[], Any]) -> Any:
        if key in self.items:
            self.items[key] = self.items.pop(key)  # most recently used last
            return self.items[key]
        while len(self.items) >= self.keep:
            del self.items[next(iter(self.items))]
        self.items[key] = build()
        return self.items[key]


def _unusable(res: dict[str, Any]) -> str | None:
    """Why an entry's medians cannot stand for it (a failed or time-limited entry keeps the samples it took
    before it stopped), or None."""
    if res.get("error"):
        return "failed"
    if res.get("not_run"):
        return "was not run"
    if res.get("incomplete"):
        return f"stopped after {min((s['n'] for s in res['metrics'].values()), default=0)} of its repeats"
    return None


def compute_ratio(r: RatioSpec, results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The ratio of the two sides' medians, or value None with `why` when a side failed, stopped short of its
    repeats or lacks the metric (a ratio of a failed baseline's partial samples used to be reported as met)."""
    unmeasured = {**dataclasses.asdict(r), "value": None, "met": None}
    for side in (r.num, r.den):
        if why := _unusable(results[side]):
            return {**unmeasured, "why": f"{side} {why}"}
        if r.metric not in results[side]["metrics"]:
            return {**unmeasured, "why": f"{side} reported no {r.metric}"}
    num = results[r.num]["metrics"][r.metric]["median"]
    den = results[r.den]["metrics"][r.metric]["median"]
    if not den:  # 0/0 read as an infinite speed-up, "met"
        return {**unmeasured, "why": f"{r.den}'s {r.metric} is 0"}
    value = num / den
    met = None
    if r.target is not None:
        met = value <= r.target if r.lower_is_better else value >= r.target
    out = {**dataclasses.asdict(r), "value": value, "met": met}
    same_run = results[r.num].get("kept_from") == results[r.den].get("kept_from")
    if not same_run:  # --resume: one side kept from an earlier run (same spec, machine kind and commit)
        out["across_runs"] = True
    if results[r.num].get("interleaved") and results[r.den].get("interleaved") and same_run:
        # round i of the numerator ran next to round i of the denominator: their ratio cancels slow drifts
        pairs = [a / b for a, b in zip(results[r.num]["samples"][r.metric], results[r.den]["samples"][r.metric]) if b]
        if pairs:
            out["paired"] = summarise(pairs)
    return out


def machine() -> dict[str, Any]:
    import torch

    from bertforge import __version__
    from bertforge import device as dev

    return {
        "cpu": dev.cpu_model(),
        "cpu_id": cpu_id(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "bertforge": __version__,
        **source_version(),
        "python": platform.python_version(),
        "devices": [d["name"] for d in dev.available_devices()],
    }


def cpu_id() -> str | None:
    """The CPU's family and model numbers and whether it has native bf16: a VM's model name can be just "AMD
    EPYC" on Zen 3 and Zen 4 alike (docs/BENCHMARKS.md), whose bf16 speeds differ by 400x. None off Linux."""
    from bertforge import device as dev

    fields = dev.cpuinfo_fields()
    if "cpu family" not in fields or "model" not in fields:
        return None
    bf16 = "native bf16" if dev.cpu_has_native_bf16() else "no native bf16"
    return f"family {fields['cpu family']} model {fields['model']}, {bf16}"


def source_version() -> dict[str, str | None]:
    """`commit`: the checkout's HEAD (short hash), for the reader; `source`: the tree of its src/ (short hash),
    `-dirty` when tracked files under src/ have uncommitted changes: what `--resume` compares, so that a report or
    a doc committed between two calls does not refuse the resume, and code that changed does. Both None outside a
    git checkout (an installed wheel, a lent machine's copy of the tree): the version number stays the same across
    commits that change what a benchmark measures."""
    import subprocess

    root = Path(__file__).resolve().parents[3]
    if not (root / ".git").exists():  # not a checkout: git would answer for whatever repository encloses it
        return {"commit": None, "source": None}

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):  # no git installed, or a stuck filesystem
            return None
        return done.stdout.strip() or None if done.returncode == 0 else None

    tree = git("rev-parse", "--short=12", "HEAD:src")
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "src")
    return {"commit": git("rev-parse", "--short=12", "HEAD"), "source": tree and tree + ("-dirty" if dirty else "")}


def run_spec(
    spec: Spec,
    only: list[str] | None = None,
    progress: Callable[[str], None] = print,
    interleave: bool | None = None,
    concurrent: bool | None = None,
    stop_after: float | None = None,
    previous: dict[str, Any] | None = None,
    on_update: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run the selected benchmarks and return the report. `stop_after`: seconds after which no benchmark (or
    interleaved round) starts; the rest are reported as not run. `previous`: an earlier report of this spec
    (`--resume`) whose finished entries with the same fn and params are kept, not run again. `on_update`: called
    with the report so far after every finished benchmark or round, so a run killed from outside keeps them."""
    check_requires(spec)
    selected = [b for b in spec.benchmarks if not only or b.name in only or any(o in b.name for o in only)]
    if only and not selected:
        raise UserError(
            f"--only {only}: no benchmark of {spec.path} matches; names: {', '.join(b.name for b in spec.benchmarks)}"
        )
    interleave = spec.interleave if interleave is None else interleave
    concurrent = spec.concurrent if concurrent is None else concurrent
    if interleave and concurrent:
        raise UserError("a spec runs either interleaved or concurrent, not both")
    for b in spec.benchmarks:  # a misspelt parameter of the last entry fails now, not after hours of the others
        check_params(b, spec.path, strict=b in selected)  # before --resume compares params: 1e-3 as the float
    kept = _kept_results(previous, spec.benchmarks, concurrent) if previous else {}
    for name, res in kept.items():
        if any(b.name == name for b in selected):
            progress(f"{name}: kept from the earlier run of {res['kept_from']}")
    runners = [_Runner(b, progress) for b in selected if b.name not in kept]
    clock = _Clock(stop_after)
    date = _dt.datetime.now().astimezone().isoformat(timespec="seconds")  # with its UTC offset: true anywhere
    measured_on = machine()  # at the start: the commit whose code runs, not one checked out during the run

    def update() -> None:
        if on_update:
            on_update(_report(spec, selected, kept, runners, date, interleave, concurrent, measured_on))

    if concurrent:  # all start at once: the time limit can only keep them from starting at all
        if not clock.up():
            for r in runners:
                progress(f"{r.b.name}: {r.b.fn} {r.b.params} (own process, concurrent)")
            _run_concurrent(runners, update)
    else:
        (_run_interleaved if interleave else _run_in_turn)(runners, clock, progress, update)
    report = _report(spec, selected, kept, runners, date, interleave, concurrent, measured_on)
    if report["not_run"]:
        progress(f"stopped at --stop-after {stop_after} s; not run: {', '.join(report['not_run'])}")
    return report


class _Clock:
    """`--stop-after`: whether the time for starting benchmarks is up."""

    def __init__(self, seconds: float | None):
        self.end = None if seconds is None else time.monotonic() + seconds

    def up(self) -> bool:
        return self.end is not None and time.monotonic() >= self.end


def _run_in_turn(
    runners: list[_Runner], clock: _Clock, progress: Callable[[str], None], update: Callable[[], None]
) -> None:
    """Every repeat of one benchmark, then the next."""
    for r in runners:
        if clock.up():
            break
        progress(f"{r.b.name}: {r.b.fn} {r.b.params}")
        r.attempt(r.all_repeats)
        update()


def _run_interleaved(
    runners: list[_Runner], clock: _Clock, progress: Callable[[str], None], update: Callable[[], None]
) -> None:
    """Every warm-up first, then round r calls each benchmark once (see the module docstring)."""
    warm = []
    for r in runners:
        if clock.up():
            break
        progress(f"{r.b.name}: {r.b.fn} {r.b.params} (warm-up)")
        r.attempt(r.warmup)
        warm.append(r)
    for i in range(max((r.b.repeat for r in warm), default=0)):
        if clock.up():
            break
        progress(f"round {i + 1}")
        for r in warm:
            if r.error is None and r.done < r.b.repeat:
                r.attempt(r.once)
        update()


def _kept_results(
    previous: dict[str, Any], benches: list[BenchSpec], concurrent: bool = False
) -> dict[str, dict[str, Any]]:
    """The earlier report's entries that finished every repeat without error, with this spec's fn, params and
    warm-up, measured alone or concurrently as this run measures (those that --only leaves out stay in the
    report too)."""
    wanted = {b.name: b for b in benches}
    kept = {}
    for res in previous.get("results", []):
        b = wanted.get(res.get("name"))
        if b is None or res.get("error") or res.get("fn") != b.fn or res.get("params") != b.params:
            continue
        if res.get("warmup", b.warmup) != b.warmup:  # a raised warm-up: the old medians may hold compilation
            continue
        if bool(res.get("concurrent")) != concurrent:  # sharing the machine with the other entries, or not
            continue
        repeats = min((s["n"] for s in res.get("metrics", {}).values()), default=0)
        if repeats >= b.repeat:  # every repeat finished (not stopped at a time limit)
            commit = res.get("commit", previous.get("machine", {}).get("commit"))
            kept[b.name] = {**res, "kept_from": res.get("kept_from", previous.get("date", "?")), "commit": commit}
    return kept


def _report(
    spec: Spec,
    selected: list[BenchSpec],
    kept: dict[str, dict[str, Any]],
    runners: list[_Runner],
    date: str,
    interleave: bool,
    concurrent: bool,
    measured_on: dict[str, Any],
) -> dict[str, Any]:
    ran = {r.b.name: r for r in runners}
    chosen = {b.name for b in selected}
    results: dict[str, dict[str, Any]] = {}
    for b in spec.benchmarks:
        if b.name not in chosen and b.name not in kept:
            continue  # neither run now nor measured before
        if b.name in kept:
            results[b.name] = kept[b.name]
            continue
        r = ran[b.name]
        res = r.result()
        if interleave:
            res["interleaved"] = True
        if concurrent:
            res["concurrent"] = True
        if r.error is None and r.done < r.b.repeat:
            res["not_run" if r.done == 0 else "incomplete"] = True
        results[b.name] = res
    ratios = [compute_ratio(r, results) for r in spec.ratios if r.num in results and r.den in results]
    return {
        "title": spec.title,
        "spec": str(spec.path),
        "date": date,
        "machine": measured_on,
        "results": list(results.values()),
        "ratios": ratios,
        "not_run": [n for n, res in results.items() if res.get("not_run") or res.get("incomplete")],
    }


def check_resumable(previous: dict[str, Any], spec: Spec, path: str) -> None:
    """An earlier report may only be resumed by the same spec on the same kind of machine: medians measured
    on different devices or torch versions must not share a table."""
    if "results" not in previous:
        raise UserError(
            f"--resume: {path} is not a report written by `bertforge bench --json`; delete it or choose another --json"
        )
    if Path(previous.get("spec", "")).stem != spec.path.stem:
        raise UserError(
            f"--resume: {path} is a report of {previous.get('spec')}, not of {spec.path}; choose another --json"
        )
    then, now = previous.get("machine", {}), machine()
    for key in ("devices", "torch", "cpu", "cpu_id", "threads", "source"):
        if key in ("cpu_id", "source") and (then.get(key) is None or now[key] is None):
            continue  # an older report, another OS, or a tree without git (a lent machine's copy): nothing to compare
        if key == "threads" and "cpu_id" not in then:
            continue  # a report from before: an entry's own thread count (threads: 1) was recorded as the machine's
        if then.get(key) != now[key]:
            raise UserError(
                f"--resume: {path} was measured with {key} {then.get(key)!r}, this machine has {now[key]!r}; "
                "run without --resume or choose another --json"
            )


def _run_concurrent(runners: list[_Runner], update: Callable[[], None]) -> None:
    """Each runner's benchmark in a spawned process of its own, all at once. A process per entry, not a pool: a
    finished entry's process exits and gives its memory back while the others still run (a pool keeps its idle
    workers, gigabytes each after a fine-tuning run), and one process dying (killed, out of memory) fails only its
    own entry (a broken pool fails every pending one)."""
    import multiprocessing
    import multiprocessing.connection

    ctx = multiprocessing.get_context("spawn")
    pending: dict[Any, tuple[_Runner, Any]] = {}  # receiving end -> (runner, its process)
    try:
        for r in runners:
            recv, send = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_run_alone, args=(r.b, send), name=f"bench-{r.b.name}")
            p.start()
            send.close()  # the child holds the only write end now: its death reads as EOF here
            pending[recv] = (r, p)
        while pending:  # read whichever finishes first, so no child waits on a full pipe before it can exit
            ready = cast(list, multiprocessing.connection.wait(list(pending)))  # some of the connections given
            for recv in ready:
                r, p = pending.pop(recv)
                _collect(r, p, recv)
            update()  # the report so far: a run stopped from outside keeps the entries that finished
    finally:  # an interrupt: the children still running would hold the machine for hours
        for recv, (_, p) in pending.items():
            p.terminate()
            p.join()
            recv.close()


def _collect(r: _Runner, p: Any, recv: Any) -> None:
    """A finished child's samples into its runner, or the way it died as the runner's error."""
    with recv:
        try:
            result = recv.recv()
        except EOFError:  # died without sending
            result = None
    p.join()
    if result is None:
        code = p.exitcode or 0  # set once joined
        why = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
        hint = " (signal 9: often the out-of-memory killer; see dmesg)" if code == -9 else ""
        r.error = f"the benchmark's process died: {why}{hint}"
    else:
        r.samples, r.done, r.error = result


def _run_alone(b: BenchSpec, send) -> None:
    """A concurrent spec's entry, in its own process: warm-up and repeats, sent back through `send`; progress goes to
    this process's stdout."""
    r = _Runner(b, lambda line: print(line, flush=True))
    try:
        r.attempt(r.all_repeats)
        send.send((r.samples, r.done, r.error))
    except (BrokenPipeError, KeyboardInterrupt):
        return  # the parent stopped (an interrupt reaches the whole process group): nobody reads the result
    finally:
        send.close()


def _fmt(v: float) -> str:
    return f"{v:.4g}" if abs(v) < 1e5 else f"{v:,.0f}"


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    cpu = f"{m['cpu']} ({m['cpu_id']})" if m.get("cpu_id") else m["cpu"]
    lines = [
        f"### {report['title']}",
        "",
        f"{report['date']} · {cpu} · {m['threads']} threads · torch {m['torch']} · bertforge {m['bertforge']}"
        + (f" (commit {m['commit']})" if m.get("commit") else "")
        + f" · devices: {', '.join(m['devices'])}"
        + (
            " · concurrent: every benchmark in its own process, at once"
            if any(r.get("concurrent") for r in report["results"])
            else ""
        ),
        "",
        "| benchmark | metric | median | min | max | n |",
        "|---|---|---|---|---|---|",
    ]
    for res in report["results"]:
        if res.get("error"):
            # one table row: a child's traceback in the message (newlines, `|`) used to break the table
            error = " ".join(res["error"].split())[:120].replace("|", "\\|")
            lines.append(f"| {res['name']} | **failed** | {error} | | | |")
        elif res.get("not_run"):
            lines.append(f"| {res['name']} | **not run** | time limit (--stop-after) | | | |")
        elif res.get("incomplete"):
            lines.append(f"| {res['name']} | **incomplete** | stopped at the time limit (--stop-after) | | | |")
        for metric, s in res["metrics"].items():
            lines.append(
                f"| {res['name']} | {metric} | {_fmt(s['median'])} | {_fmt(s['min'])} | {_fmt(s['max'])} | {s['n']} |"
            )
    kept = sorted(
        {
            f"{r['name']} ({r['kept_from']}{', commit ' + r['commit'] if r.get('commit') else ''})"
            for r in report["results"]
            if r.get("kept_from")
        }
    )
    if kept:
        lines += ["", f"Kept from earlier runs of this spec (--resume): {', '.join(kept)}."]
    if report["ratios"]:
        lines += ["", "| ratio | = | metric | value | target | met |", "|---|---|---|---|---|---|"]
        for r in report["ratios"]:
            value = f"n/a ({r['why']})" if r.get("why") else "n/a" if r["value"] is None else f"{r['value']:.2f}×"
            if r.get("across_runs"):
                value += " (sides from different runs)"
            if r.get("paired"):
                pr = r["paired"]
                value += f" (paired {pr['median']:.2f}×, {pr['min']:.2f}–{pr['max']:.2f})"
            target = "" if r["target"] is None else ("≤ " if r["lower_is_better"] else "≥ ") + f"{r['target']}×"
            met = {True: "yes", False: "**no**", None: ""}[r["met"]]
            lines.append(f"| {r['name']} | {r['num']} / {r['den']} | {r['metric']} | {value} | {target} | {met} |")
    return "\n".join(lines) + "\n"


def write_outputs(report: dict[str, Any], json_out: str | None, md_out: str | None) -> None:
    for path, text in ((json_out, strict_json(report, indent=1)), (md_out, markdown(report))):
        if path:
            p = Path(path)
            p.parent.mkdir(parents=True, exist_ok=True)
            write_text(p, text)
