import inspect
import json
import time
from pathlib import Path

import pytest

from bertforge.bench import harness
from bertforge.cli import main
from bertforge.errors import UserError

SPEC = """
title: harness test
repeat: 3
warmup: 0
benchmarks:
  - name: short
    fn: bertforge.bench.selftest:sleep
    params: {seconds: 0.01}
  - name: long
    fn: bertforge.bench.selftest:sleep
    params: {seconds: 0.03}
ratios:
  - {name: long_vs_short, num: long, den: short, metric: slept_s, target: 2.0}
  - {name: short_vs_long, num: short, den: long, metric: slept_s, target: 0.5, lower_is_better: true}
"""


@pytest.fixture
def spec(tmp_path):
    p = tmp_path / "spec.yml"
    p.write_text(SPEC)
    return p


def test_run_spec_repeats_and_ratios(spec):
    report = harness.run_spec(harness.load_spec(str(spec)), progress=lambda s: None)
    short = report["results"][0]["metrics"]
    assert short["wall_s"]["n"] == 3 and short["slept_s"]["median"] == 0.01
    assert short["wall_s"]["min"] <= short["wall_s"]["median"] <= short["wall_s"]["max"]
    r1, r2 = report["ratios"]
    # ratios of a metric the callables report exactly (wall_s would make the test depend on machine load)
    assert r1["value"] == pytest.approx(3.0) and r1["met"] is True
    assert r2["value"] == pytest.approx(1 / 3) and r2["met"] is True
    md = harness.markdown(report)
    assert "| long_vs_short | long / short | slept_s |" in md


def test_cli_only_and_outputs(spec, tmp_path, capsys):
    out_json, out_md = tmp_path / "r.json", tmp_path / "r.md"
    assert (
        main(
            [
                "bench",
                "--spec",
                str(spec),
                "--only",
                "short",
                "--json",
                str(out_json),
                "--md",
                str(out_md),
                "--repeat",
                "1",
            ]
        )
        == 0
    )
    report = json.loads(out_json.read_text())
    assert [r["name"] for r in report["results"]] == ["short"]
    assert report["ratios"] == []  # a ratio needs both sides measured in this run
    assert "short" in out_md.read_text()


def test_bad_spec_errors(tmp_path):
    p = tmp_path / "bad.yml"
    p.write_text("benchmarks:\n  - name: a\n    fn: x:y\nratios:\n  - {name: r, num: a, den: b, metric: m}\n")
    with pytest.raises(UserError, match="unknown benchmark 'b'"):
        harness.load_spec(str(p))
    with pytest.raises(UserError, match="not found"):
        harness.load_spec(str(tmp_path / "missing.yml"))


def test_only_matching_nothing_is_an_error(spec):
    with pytest.raises(UserError, match="no benchmark"):
        harness.run_spec(harness.load_spec(str(spec)), ["zzz"])


def test_accel_callables_run_on_cpu():
    """The accelerator spec's callables also run on the CPU: parity raises beyond tolerance, steps report."""
    from bertforge.bench import accel, step

    diffs = accel.parity("cpu", batch=4, seq=32)
    assert diffs["sdpa_fp32_maxdiff"] < 1e-4 and diffs["sdpa_packed_maxdiff"] < 1e-4
    out = step.train_step("ours", "tiny", "fp32", batch=2, seq=32, masked=4, steps=1, device="cpu", vocab=30528)
    assert out["seq_per_s"] > 0 and out["tokens_per_s"] == out["seq_per_s"] * 32 and out["loss"] > 0


def test_a_failing_benchmark_is_reported_and_the_rest_still_run(tmp_path):
    p = tmp_path / "spec.yml"
    p.write_text(
        "repeat: 1\nwarmup: 0\nbenchmarks:\n"
        "  - {name: bad, fn: 'bertforge.bench.selftest:sleep', params: {seconds: -1}}\n"
        "  - {name: good, fn: 'bertforge.bench.selftest:sleep', params: {seconds: 0.0}}\n"
    )
    report = harness.run_spec(harness.load_spec(str(p)), progress=lambda s: None)
    bad, good = report["results"]
    assert "ValueError" in bad["error"] and bad["metrics"] == {}
    assert good["metrics"]["slept_s"]["median"] == 0.0
    assert "**failed**" in harness.markdown(report)


