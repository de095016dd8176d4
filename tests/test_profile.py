"""Instruments: the torch.profiler trace of a few steps (CPU), and NVML power sampling with a fake NVML."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
import torch

from bertforge.runtime import profile as prof


def _tiny_step():
    from bertforge.model import BertConfig, build_model

    torch.manual_seed(0)
    model = build_model(BertConfig.from_preset("tiny", vocab_size=64, max_position_embeddings=32), "pretraining")
    ids = torch.randint(5, 64, (4, 16))
    batch = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "token_type_ids": torch.zeros_like(ids),
        "masked_positions": torch.tensor([[1, 2, 0]] * 4),
        "masked_labels": torch.tensor([[7, 8, 0]] * 4),
        "nsp_labels": torch.tensor([0, 1, 0, 1]),
    }

    def step():
        model.zero_grad(set_to_none=True)
        model(**batch).loss.backward()

    return step


def test_profile_steps_writes_a_perfetto_trace_and_a_top_table(tmp_path):
    calls = []
    step = _tiny_step()
    out = prof.profile_steps(lambda: calls.append(step()), n=2, out_dir=tmp_path / "p", device="cpu", warmup=1)
    assert len(calls) == 3 and out["steps"] == 2
    trace = json.loads((tmp_path / "p" / "trace.json").read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert "aten::addmm" in names or "aten::mm" in names
    assert out["trace"] == str(tmp_path / "p" / "trace.json")
    ranked = [r["name"] for r in out["top"]]
    assert any(n in ("aten::addmm", "aten::mm", "aten::bmm") for n in ranked[:10]), ranked
    assert all(a["self_ms"] >= b["self_ms"] for a, b in zip(out["top"], out["top"][1:]))
    assert 0 < sum(r["share"] for r in out["top"]) <= 1.0 + 1e-9
    assert "by self CPU time" in out["table"] and "aten::" in out["table"]
    assert (tmp_path / "p" / "top_ops.txt").read_text().strip() == out["table"]
    assert not list((tmp_path / "p").glob(".*tmp*"))  # written atomically, no temporaries left


def test_step_profiler_stops_recording_after_its_window(tmp_path):
    step = _tiny_step()
    with prof.StepProfiler(tmp_path, steps=1, device="cpu", warmup=1) as p:
        for _ in range(5):
            step()
            p.step()
        assert p.done
    assert p.summary()["steps"] == 1 and (tmp_path / "trace.json").is_file()
    with pytest.raises(ValueError):
        prof.StepProfiler(tmp_path, steps=0)


def test_top_ops_ranks_kernels_only_on_a_device():
    from torch.autograd import DeviceType

    def ev(key, kind, dev_us, cpu_us, count=1):
        return SimpleNamespace(
            key=key, device_type=kind, self_device_time_total=dev_us, self_cpu_time_total=cpu_us, count=count
        )

    # as seen on an H100: the op that launches a kernel carries the kernel's device time as well
    events = [
        ev("aten::mm", DeviceType.CPU, 300.0, 50.0, 2),
        ev("sm90_gemm", DeviceType.CUDA, 300.0, 0.0, 2),
        ev("elementwise", DeviceType.CUDA, 100.0, 0.0, 4),
        ev("aten::add", DeviceType.CPU, 0.0, 10.0),
        # a range on the device's timeline spans its kernels (is_user_annotation): not a kernel of its own
        SimpleNamespace(**vars(ev("ProfilerStep#3", DeviceType.CUDA, 400.0, 0.0)), is_user_annotation=True),
    ]
    dev = prof.top_ops(events, on_device=True)
    assert [r["name"] for r in dev] == ["sm90_gemm", "elementwise"] and dev[0]["share"] == pytest.approx(0.75)
    cpu = prof.top_ops(events, on_device=False, n=1)
    assert cpu == [{"name": "aten::mm", "self_ms": 0.05, "share": pytest.approx(50 / 60), "calls": 2}]


def test_step_timeline_splits_each_update_into_its_parts(monkeypatch):
    """Host-clock marks (CPU): each part is the time from the mark before; "between" is the gap since the last
    update; the warm-up update and one whose gradients were not finite (no optimizer mark) are not counted."""
    clock = iter(range(100))
    monkeypatch.setattr(prof.time, "perf_counter", lambda: next(clock) / 1000)  # one ms per mark
    timeline = prof.StepTimeline("cpu")
    parts_of_an_update = ["start", "forward", "backward", "forward", "backward", "clip", "optimizer"]
    for _ in range(2):  # warm-up, then one counted update (accum 2)
        for part in parts_of_an_update:
            timeline.mark(part)
    for part in ["start", "forward", "backward", "clip"]:  # skipped: non-finite gradients
        timeline.mark(part)
    for part in parts_of_an_update:
        timeline.mark(part)
    parts = timeline.summary(skip=1)
    assert list(parts) == list(prof.STEP_PARTS)
    assert {p: v["ms"] for p, v in parts.items()} == pytest.approx(
        {"forward": 2.0, "backward": 2.0, "clip": 1.0, "optimizer": 1.0, "between": 1.0}
    )
    assert parts["forward"]["share"] == pytest.approx(2 / 7)
    assert "optimizer 14.3% (1.0 ms)" in prof.format_parts(parts)
    assert prof.StepTimeline("cpu").summary() == {}


def test_format_table_truncates_long_names():
    rows = [{"name": "k" * 200, "self_ms": 1.5, "share": 0.75, "calls": 3}]
    table = prof.format_table(rows, "title")
    assert table.splitlines()[0] == "title" and "..." in table and "75.0%" in table and len(table) < 200


# ============================================================================================ power
class FakeNVML:
    """pynvml's calls the sampler makes; power readings come from a list (milliwatts)."""

    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, power_mw, energy_mj=None):
        self.power, self.energy, self.calls = list(power_mw), energy_mj, []

    def nvmlInit(self):
        self.calls.append("init")

    def nvmlShutdown(self):
        self.calls.append("shutdown")

    def nvmlDeviceGetHandleByIndex(self, i):
        self.calls.append(("index", i))
        return f"gpu{i}"

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self.calls.append(("uuid", uuid))
        return uuid

    def nvmlDeviceGetPowerUsage(self, h):
        return self.power.pop(0)

    def nvmlDeviceGetClockInfo(self, h, kind):
        assert kind == self.NVML_CLOCK_SM
        return 1980

    def nvmlDeviceGetTemperature(self, h, kind):
        return 60

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=40e9)

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        if self.energy is None:
            raise RuntimeError("NVMLError_NotSupported")
        return self.energy.pop(0)


