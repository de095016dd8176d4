"""The loop's reported numbers: the MFU denominator measured before the data workers start, and energy per
sequence of the one GPU the power sampler reads."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from tests.train.conftest import tiny_config as _cfg

from bertforge import device as dev
from bertforge.train import loop


def test_the_matmul_peak_is_measured_at_set_up_before_the_first_step(shards, tmp_path, monkeypatch):
    """Measured at the first log line, the peak competed with the loader's workers for the CPU: low, and cached."""
    events: list[str] = []
    real = dev.matmul_peak
    monkeypatch.setattr(dev, "matmul_peak", lambda device, *a, **k: events.append("peak") or real(device, *a, **k))
    monkeypatch.setattr(loop, "train", lambda run, *a, **k: events.append("train") or {})
    loop.run_pretrain(_cfg(shards, tmp_path / "r"))
    assert events[:2] == ["peak", "train"]


def test_joules_per_sequence_divides_by_the_sampled_gpus_sequences(monkeypatch):
    """The sampler reads rank 0's GPU: its energy over rank 0's sequences, not over every rank's."""
    seen: dict[str, float] = {}

    def window(sequences):
        seen["sequences"] = sequences
        return {}

    monkeypatch.setattr(loop, "_mfu", lambda *a: 0.0)
    run = SimpleNamespace(
        cfg=SimpleNamespace(train=SimpleNamespace(global_batch_size=8, task="pretraining")),
        info=SimpleNamespace(world_size=4, is_main=True),
        device=torch.device("cpu"),
        precision="fp32",
        bert_cfg=None,
        power=SimpleNamespace(window=window),
        state=SimpleNamespace(step=3, phase_offset=0),
        logger=SimpleNamespace(log=lambda step, metrics: None),
    )
    loop._log_window(run, SimpleNamespace(flush=lambda *a: {"seq_per_s": 100.0, "window_s": 2.0}), 1e-3)
    assert seen["sequences"] == 50.0  # 200 sequences over 4 ranks in the window


def test_measuring_the_peak_leaves_the_random_stream_as_it_was(tmp_path, monkeypatch):
    """On a machine without the cached peak its random matrices drew from the run's stream: other dropout masks
    than the same run (or its --resume) on a machine with the cache."""
    monkeypatch.setenv("BERTFORGE_CACHE", str(tmp_path / "empty"))
    monkeypatch.setattr(dev, "_measure", lambda device, dtype, max_n, seconds: (torch.randn(4, 4).sum().item(), 4))
    torch.manual_seed(0)
    loop._measure_peak(torch.device("cpu"))  # measured: the cache is empty
    after = torch.rand(3)
    torch.manual_seed(0)
    assert torch.equal(after, torch.rand(3))