def test_interleave_runs_rounds_and_pairs_ratios(spec):
    lines: list[str] = []
    report = harness.run_spec(harness.load_spec(str(spec)), progress=lines.append, interleave=True)
    calls = [ln.split()[0] for ln in lines if "[" in ln]
    assert calls == ["short", "long"] * 3  # round-robin, not all of one then the other
    r1 = report["ratios"][0]
    assert r1["paired"]["n"] == 3 and r1["paired"]["min"] == pytest.approx(3.0) and r1["value"] == pytest.approx(3.0)
    assert "(paired " in harness.markdown(report)
    plain = harness.run_spec(harness.load_spec(str(spec)), progress=lambda s: None)
    assert "paired" not in plain["ratios"][0]


def test_concurrent_runs_each_benchmark_in_its_own_process_at_once(tmp_path):
    p = tmp_path / "spec.yml"
    p.write_text(
        "repeat: 1\nwarmup: 0\nconcurrent: true\nbenchmarks:\n"
        "  - {name: a, fn: 'bertforge.bench.selftest:sleep', params: {seconds: 3.0}}\n"
        "  - {name: b, fn: 'bertforge.bench.selftest:sleep', params: {seconds: 3.0}}\n"
        "  - {name: bad, fn: 'bertforge.bench.selftest:sleep', params: {seconds: -1}}\n"
        "ratios:\n  - {name: a_vs_b, num: a, den: b, metric: slept_s}\n"
    )
    spec = harness.load_spec(str(p))
    updates: list[dict] = []
    report = harness.run_spec(spec, progress=lambda s: None, on_update=updates.append)
    a, b, bad = report["results"]
    # the report is rewritten as each process ends (a stop from outside kept nothing): first with `bad` alone
    first = updates[0]["results"]
    assert first[2].get("error") and not first[0]["metrics"] and first[0].get("not_run")
    assert a["concurrent"] and a["metrics"]["slept_s"]["median"] == 3.0
    # the two 3-second sleeps overlapped in time: each started before the other ended
    assert max(a["samples"]["started_at"][0], b["samples"]["started_at"][0]) < min(
        a["samples"]["ended_at"][0], b["samples"]["ended_at"][0]
    )
    assert "ValueError" in bad["error"] and bad["metrics"] == {}
    assert report["ratios"][0]["value"] == 1.0
    with pytest.raises(UserError, match="interleaved or concurrent"):
        harness.run_spec(spec, progress=lambda s: None, interleave=True)


def test_a_concurrent_benchmark_whose_process_is_killed_fails_alone(tmp_path):
    """One entry's process killed (as by the OOM killer) fails that entry only; the other's result still arrives."""
    p = tmp_path / "spec.yml"
    p.write_text(
        "repeat: 1\nwarmup: 0\nconcurrent: true\nbenchmarks:\n"
        "  - {name: killed, fn: 'bertforge.bench.selftest:die', params: {}}\n"
        "  - {name: ok, fn: 'bertforge.bench.selftest:sleep', params: {seconds: 2.0}}\n"
    )
    killed, ok = harness.run_spec(harness.load_spec(str(p)), progress=lambda s: None)["results"]
    assert "killed by signal 9" in killed["error"] and "out-of-memory" in killed["error"]
    assert killed["metrics"] == {}
    assert ok.get("error") is None and ok["metrics"]["slept_s"]["median"] == 2.0


