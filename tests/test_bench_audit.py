"""The benchmark harness's honesty: ratios only of entries that finished, `--resume` only within one commit,
thread count and warm-up, a date that says its zone; `pretrain_loop`'s warm-up windows and failure messages."""

import datetime
import json
import subprocess

import pytest

from bertforge.bench import harness, selftest
from bertforge.bench import pretrain_loop as pl
from bertforge.cli import main
from bertforge.errors import UserError


def _spec(tmp_path, text):
    p = tmp_path / "spec.yml"
    p.write_text(text)
    return harness.load_spec(str(p))


def test_a_ratio_of_a_failed_or_stopped_side_is_not_reported_as_measured(tmp_path, monkeypatch):
    """A baseline that fails on its second repeat keeps its first sample: the ratio of that was shown, "met"."""
    calls = {"n": 0}

    def flaky(seconds: float = 0.0):
        calls["n"] += 1
        if calls["n"] > 1:
            raise RuntimeError("out of memory")
        return {"slept_s": seconds}

    monkeypatch.setattr(selftest, "flaky", flaky, raising=False)
    spec = _spec(
        tmp_path,
        "repeat: 3\nwarmup: 0\nbenchmarks:\n"
        "  - {name: ours, fn: 'bertforge.bench.selftest:sleep', params: {seconds: 0.02}}\n"
        "  - {name: base, fn: 'bertforge.bench.selftest:flaky', params: {seconds: 0.01}}\n"
        "ratios:\n  - {name: r, num: ours, den: base, metric: slept_s, target: 1.5}\n",
    )
    report = harness.run_spec(spec, progress=lambda s: None)
    (ratio,) = report["ratios"]
    assert ratio["value"] is None and ratio["met"] is None and ratio["why"] == "base failed"
    assert "n/a (base failed)" in harness.markdown(report)

    # interleaved rounds stopped by --stop-after: one round of three is no median of the configured repeats
    spec = _spec(
        tmp_path,
        "repeat: 3\nwarmup: 0\ninterleave: true\nbenchmarks:\n"
        "  - {name: a, fn: 'bertforge.bench.selftest:sleep', params: {seconds: 0.2}}\n"
        "  - {name: b, fn: 'bertforge.bench.selftest:sleep', params: {seconds: 0.1}}\n"
        "ratios:\n  - {name: r, num: a, den: b, metric: slept_s}\n",
    )
    report = harness.run_spec(spec, progress=lambda s: None, stop_after=0.15)
    assert report["ratios"][0]["value"] is None and "stopped after 1 of its repeats" in report["ratios"][0]["why"]


def test_a_zero_baseline_is_no_infinite_ratio(tmp_path):
    spec = _spec(
        tmp_path,
        "repeat: 1\nwarmup: 0\nbenchmarks:\n"
        "  - {name: a, fn: 'bertforge.bench.selftest:sleep', params: {seconds: 0.0}}\n"
        "  - {name: b, fn: 'bertforge.bench.selftest:sleep', params: {seconds: 0.0}}\n"
        "ratios:\n  - {name: r, num: a, den: b, metric: slept_s, target: 2.0}\n",
    )
    ratio = harness.run_spec(spec, progress=lambda s: None)["ratios"][0]
    assert ratio["value"] is None and ratio["met"] is None and "is 0" in ratio["why"]


def _bench(spec, out, *extra):
    return main(["bench", "--spec", str(spec), "--json", str(out), *extra])


SPEC = (
    "repeat: 1\nwarmup: 0\nbenchmarks:\n"
    "  - {name: a, fn: 'bertforge.bench.selftest:sleep', params: {seconds: 0.01}}\n"
    "  - {name: b, fn: 'bertforge.bench.selftest:sleep', params: {seconds: 0.02}}\n"
    "ratios:\n  - {name: r, num: b, den: a, metric: slept_s}\n"
)


