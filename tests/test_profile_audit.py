"""Audit of `--profile`'s StepProfiler: the window's edges and a window cut short (CPU, tiny model)."""

from __future__ import annotations

import json

import torch
from tests.test_profile import _tiny_step

from bertforge.runtime import profile as prof


def test_step_profiler_waits_for_the_device_where_its_window_opens_and_closes(tmp_path, monkeypatch):
    """The loop calls step() right after train_step, whose optimizer kernels are still queued on a GPU; kineto
    drops kernels that end after the window closes, so the profiler must sync first or the last recorded step
    loses its update (the optimizer's share in the table reads low; with --profile 1 it is gone)."""
    from bertforge import device as dev

    synced: list[tuple[str, int, bool]] = []
    monkeypatch.setattr(dev, "synchronize", lambda d: synced.append((torch.device(d).type, p.stepped, p.done)))
    step = _tiny_step()
    with prof.StepProfiler(tmp_path, steps=2, device="cpu", warmup=1) as p:
        for _ in range(5):
            step()
            p.step()
    assert p.done
    # before the window opens (after the warm-up step) and before it closes (after the 2nd recorded step)
    assert synced == [("cpu", 1, False), ("cpu", 3, False)]


def test_a_window_cut_short_says_how_many_steps_it_holds(tmp_path):
    """StepProfiler used from Python (docs/pretraining.md) over fewer steps than warm-up + window: torch writes
    the trace on exit; the table and summary must say it holds 1 step, not the 3 asked for."""
    step = _tiny_step()
    with prof.StepProfiler(tmp_path / "a", steps=3, device="cpu", warmup=1) as p:
        for _ in range(2):  # the warm-up step and one recorded step
            step()
            p.step()
    assert p.done and p.summary()["steps"] == 1
    assert "over only 1 of 3 steps" in p.table
    assert (tmp_path / "a" / "top_ops.txt").read_text().strip() == p.table
    steps = {e["name"] for e in json.loads((tmp_path / "a" / "trace.json").read_text())["traceEvents"]}
    assert "ProfilerStep#1" in steps and "ProfilerStep#3" not in steps  # (#2: the empty range up to the exit)

    with prof.StepProfiler(tmp_path / "b", steps=3, device="cpu", warmup=2) as q:
        step()
        q.step()  # still in the warm-up: nothing is recorded
    assert not q.done and q.summary()["steps"] == 0 and q.table.startswith("no profile: the steps ended")
    assert not (tmp_path / "b" / "trace.json").exists()


def test_a_full_window_is_labelled_with_its_steps(tmp_path):
    step = _tiny_step()
    out = prof.profile_steps(step, n=2, out_dir=tmp_path, device="cpu", warmup=1)
    assert out["steps"] == 2 and "over 2 steps" in out["table"] and "only" not in out["table"]


# ------------------------------------------------------------------------------ the data benchmarks' measures
def test_run_measured_peak_catches_a_spike_between_samples(monkeypatch):
    """A child whose memory spikes between two 10 ms samples: the kernel's high-water mark still reports it
    (here the sampler sees nothing at all), and the CPU seconds are this child's."""
    import sys

    from bertforge.bench import data

    monkeypatch.setattr(data, "_tree_rss", lambda proc: (0, 0))  # every sample misses the spike
    m = data.run_measured([sys.executable, "-c", "b = b'x' * (160 << 20); import time; t = time.process_time()"])
    assert m["max_process_rss_mb"] >= 160 and m["peak_rss_mb"] >= m["max_process_rss_mb"]
    assert 0 < m["cpu_s"] < m["shards_wall_s"] * 4


def test_an_interrupted_first_bench_run_leaves_no_short_input(tmp_path, monkeypatch):
    """`_docs` writes WikiText x repeat once and reuses it: stopped mid-write, it must not leave a short file that
    every later run takes for the full input (wrong MB, wrong ratios)."""
    import builtins

    import pytest

    from bertforge.bench import data

    raw = tmp_path / "shared" / "wikitext-2" / "raw" / "wiki.test.raw"
    raw.parent.mkdir(parents=True)
    raw.write_bytes(b" = Title = \nSome text .\n")
    monkeypatch.setattr(data, "SHARED", tmp_path / "shared")
    monkeypatch.setenv("BERTFORGE_BENCH_CACHE", str(tmp_path / "cache"))

    class Interrupted(Exception):
        pass

    def opener(path, mode="r", *a, **k):
        f = builtins.open(path, mode, *a, **k)
        if "w" in mode:
            writes = iter(range(10**6))

            def write(b):  # the second of the 3 copies is interrupted
                if next(writes) == 1:
                    raise Interrupted
                return type(f).write(f, b)

            f.write = write
        return f

    monkeypatch.setattr(data, "open", opener, raising=False)
    with pytest.raises(Interrupted):
        data._docs(3)
    assert not (tmp_path / "cache" / "wikitext2_test_x3.raw").exists()