def test_time_to_accuracy_read_off_curves(tmp_path):
    from bertforge.bench.pretrain import tta_from_curves

    curve = tmp_path / "c.jsonl"
    rows = [
        ("hf", 100, 20, 0.05),
        ("hf", 200, 40, 0.09),
        ("hf", 300, 60, 0.08),
        ("hf", 400, 80, 0.10),
        ("ours", 30, 20, 0.07),
        ("ours", 60, 40, 0.11),
        ("ours", 90, 60, 0.12),
    ]
    curve.write_text("".join(json.dumps({"impl": i, "train_s": t, "step": s, "acc": a}) + "\n" for i, t, s, a in rows))
    out = tta_from_curves(str(curve))
    assert out["target"] == 0.10 and out["hf_seconds"] == 400 and out["ours_seconds"] == 60
    assert out["hf_over_ours"] == pytest.approx(400 / 60) and out["ours_steps"] == 40
    at = tta_from_curves(str(curve), at_seconds=250)  # the baseline's accuracy at 250 s: 0.09, first hit at 200 s
    assert at["target"] == 0.09 and at["hf_seconds"] == 200 and at["ours_seconds"] == 60
    curve.write_text(
        json.dumps({"impl": "hf", "train_s": 1, "step": 1, "acc": 0.5})
        + "\n"
        + json.dumps({"impl": "ours", "train_s": 1, "step": 1, "acc": 0.1})
        + "\n"
    )
    assert tta_from_curves(str(curve))["ours_seconds"] == float("inf")
    from bertforge.bench.pretrain import plot_curves

    png = plot_curves(str(curve), str(tmp_path / "c.png"), 0.5)
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "text, message",
    [
        ("- name: a\n  fn: x:y\n", "expected a mapping"),
        ("benchmarks: {name: a, fn: 'x:y'}\n", "`benchmarks` must be a list"),
        ("benchmarks:\n  - name: a\n    fn: x:y\n    params: [1, 2]\n", r"benchmarks\[0\].params must be a mapping"),
        ("repeat: three\nbenchmarks: []\n", "`repeat` must be a whole number"),
        ("benchmarks:\n  - {name: a, fn: 'x:y', warmup: -1}\n", "`warmup` must be a whole number"),
        ("benchmarks:\n  - {name: a, fn: 'x:y'}\nratios:\n  - a\n", r"ratios\[0\] needs name, num, den and metric"),
        ("benchmarks:\n  - {name: a, fn: 'x:y'}\nratios:\n  - {name: r, num: a}\n", r"ratios\[0\] needs"),
        ("{1: 2}\n", "unknown top-level keys"),
        ("benchmarks: [\n", "not valid YAML"),
        ("requires: tpu\nbenchmarks:\n  - {name: a, fn: 'x:y'}\n", "`requires` must be one of cuda, accelerator"),
        # repeats that measure nothing, yes/no keys YAML reads as text, typos, a key given twice, bad targets
        ("benchmarks: []\n", "`benchmarks` lists nothing to measure"),
        ("repeat: 0\nbenchmarks:\n  - {name: a, fn: 'x:y'}\n", "`repeat` must be a whole number >= 1"),
        ("interleave: 'no'\nbenchmarks:\n  - {name: a, fn: 'x:y'}\n", "`interleave` must be true or false"),
        ("benchmarks:\n  - {name: a, fn: 'x:y', repeats: 1}\n", r"benchmarks\[0\] has unknown keys repeats"),
        ("benchmarks: []\nbenchmarks:\n  - {name: a, fn: 'x:y'}\n", "key 'benchmarks' is given twice"),
        (
            "benchmarks:\n  - {name: a, fn: 'x:y'}\nratios:\n  - {name: r, num: a, den: a, metric: m, target: 2x}\n",
            "`target` must be a number",
        ),
        (
            "benchmarks:\n  - {name: a, fn: 'x:y'}\nratios:\n  - {name: r, num: a, den: a, metric: m, "
            "lower_is_better: 'no'}\n",
            "`lower_is_better` must be true or false",
        ),
    ],
)
def test_a_spec_of_the_wrong_shape_is_one_line_naming_the_file(tmp_path, capsys, text, message):
    p = tmp_path / "shape.yml"
    p.write_text(text)
    with pytest.raises(UserError, match=message):
        harness.load_spec(str(p))
    assert main(["bench", "--spec", str(p)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(p) in err and "Traceback" not in err


SHIPPED = sorted((Path(__file__).resolve().parents[1] / "benchmarks").glob("*.yml"))


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_every_shipped_spec_loads_and_its_calls_take_their_params(path):
    """The GPU specs cannot run here: a typo in one would only show on the machine whose minutes it costs."""
    spec = harness.load_spec(str(path))
    assert spec.benchmarks
    for b in spec.benchmarks:
        fn = harness.resolve_fn(b.fn)
        bound = inspect.signature(fn).bind(**b.params)  # TypeError names the unknown or missing parameter
        if b.fn == "bertforge.bench.pretrain_loop:loop":  # its --set overrides load as a config (keys, values)
            from bertforge.bench.pretrain_loop import loop_config
            from bertforge.config import load_config

            bound.apply_defaults()
            args = {
                k: v
                for k, v in bound.arguments.items()
                if k not in ("warmup_steps", "timeout_s", "curve", "cold_compile")
            }
            cfg = load_config("pretrain", *loop_config("/tmp/out", **args))
            named = set(args.get("extra") or [])  # every fast path an entry measures is named, none left to auto
            for section, key in (("train", "compile"), ("train", "cuda_graphs"), ("optim", "compile")):
                on = f"{section}.{key}=true" in named
                assert getattr(getattr(cfg, section), key) is on, (b.name, section, key)


def test_params_are_checked_against_every_entrys_function_before_anything_runs(tmp_path, capsys):
    """A misspelt parameter of a late entry failed only once the earlier entries had run (hours, on a GPU spec);
    YAML's 1e-2 (text to PyYAML) is the number for a float parameter."""
    p = tmp_path / "spec.yml"
    p.write_text(
        "repeat: 1\nwarmup: 0\nbenchmarks:\n"
        "  - {name: a, fn: 'bertforge.bench.selftest:sleep', params: {seconds: 1e-2}}\n"
        "  - {name: b, fn: 'bertforge.bench.selftest:sleep', params: {secnds: 0.01}}\n"
    )
    out = tmp_path / "r.json"
    assert main(["bench", "--spec", str(p), "--json", str(out)]) == 2
    captured = capsys.readouterr()
    assert "b's params do not fit bertforge.bench.selftest:sleep" in captured.err and "secnds" in captured.err
    assert "a [1/1]" not in captured.out and not out.exists()
    report = harness.run_spec(harness.load_spec(str(p)), only=["a"], progress=lambda s: None)
    assert report["results"][0]["metrics"]["slept_s"]["median"] == 0.01
    # --resume keeps it: the spec's 1e-2 is compared as the number the report recorded
    lines: list[str] = []
    harness.run_spec(harness.load_spec(str(p)), only=["a"], progress=lines.append, previous=report)
    assert any("a: kept from the earlier run" in ln for ln in lines) and not any("[1/1]" in ln for ln in lines)


def test_outputs_are_checked_first_and_an_existing_file_is_kept_unless_asked(spec, tmp_path, capsys):
    """--json/--md replaced any file (a user's, or a report of other entries) and were checked only after the
    first entry's measurement, which a bad path then threw away."""
    notes = tmp_path / "notes.json"
    notes.write_text('{"my": "notes"}')
    run = ["bench", "--spec", str(spec), "--repeat", "1"]
    assert main([*run, "--json", str(notes)]) == 2
    assert "--json " + str(notes) + " exists; pass --overwrite" in capsys.readouterr().err
    assert notes.read_text() == '{"my": "notes"}'
    for flags, message in [
        (["--json", str(tmp_path)], "is a directory"),
        (["--md", str(spec / "x.md")], "is a file, not a directory"),
        (["--json", str(tmp_path / "same"), "--md", str(tmp_path / "same")], "name the same file"),
        (["--repeat", "0"], "--repeat must be at least 1"),
        (["--stop-after", "nan"], "--stop-after must be a number of seconds"),
    ]:
        assert main([*run, *flags]) == 2
        captured = capsys.readouterr()
        assert message in captured.err and "[1/1]" not in captured.out, flags
    assert main([*run, "--json", str(notes), "--overwrite"]) == 0
    assert json.loads(notes.read_text())["results"]
    md = tmp_path / "t.md"
    assert main([*run, "--json", str(notes), "--md", str(md), "--overwrite"]) == 0
    assert main([*run, "--json", str(notes), "--md", str(md), "--resume"]) == 0  # its own table: rewritten
    assert main(["bench", "--show", str(tmp_path)]) == 2 and "is a directory" in capsys.readouterr().err


def test_sigterm_stops_a_concurrent_run_as_ctrl_c_does(tmp_path):
    """SIGTERM (a supervisor, `kill`) killed the parent at once: no line, the children left running for hours."""
    import os
    import signal
    import subprocess
    import sys

    p = tmp_path / "conc.yml"
    p.write_text(
        "repeat: 1\nwarmup: 0\nconcurrent: true\nbenchmarks:\n"
        "  - {name: fast, fn: 'bertforge.bench.selftest:sleep', params: {seconds: 0.1}}\n"
        "  - {name: slow, fn: 'bertforge.bench.selftest:sleep', params: {seconds: 120.0}}\n"
    )
    out = tmp_path / "r.json"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    cmd = [sys.executable, "-m", "bertforge", "bench", "--spec", str(p), "--json", str(out)]
    child = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out.is_file() and "slept_s" in out.read_text()):  # `fast` finished and the report was written
        assert time.monotonic() < deadline and child.poll() is None, child.communicate()
        time.sleep(0.1)
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=60)
    assert child.returncode == 143, err
    assert "Traceback" not in err
    results = {r["name"]: r for r in json.loads(out.read_text())["results"]}
    assert results["fast"]["metrics"]["slept_s"]["median"] == 0.1 and results["slow"].get("not_run")


