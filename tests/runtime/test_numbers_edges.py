"""Edges of the numbers bertforge reports: energy per sequence after a short window, TensorBoard on a resumed or
repeated run, a plot of one point, progress under resume and for instant phases, ModernBERT's head FLOPs, and
`bertforge info`'s advice on a GPU without bf16."""

from __future__ import annotations

import argparse
import io
import json

import pytest
from tests.runtime.test_progress import Clock
from tests.test_profile import FakeNVML

from bertforge import info
from bertforge.model import BertConfig
from bertforge.model.flops import flops_per_sequence
from bertforge.runtime import metrics
from bertforge.runtime import profile as prof
from bertforge.runtime.progress import Progress


def test_a_window_too_short_to_sample_passes_its_sequences_on(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    s = prof.PowerSampler("cuda", nvml=FakeNVML([100_000] * 8), start=False)  # 100 W, no energy counter
    assert s.window(sequences=100, now=0.05) == {}  # no sample yet: its energy goes into the next window
    for t in (0.1, 1.1, 2.1):
        s.sample(now=t)
    w = s.window(sequences=100, now=2.1)
    # 200 J over the two windows' 200 sequences, not over the second window's 100 alone
    assert w["joules"] == pytest.approx(200) and w["joules_per_seq"] == pytest.approx(1.0)
    s.sample(now=3.1)
    assert s.window(sequences=50, now=3.1)["joules_per_seq"] == pytest.approx(2.0)  # carried once only
    s.close()


def _scalars(logdir, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), purge_orphaned_data=True)
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_tensorboard_of_a_resumed_run_drops_the_steps_it_runs_again(tmp_path):
    pytest.importorskip("tensorboard")
    log = metrics.MetricsLogger(tmp_path, stream=io.StringIO())
    for step in (10, 20, 30):
        log.log(step, {"loss": float(step)})
    log.close()
    # killed after step 30, resumed from the checkpoint of step 20: the loop trims metrics.jsonl to step 20
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    (tmp_path / "metrics.jsonl").write_text(lines[0] + "\n" + lines[1] + "\n" + '{"step": 3')  # and a torn line
    log = metrics.MetricsLogger(tmp_path, stream=io.StringIO(), resume=True)
    log.log(30, {"loss": 3.0})
    log.close()
    assert _scalars(tmp_path / "tensorboard", "loss") == [(10, 10.0), (20, 20.0), (30, 3.0)]
    # the same fine-tune run again (a fresh logger in the same directory) starts TensorBoard over as well
    log = metrics.MetricsLogger(tmp_path, stream=io.StringIO())
    log.log(5, {"loss": 1.0})
    log.close()
    assert _scalars(tmp_path / "tensorboard", "loss") == [(5, 1.0)]


def test_plot_of_one_logged_step_shows_its_point(tmp_path, monkeypatch):
    figs = []
    monkeypatch.setattr(metrics, "save_figure", lambda fig, png: figs.append(fig))
    rows = [{"step": 7, "loss": 2.5, "mlm_acc": 0.4}]
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    metrics.plot_metrics(tmp_path / "m.jsonl", tmp_path / "m.png")
    lines = [line for ax in figs[0].axes for line in ax.get_lines()]
    assert len(lines) == 2 and all(line.get_marker() not in (None, "None", "") for line in lines)
    from bertforge.finetune.runner import plot_finetune  # fine-tuning's plot: the same rule

    (tmp_path / "f.jsonl").write_text(json.dumps({"step": 3, "loss": 0.7}) + "\n")
    plot_finetune(tmp_path / "f.jsonl", tmp_path / "f.png", "accuracy")
    assert [line.get_marker() for ax in figs[1].axes for line in ax.get_lines()] == ["."]
    # NaN losses (written as "nan") and an empty file draw nothing and raise nothing
    (tmp_path / "n.jsonl").write_text('{"step": 1, "loss": "nan"}\n{"step": 2, "loss": "nan"}\n')
    metrics.plot_metrics(tmp_path / "n.jsonl", tmp_path / "n.png")
    (tmp_path / "e.jsonl").write_text("")
    assert metrics.plot_metrics(tmp_path / "e.jsonl", tmp_path / "e.png") is None


def test_progress_rate_leaves_out_items_a_resumed_command_finds_done():
    clock, lines = Clock(), []
    p = Progress("data shards", 10, "shards", lines.append, every_s=0, clock=clock)
    clock.t += 0.01
    for _ in range(8):  # a resumed `data shards`: 8 of 10 shards kept, at once
        p.update(kept=True)
    clock.t += 10.0
    p.update()  # one shard built in 10 s: one left, 10 s more
    assert p.rate == pytest.approx(1 / 10.01) and p.eta_s == pytest.approx(10.01)
    assert lines[-1].startswith("data shards: 9/10 shards (90%) | 0.0999 shards/s | eta 0m10s")


def test_progress_of_an_instant_or_all_kept_phase_ends_with_no_time_left():
    clock, lines = Clock(), []
    p = Progress("shards", 3, "shards", lines.append, every_s=0, clock=clock)
    p.update(3)  # faster than the clock ticks: finished, not "eta ?"
    assert p.eta_s == 0.0 and lines == ["shards: 3/3 shards (100%) | 0 shards/s | eta 0m00s"]
    p = Progress("pack", 2, "shards", lines.append, every_s=0, clock=clock)
    clock.t += 1.0
    p.update(2, kept=True)  # nothing done here: finished all the same
    assert p.eta_s == 0.0 and lines[-1] == "pack: 2/2 shards (100%) | 0 shards/s | eta 0m00s"


def test_modernbert_span_and_token_heads_count_their_dense_layer():
    c = BertConfig.from_preset("modernbert-tiny")
    T, H = 64, c.hidden_size
    enc = flops_per_sequence(c, T, 0, task="mlm", training=False)
    assert flops_per_sequence(c, T, task="qa", training=False) == pytest.approx(enc + 2 * T * H * H + 4 * T * H)
    tok = flops_per_sequence(c, T, task="token_classification", training=False, num_labels=5)
    assert tok == pytest.approx(enc + 2 * T * H * H + 2 * T * H * 5)
    b = BertConfig.from_preset("tiny")  # BERT's span head is the bare linear layer
    enc = flops_per_sequence(b, T, 0, task="mlm", training=False)
    assert flops_per_sequence(b, T, task="qa", training=False) == pytest.approx(enc + 4 * T * b.hidden_size)


def test_info_on_a_gpu_without_bf16_names_its_fast_path(monkeypatch, capsys):
    data = {
        "bertforge": "x",
        "torch": "x",
        "python": "x",
        "platform": "x",
        "cpu": "x",
        "threads": 4,
        "devices": [{"device": "cuda:0", "name": "Tesla V100", "memory_gb": 16, "bf16": False, "fp16": True}],
        "chosen_device": "cuda:0",
        "auto_precision": "fp16",
        "matmul_peak_gflops": {
            "device": "cuda:0",
            "size": 8192,
            "threads": 4,
            "fp32": 14_000.0,
            "bf16": 12_000.0,
            "fp16": 100_000.0,
            "bf16_native": False,
        },
    }
    monkeypatch.setattr(info, "collect", lambda device, refresh: data)
    assert info.info_run(argparse.Namespace(device="auto", refresh=False, json=False)) == 0
    out = capsys.readouterr().out
    assert "AVX-512" not in out and "fp16 is the fast path" in out