def test_power_sampler_is_a_no_op_without_an_nvidia_gpu(monkeypatch):
    def boom():
        raise AssertionError("pynvml must not be imported for a CPU device")

    monkeypatch.setattr(prof, "_load_nvml", boom)
    with prof.PowerSampler("cpu") as s:
        assert not s.enabled and s.window(sequences=10) == {} and s._thread is None


def test_power_sampler_without_pynvml_or_with_a_failing_nvml(monkeypatch):
    monkeypatch.setattr(prof, "_load_nvml", lambda: None)
    assert prof.PowerSampler("cuda:0").window() == {}
    broken = FakeNVML([])
    broken.nvmlInit = lambda: (_ for _ in ()).throw(RuntimeError("NVML_ERROR_DRIVER_NOT_LOADED"))
    s = prof.PowerSampler("cuda", nvml=broken)
    assert not s.enabled and s.window() == {}
    s.close()


def test_power_window_integrates_power_samples(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fake = FakeNVML([100_000, 200_000, 300_000, 300_000])  # 100, 200, 300, 300 W
    monkeypatch.setattr(prof, "_load_nvml", lambda: fake)
    s = prof.PowerSampler("cuda:1", start=False)
    assert s.enabled and ("index", 1) in fake.calls
    assert s.window() == {}  # nothing sampled yet
    for t in (0.0, 1.0, 2.0):
        s.sample(now=t)
    w = s.window(sequences=100, now=2.0)
    assert w["joules"] == pytest.approx(150 + 250)  # trapezoids over [0, 1] and [1, 2]
    assert w["watts"] == pytest.approx(200) and w["joules_per_seq"] == pytest.approx(4.0)
    assert w["sm_clock_mhz"] == 1980 and w["temp_c"] == 60 and w["mem_used_gb"] == pytest.approx(40)
    s.sample(now=3.0)  # the interval [2, 3] belongs to the next window
    w2 = s.window(now=3.0)
    assert w2["joules"] == pytest.approx(300) and w2["power_seconds"] == pytest.approx(1.0)
    assert "joules_per_seq" not in w2
    s.close()
    s.close()
    assert fake.calls.count("shutdown") == 1 and s.window() == {}


def test_power_window_prefers_the_energy_counter(monkeypatch):
    fake = FakeNVML([100_000, 100_000], energy_mj=[5_000_000, 5_250_000])
    s = prof.PowerSampler("cuda", nvml=fake, start=False)
    s._t0 = 0.0
    s.sample(now=0.0)
    s.sample(now=1.0)
    w = s.window(sequences=50, now=2.0)
    assert w["joules"] == pytest.approx(250)  # (5,250,000 - 5,000,000) mJ, not the samples' 100 J
    assert w["watts"] == pytest.approx(125) and w["joules_per_seq"] == pytest.approx(5)  # 250 J over 2 s
    s.close()


def test_cuda_visible_devices_maps_to_nvml(monkeypatch):
    fake = FakeNVML([])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,GPU-abc")
    assert prof._nvml_handle(fake, 0) == "gpu3" and prof._nvml_handle(fake, 1) == "GPU-abc"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert prof._nvml_handle(fake, 2) == "gpu2"


def test_power_sampler_thread_samples_and_stops(monkeypatch):
    fake = FakeNVML([50_000] * 10_000)
    s = prof.PowerSampler("cuda", nvml=fake, interval=0.01)
    deadline = time.monotonic() + 5
    while not s._n and time.monotonic() < deadline:
        time.sleep(0.01)
    w = s.window(sequences=1)
    assert w["watts"] == pytest.approx(50) and w["joules"] >= 0
    thread = s._thread
    assert thread is not None and thread.name == "bertforge-nvml"
    s.close()
    thread.join(timeout=30)  # close() waits about a second; a loaded machine may take longer to schedule it
    assert s._thread is None and not thread.is_alive()