def _bench_cli(spec, out_json, *extra):
    return main(
        ["bench", "--spec", str(spec), "--json", str(out_json), "--md", str(out_json.with_suffix(".md")), *extra]
    )


def test_stop_after_leaves_the_rest_not_run_and_resume_runs_only_them(tmp_path, capsys):
    """A lent machine's command limit: `--stop-after` starts nothing after S seconds; `--resume` keeps what the
    earlier run finished (same samples, its date) and measures only the rest, ratios across both."""
    p = tmp_path / "spec.yml"
    p.write_text(
        "repeat: 1\nwarmup: 0\nbenchmarks:\n"
        "  - {name: first, fn: 'bertforge.bench.selftest:sleep', params: {seconds: 0.4}}\n"
        "  - {name: second, fn: 'bertforge.bench.selftest:sleep', params: {seconds: 0.1}}\n"
        "ratios:\n  - {name: r, num: first, den: second, metric: slept_s}\n"
    )
    out = tmp_path / "r.json"
    assert _bench_cli(p, out, "--stop-after", "0.2") == 0
    assert "--resume" in capsys.readouterr().out
    first_run = json.loads(out.read_text())
    first, second = first_run["results"]
    assert first["metrics"]["slept_s"]["n"] == 1 and second["not_run"] and first_run["not_run"] == ["second"]
    assert first_run["ratios"][0]["value"] is None
    assert "**not run**" in out.with_suffix(".md").read_text()

    assert _bench_cli(p, out, "--resume") == 0
    resumed = json.loads(out.read_text())
    kept, ran = resumed["results"]
    assert kept["kept_from"] == first_run["date"] and kept["samples"] == first["samples"]
    assert ran["metrics"]["slept_s"]["median"] == 0.1 and "kept_from" not in ran and resumed["not_run"] == []
    assert resumed["ratios"][0]["value"] == pytest.approx(4.0)
    assert "Kept from earlier runs of this spec (--resume): first" in out.with_suffix(".md").read_text()

    p.write_text(p.read_text().replace("seconds: 0.4", "seconds: 0.2"))  # changed params are measured again
    assert _bench_cli(p, out, "--resume") == 0
    again = json.loads(out.read_text())
    assert "kept_from" not in again["results"][0] and again["results"][1]["kept_from"] == resumed["date"]
    assert again["ratios"][0]["value"] == pytest.approx(2.0)