def test_resume_refuses_a_report_of_another_commit_cpu_or_thread_count(tmp_path, monkeypatch, capsys):
    """The CPU's model name alone ("AMD EPYC") is the same on the Zen 3 and the Zen 4 that served as one VM."""
    monkeypatch.setattr(harness, "source_version", lambda: {"commit": "abc123", "source": "tree1"}, raising=False)
    monkeypatch.setattr(harness, "cpu_id", lambda: "family 25 model 17, native bf16", raising=False)
    spec, out = tmp_path / "spec.yml", tmp_path / "r.json"
    spec.write_text(SPEC)
    assert _bench(spec, out, "--only", "a") == 0
    report = json.loads(out.read_text())
    assert report["machine"]["commit"] == "abc123" and "(commit abc123)" in harness.markdown(report)
    assert "AMD" not in report["machine"]["cpu_id"] and "(family 25 model 17, native bf16)" in harness.markdown(report)
    other_cpu = ("cpu_id", "family 25 model 1, no native bf16")
    for key, value in (("source", "tree2"), ("threads", report["machine"]["threads"] + 1), other_cpu):
        changed = json.loads(json.dumps(report))
        changed["machine"][key] = value
        out.write_text(json.dumps(changed))
        assert _bench(spec, out, "--resume") == 2
        assert f"measured with {key}" in capsys.readouterr().err
    unknown = json.loads(json.dumps(report))
    unknown["machine"].update(commit=None, source=None)  # measured where the tree had no git (a lent machine's copy)
    out.write_text(json.dumps(unknown))
    assert _bench(spec, out, "--resume") == 0
    kept, ran = json.loads(out.read_text())["results"]
    assert kept["kept_from"] == report["date"] and kept["commit"] is None and "kept_from" not in ran
    resumed = json.loads(out.read_text())
    assert resumed["ratios"][0]["across_runs"] is True
    assert "(sides from different runs)" in harness.markdown(resumed)


def test_resume_measures_again_an_entry_whose_warmup_changed(tmp_path):
    spec, out = tmp_path / "spec.yml", tmp_path / "r.json"
    spec.write_text(SPEC)
    assert _bench(spec, out) == 0
    spec.write_text(SPEC.replace("warmup: 0", "warmup: 2"))  # the first calls compiled: warm up, then measure
    assert _bench(spec, out, "--resume") == 0
    results = json.loads(out.read_text())["results"]
    assert [r.get("kept_from") for r in results] == [None, None] and [r["warmup"] for r in results] == [2, 2]


def test_the_report_date_names_its_zone(tmp_path):
    spec = _spec(tmp_path, SPEC)
    report = harness.run_spec(spec, progress=lambda s: None)
    assert datetime.datetime.fromisoformat(report["date"]).utcoffset() is not None


def test_the_commit_is_the_checkouts(tmp_path):
    from pathlib import Path

    root = Path(harness.__file__).resolve().parents[3]
    if not (root / ".git").exists():
        assert harness.source_version() == {"commit": None, "source": None}
        return
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    tree = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD:src"], capture_output=True, text=True).stdout
    version = harness.source_version()
    assert head.startswith(version["commit"]) and tree.startswith(version["source"].removesuffix("-dirty"))


# ---------------------------------------------------------------------------------------- pretrain_loop
def test_loop_windows_that_straddle_the_warmup_are_not_measured():
    """log_every 10 and 8 warm-up steps: the row of step 10 timed steps 1..10, the compiling first one too."""
    rows = [
        {"step": s, "seq_per_s": v, "rows_per_s": v, "window_s": 10 / v, "loss": 9.0}
        for s, v in ((10, 1.0), (20, 100.0), (30, 102.0))
    ]
    out = pl.summarise(rows, warmup_steps=8)
    assert out["seq_per_s"] == 101.0 and out["steps_measured"] == 20 and out["rows_per_update"] == 1.0
    assert pl.summarise(rows, warmup_steps=10)["steps_measured"] == 20  # a window from step 10 on counts
    with pytest.raises(UserError, match="no logged window starts after"):
        pl.summarise(rows, warmup_steps=25)


def _failing_run(exc=None, stderr=""):
    def run(cmd, **kw):
        if exc is not None:
            raise exc
        return subprocess.CompletedProcess(cmd, 2, "", stderr)

    return run


def test_loop_failures_name_their_cause_first(monkeypatch):
    """A report's table shows an error's first 120 characters: a timeout's command line or the middle of a
    traceback hid the cause."""
    kw = dict(preset="base", seq_len=64, max_pred=8, micro_batch=2, steps=2, warmup_steps=1, device="cpu")
    monkeypatch.setattr(pl.subprocess, "run", _failing_run(subprocess.TimeoutExpired(["python"] * 50, 7)))
    with pytest.raises(RuntimeError, match=r"^bertforge pretrain did not finish within timeout_s=7 s"):
        pl.loop(**kw, timeout_s=7)
    stderr = "Traceback (most recent call last):\n" + "  a frame\n" * 500 + "bertforge pretrain: error: no preset x\n"
    monkeypatch.setattr(pl.subprocess, "run", _failing_run(stderr=stderr))
    with pytest.raises(RuntimeError, match=r"^bertforge pretrain failed \(2\): bertforge pretrain: error: no preset x"):
        pl.loop(**kw)