def test_resume_with_only_keeps_the_other_entries_in_the_report(spec, tmp_path):
    out = tmp_path / "r.json"
    assert _bench_cli(spec, out, "--repeat", "1", "--only", "long") == 0
    assert [r["name"] for r in json.loads(out.read_text())["results"]] == ["long"]
    assert _bench_cli(spec, out, "--repeat", "1", "--only", "short", "--resume") == 0
    both = json.loads(out.read_text())
    assert [(r["name"], "kept_from" in r) for r in both["results"]] == [("short", False), ("long", True)]
    assert both["ratios"][0]["value"] == pytest.approx(3.0)  # a ratio across the two runs


def test_stopped_interleaved_rounds_are_incomplete_and_rerun_whole(tmp_path):
    p = tmp_path / "spec.yml"
    p.write_text(
        "repeat: 3\nwarmup: 0\ninterleave: true\nbenchmarks:\n"
        "  - {name: a, fn: 'bertforge.bench.selftest:sleep', params: {seconds: 0.2}}\n"
        "  - {name: b, fn: 'bertforge.bench.selftest:sleep', params: {seconds: 0.2}}\n"
    )
    spec = harness.load_spec(str(p))
    report = harness.run_spec(spec, progress=lambda s: None, stop_after=0.15)  # round 1 only
    assert [r.get("incomplete") for r in report["results"]] == [True, True] and report["not_run"] == ["a", "b"]
    assert "**incomplete**" in harness.markdown(report)
    again = harness.run_spec(spec, progress=lambda s: None, previous=report)
    assert [r["metrics"]["slept_s"]["n"] for r in again["results"]] == [3, 3]
    assert not any(r.get("kept_from") for r in again["results"])


def test_the_report_is_on_disk_after_each_benchmark_when_the_run_is_killed(tmp_path, monkeypatch):
    from bertforge.bench import selftest

    def interrupted(**_):
        raise KeyboardInterrupt  # as the lent machine's time limit ends the command

    monkeypatch.setattr(selftest, "interrupted", interrupted, raising=False)
    p = tmp_path / "spec.yml"
    p.write_text(
        "repeat: 1\nwarmup: 0\nbenchmarks:\n"
        "  - {name: done, fn: 'bertforge.bench.selftest:sleep', params: {seconds: 0.0}}\n"
        "  - {name: killed, fn: 'bertforge.bench.selftest:interrupted', params: {}}\n"
    )
    out = tmp_path / "r.json"
    assert _bench_cli(p, out) == 130  # the CLI's answer to an interrupt
    done, killed = json.loads(out.read_text())["results"]
    assert done["metrics"]["slept_s"]["n"] == 1 and killed["not_run"]


def test_resume_refuses_another_spec_machine_or_a_broken_file(spec, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert _bench_cli(spec, out, "--repeat", "1") == 0
    report = json.loads(out.read_text())
    for change, message in [
        (lambda r: r["machine"].update(torch="0.0"), "measured with torch"),
        (lambda r: r.update(spec="other.yml"), "a report of other.yml"),
        (lambda r: r.pop("results"), "not a report"),
    ]:
        broken = json.loads(json.dumps(report))
        change(broken)
        out.write_text(json.dumps(broken))
        assert _bench_cli(spec, out, "--resume") == 2
        assert message in capsys.readouterr().err
    out.write_text("{")
    assert _bench_cli(spec, out, "--resume") == 2 and "not valid JSON" in capsys.readouterr().err
    assert main(["bench", "--spec", str(spec), "--resume"]) == 2 and "--resume needs --json" in capsys.readouterr().err


def test_show_prints_a_saved_report_and_rejects_other_files(spec, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert _bench_cli(spec, out, "--repeat", "1") == 0
    capsys.readouterr()
    assert main(["bench", "--show", str(out), "--md", str(tmp_path / "again.md")]) == 0
    assert "| long_vs_short | long / short | slept_s |" in capsys.readouterr().out
    assert (tmp_path / "again.md").read_text() == out.with_suffix(".md").read_text()
    (tmp_path / "other.json").write_text('{"a": 1}')
    for path, message in [(tmp_path / "other.json", "not a report"), (tmp_path / "none.json", "does not exist")]:
        assert main(["bench", "--show", str(path)]) == 2 and message in capsys.readouterr().err


def test_the_gpu_script_resumes_from_an_earlier_calls_reports(tmp_path):
    """scripts/bench_gpu.sh on a CPU spec: a second call given the first's folder keeps its entries."""
    import os
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "scripts" / "bench_gpu.sh"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "MARGIN": "0"}

    def call(out, *args):
        proc = subprocess.run([str(script), str(out), "60", *args], env=env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        return json.loads((out / "matmul.json").read_text())

    first = call(tmp_path / "one", "", "matmul:fp32")  # SPEC:NAME runs only the entries named
    assert [r["name"] for r in first["results"]] == ["fp32_1024"] and not first["results"][0].get("kept_from")
    second = call(tmp_path / "two", str(tmp_path / "one"), "matmul")
    assert [r.get("kept_from") for r in second["results"]] == [first["date"], None]
    assert "steps: matmul" in (tmp_path / "two" / "bench_gpu.log").read_text()


def test_the_gpu_script_returns_a_quality_side_in_parts_that_a_later_call_restores(tmp_path):
    """After a quality_budget_gpu side, its record and model leave the lease as 15 MiB parts (a call brings back
    files of at most 16 MiB); an EARLIER_DIR holding them puts both back where they were."""
    import os
    import shutil
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    rel = f"runs/test_quality_parts_{os.getpid()}"  # the script runs from the repo root; runs/ is ignored
    model = root / rel / "ours" / "pretrain" / "model"
    weights = os.urandom(20 * 2**20)  # incompressible: two parts
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "QUALITY": rel, "MARGIN": "0"}

    def call(*args):
        proc = subprocess.run([str(root / "scripts" / "bench_gpu.sh"), *args], env=env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]

    try:
        model.mkdir(parents=True)
        (model / "model.safetensors").write_bytes(weights)
        record = {"model_dir": f"{rel}/ours/pretrain/model", "curve": [{"train_s": 1.0, "step": 1, "acc": 0.1}]}
        (root / rel / "ours" / "side.json").write_text(json.dumps(record))
        call(str(tmp_path / "one"), "60", "", "quality_budget_gpu:_ours")  # the spec itself is refused here
        parts = sorted((tmp_path / "one").glob("quality_ours.tgz.*"))
        assert [p.name for p in parts] == ["quality_ours.tgz.00", "quality_ours.tgz.01"]
        assert all(p.stat().st_size <= 15 * 2**20 for p in parts)
        shutil.rmtree(root / rel)
        call(str(tmp_path / "two"), "0", str(tmp_path / "one"))  # no time for any step: only the restore
        assert (model / "model.safetensors").read_bytes() == weights
        assert json.loads((root / rel / "ours" / "side.json").read_text()) == record
    finally:
        shutil.rmtree(root / rel, ignore_errors=True)


def test_every_selection_in_the_gpu_script_names_entries_of_its_spec():
    """`bench SPEC:A,B` in scripts/bench_gpu.sh: a name matching no entry would silently measure nothing."""
    import re

    script = (Path(__file__).resolve().parents[1] / "scripts" / "bench_gpu.sh").read_text()
    selections = re.findall(r"\bbench ([a-z0-9_]+):([A-Za-z0-9_,]+)", script)
    assert selections
    for spec, names in selections:
        entries = [b.name for b in harness.load_spec(spec).benchmarks]
        for name in names.split(","):
            assert any(name in e for e in entries), f"{spec}:{name} matches no entry"


def test_a_gpu_spec_is_refused_on_a_machine_without_one(tmp_path, capsys, monkeypatch):
    """`requires: cuda`: one line before anything runs, not BERT-large on the CPU for hours."""
    from bertforge import device as dev

    p = tmp_path / "gpu.yml"
    p.write_text("requires: cuda\nbenchmarks:\n  - {name: a, fn: 'bertforge.bench.selftest:sleep'}\n")
    monkeypatch.setattr(dev, "available_devices", lambda: [{"device": "cpu", "name": "cpu"}])
    assert main(["bench", "--spec", str(p), "--json", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err
    assert (
        "measures a CUDA GPU (requires: cuda) and this machine has none" in err and not (tmp_path / "r.json").exists()
    )
    monkeypatch.setattr(
        dev, "available_devices", lambda: [{"device": "cpu", "name": "cpu"}, {"device": "cuda:0", "name": "H100"}]
    )
    assert harness.run_spec(harness.load_spec(str(p)), progress=lambda s: None)["results"][0]["metrics"]
    p.write_text(p.read_text().replace("cuda", "accelerator"))
    monkeypatch.setattr(
        dev, "available_devices", lambda: [{"device": "cpu", "name": "cpu"}, {"device": "xpu:0", "name": "Max"}]
    )
    assert harness.run_spec(harness.load_spec(str(p)), progress=lambda s: None)["results"][0]["metrics"]