def test_hf_loop_with_no_step_after_the_warmup_is_one_line_and_claims_no_cpu_peak_memory(monkeypatch):
    from bertforge.bench import baseline

    # the loop's bookkeeping only: Hugging Face's model and step cost seconds on a loaded 2-core machine
    monkeypatch.setattr(baseline, "hf_pretraining", lambda config, where: (object(), object()))
    monkeypatch.setattr(baseline, "hf_step", lambda *a: None)
    kw = dict(preset="tiny", seq_len=16, max_pred=2, micro_batch=2, precision="fp32", device="cpu")
    with pytest.raises(UserError, match="steps 3 must exceed warmup_steps 3"):
        pl.hf_loop(**kw, steps=3, warmup_steps=3)
    out = pl.hf_loop(**kw, steps=2, warmup_steps=1)  # the CPU keeps no peak: 0 GB read as measured
    assert out["seq_per_s"] > 0 and "peak_mem_gb" not in out


def test_a_failed_entrys_message_stays_one_table_row(tmp_path, monkeypatch):
    """A child's traceback in the error (newlines, `|`) split the markdown table."""

    def broken():
        raise RuntimeError("bertforge pretrain failed (1): Traceback\n  File x | y\nValueError: z")

    monkeypatch.setattr(selftest, "broken", broken, raising=False)
    spec = _spec(tmp_path, "repeat: 1\nwarmup: 0\nbenchmarks:\n  - {name: a, fn: 'bertforge.bench.selftest:broken'}\n")
    md = harness.markdown(harness.run_spec(spec, progress=lambda s: None))
    (row,) = [line for line in md.splitlines() if "**failed**" in line]
    assert row.endswith("Traceback File x \\| y ValueError: z | | | |")


def test_compare_curves_refuses_two_curves_of_one_name(tmp_path):
    """Two runs' metrics.jsonl: one name stood for both, the band came out 0 and every fast path infinitely off."""
    for d in ("eager1", "eager2"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "metrics.jsonl").write_text(json.dumps({"step": 30, "loss": 9.0, "seq_per_s": 1.0}) + "\n")
    ref, noise = str(tmp_path / "eager1" / "metrics.jsonl"), str(tmp_path / "eager2" / "metrics.jsonl")
    with pytest.raises(UserError, match="give each curve its own file name"):
        pl.compare_curves(ref, noise, [])


def test_resume_keeps_no_entry_measured_concurrently_in_a_run_that_is_not(tmp_path):
    """An entry that shared the cores with every other entry is no baseline for one measured alone."""
    spec = _spec(tmp_path, SPEC)
    together = harness.run_spec(spec, progress=lambda s: None)
    for res in together["results"]:
        res["concurrent"] = True  # as a concurrent run marks them (spawning the processes takes seconds)
    alone = harness.run_spec(spec, progress=lambda s: None, previous=together)
    assert not any(r.get("kept_from") or r.get("concurrent") for r in alone["results"])
    assert set(harness._kept_results(together, spec.benchmarks, concurrent=True)) == {"a", "b"}


def test_an_entry_that_sets_torchs_threads_leaves_the_next_entries_and_the_report_alone(tmp_path, monkeypatch):
    """`threads: 1` of one entry (bench.packing, bench.serve) used to run every later entry on one thread."""
    import torch

    def one_thread():
        torch.set_num_threads(1)
        return {"threads": torch.get_num_threads()}

    monkeypatch.setattr(selftest, "one_thread", one_thread, raising=False)
    monkeypatch.setattr(selftest, "count", lambda: {"threads": torch.get_num_threads()}, raising=False)
    spec = _spec(
        tmp_path,
        "repeat: 1\nwarmup: 0\nbenchmarks:\n  - {name: a, fn: 'bertforge.bench.selftest:one_thread'}\n"
        "  - {name: b, fn: 'bertforge.bench.selftest:count'}\n",
    )
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        report = harness.run_spec(spec, progress=lambda s: None)
    finally:
        torch.set_num_threads(before)
    a, b = report["results"]
    assert a["metrics"]["threads"]["median"] == 1 and b["metrics"]["threads"]["median"] == 2
    assert report["machine"]["threads"] == 2


def test_a_report_with_an_infinite_value_is_strict_json(tmp_path, monkeypatch):
    """An entry returning inf (quality_budget's time to a target never reached) was written as `Infinity`, which
    strict JSON parsers reject: it is null."""
    monkeypatch.setattr(selftest, "never", lambda: {"seconds_to_target": float("inf")}, raising=False)
    spec = _spec(tmp_path, "repeat: 1\nwarmup: 0\nbenchmarks:\n  - {name: a, fn: 'bertforge.bench.selftest:never'}\n")
    out = tmp_path / "r.json"
    harness.write_outputs(harness.run_spec(spec, progress=lambda s: None), str(out), None)

    def refuse(token):
        raise ValueError(f"not JSON: {token}")

    report = json.loads(out.read_text(), parse_constant=refuse)
    assert report["results"][0]["metrics"]["seconds_to_target"]["median"] is None
