"""Instruments for training runs: a `torch.profiler` trace of a few steps, and NVML power/clock sampling.

    with StepProfiler("runs/x/profile", steps=10, device=device) as prof:    # `bertforge pretrain --profile 10`
        for batch in batches:
            train_step(batch)
            prof.step()
            if prof.done:
                break
    print(prof.table)             # the top ops/kernels by self time; trace.json opens in ui.perfetto.dev

    sampler = PowerSampler(device)                                          # a no-op off NVIDIA GPUs
    ... every log line: metrics.update(sampler.window(sequences=n))          # watts, joules, joules_per_seq, ...
    sampler.close()

**Trace.** NVIDIA's performance guide for its BERT profiles GPU runs with Nsight/nvprof; `torch.profiler` gives
the same kernel timeline from inside the process on any device: CPU ops always, CUDA kernels where CUDA is
present. The trace is Chrome-trace JSON (`trace.json`), which Perfetto (ui.perfetto.dev), chrome://tracing and
TensorBoard's PyTorch profiler plugin open; it is written atomically (`bertforge.runtime.io`). The table ranks
by *self* time (time in the op itself, not its children): device time of kernels on a GPU, CPU time on a CPU.

**Power.** `PowerSampler` reads NVML (`pynvml`, from the `nvidia-ml-py` package: `pip install
bertforge[gpu]`) in a background thread every ~100 ms: board power, SM clock, GPU temperature and memory used.
`window()` returns the averages since its last call and the energy used in between: from NVML's total-energy
counter where the GPU has one (Volta and newer), else integrated from the power samples (trapezoid rule).
Without pynvml, without an NVIDIA GPU, or when NVML fails to start it is disabled and `window()` returns {}.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bertforge.runtime.io import atomic_path, write_text

TRACE_NAME = "trace.json"
"""File name of the Chrome/Perfetto trace inside the profile directory."""


# ============================================================================================ trace
def _activities(device: torch.device) -> list[torch.profiler.ProfilerActivity]:
    """CPU always; the device's own activity (CUDA, XPU) where this torch build can record it."""
    acts = [torch.profiler.ProfilerActivity.CPU]
    extra = getattr(torch.profiler.ProfilerActivity, device.type.upper(), None)
    if device.type != "cpu" and extra is not None and extra in torch.profiler.supported_activities():
        acts.append(extra)
    return acts


def _self_device_us(event: Any) -> float:
    """Self device time of a profiler event (the attribute was renamed from cuda to device in torch 2.4)."""
    for name in ("self_device_time_total", "self_cuda_time_total"):
        value = getattr(event, name, None)
        if value is not None:
            return float(value)
    return 0.0


def top_ops(events: Any, on_device: bool, n: int = 15) -> list[dict[str, Any]]:
    """The n events of `key_averages()` with the most self time: device time of the device's own events
    (kernels, copies) when `on_device`, CPU time of ops otherwise. Each: name, self_ms, share (of the total
    self time of the ranked kind), calls. The ops that launch kernels carry the kernels' device time too
    (seen on an H100, torch 2.11): counting both would count it twice, so ops are left out on a device."""
    from torch.autograd import DeviceType

    if on_device:
        rows = [
            (e.key, _self_device_us(e), int(e.count))
            for e in events
            # a range (ProfilerStep#, Optimizer.step#, record_function) also shows on the device's timeline,
            # spanning its kernels: ranking it with them would count their time twice
            if e.device_type != DeviceType.CPU and not getattr(e, "is_user_annotation", False)
        ]
    else:
        rows = [(e.key, float(e.self_cpu_time_total), int(e.count)) for e in events]
    rows = [r for r in rows if r[1] > 0]
    total = sum(r[1] for r in rows) or 1.0
    rows.sort(key=lambda r: -r[1])
    return [{"name": name, "self_ms": us / 1e3, "share": us / total, "calls": calls} for name, us, calls in rows[:n]]


def format_table(rows: list[dict[str, Any]], title: str) -> str:
    """A short fixed-width table of `top_ops` rows."""
    lines = [title, f"{'self ms':>10} {'share':>6} {'calls':>7}  name"]
    for r in rows:
        name = r["name"] if len(r["name"]) <= 90 else r["name"][:87] + "..."
        lines.append(f"{r['self_ms']:10.2f} {r['share']:6.1%} {r['calls']:7d}  {name}")
    return "\n".join(lines)


PROFILE_WARMUP = 1
"""Steps a StepProfiler lets pass unrecorded before its window (the first step compiles and warms caches)."""


class StepProfiler:
    """Record `steps` training steps (after `warmup` unrecorded ones) with torch.profiler; on exit, or as
    soon as the window is complete, write `out_dir/trace.json` and `out_dir/top_ops.txt` and set `table`.

    Call `step()` once after every training step; `done` turns True when the trace is written."""

    def __init__(
        self,
        out_dir: str | os.PathLike,
        steps: int = 10,
        device: torch.device | str = "cpu",
        warmup: int = PROFILE_WARMUP,
        top: int = 15,
        record_shapes: bool = False,
        name: str = TRACE_NAME,
    ):
        if steps < 1 or warmup < 0:
            raise ValueError(f"profile steps must be >= 1 and warmup >= 0, got steps={steps} warmup={warmup}")
        self.out_dir, self.steps, self.warmup, self.top = Path(out_dir), steps, warmup, top
        self.device = torch.device(device)
        self.trace_path = self.out_dir / name
        self.on_device = len(_activities(self.device)) > 1
        self.table: str = ""
        self.top_rows: list[dict[str, Any]] = []
        self.done = False
        self.stepped = 0  # step() calls so far: the window is calls warmup+1 .. warmup+steps
        self.recorded = 0  # steps in the written trace: `steps`, or fewer when the profiler exited before
        self._prof = torch.profiler.profile(
            activities=_activities(self.device),
            record_shapes=record_shapes,
            schedule=torch.profiler.schedule(wait=0, warmup=warmup, active=steps, repeat=1),
            on_trace_ready=self._write,
        )

    def __enter__(self) -> StepProfiler:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._prof.__enter__()
        return self

    def step(self) -> None:
        if self.done:
            return
        self.stepped += 1
        if self.stepped in (self.warmup, self.warmup + self.steps):
            # the window opens or closes here: the device must have finished the steps before it first. Kineto
            # keeps only kernels that begin and end inside the window, and the caller's step returns with its
            # last kernels (the optimizer's, queued after the step's one host sync) still running: unsynced,
            # the last recorded step loses them and its update disappears from the table
            from bertforge import device as dev

            dev.synchronize(self.device)
        self._prof.step()

    def __exit__(self, *exc: Any) -> None:
        if not self.done and self.stepped > self.warmup:  # a window cut short is written now: its kernels too
            from bertforge import device as dev

            dev.synchronize(self.device)
        self._prof.__exit__(*exc)
        if not self.done:  # torch writes nothing when the steps end inside the warm-up
            self.table = f"no profile: the steps ended within the {self.warmup} warm-up step(s), before the window"

    def _write(self, prof: torch.profiler.profile) -> None:
        """on_trace_ready: the trace and the table of the recorded window."""
        if self.done:
            return
        with atomic_path(self.trace_path) as tmp:
            prof.export_chrome_trace(str(tmp))
        self.top_rows = top_ops(prof.key_averages(), self.on_device, self.top)
        what = "kernels by self device time" if self.on_device else "ops by self CPU time"
        # called on exit too when the steps ran out inside the window: say how many steps the trace holds
        self.recorded = min(self.stepped - self.warmup, self.steps)
        if self.recorded < self.steps:
            over = f"only {self.recorded} of {self.steps} steps (the steps ended first)"
        else:
            over = f"{self.steps} steps"
        self.table = format_table(self.top_rows, f"top {len(self.top_rows)} {what} over {over} ({self.trace_path})")
        write_text(self.out_dir / "top_ops.txt", self.table + "\n")
        self.done = True

    def summary(self) -> dict[str, Any]:
        return {"trace": str(self.trace_path), "steps": self.recorded, "table": self.table, "top": self.top_rows}


def profile_steps(
    step_fn: Callable[[], Any],
    n: int,
    out_dir: str | os.PathLike,
    device: torch.device | str = "cpu",
    warmup: int = 1,
    top: int = 15,
) -> dict[str, Any]:
    """Run `step_fn` warmup + n times under `StepProfiler`; returns its summary (trace path, table, top ops)."""
    from bertforge import device as dev

    where = torch.device(device)
    with StepProfiler(out_dir, n, where, warmup=warmup, top=top) as prof:
        for _ in range(warmup + n):
            step_fn()
            dev.synchronize(where)  # the step's kernels belong to this step's window
            prof.step()
    return prof.summary()


# ============================================================================================ step parts
STEP_PARTS = ("forward", "backward", "clip", "optimizer", "between")
"""What `StepTimeline` splits a training step into: the forward and loss (with the copy of the batch to the
device), the backward, the gradient norm and clip (with the one host sync of the step), the optimizer update
(with clearing the gradients), and the time between two steps (waiting for the next update's first micro-batch,
logging, the loop)."""


class StepTimeline:
    """Where a training step's time goes, by part (STEP_PARTS): `train_step` marks the end of each part. On CUDA
    a mark is an event recorded on the stream, so the time between two marks is the device's timeline — its
    kernels and the gaps where it waited for the host — and the parts add up to the step's wall time on the
    GPU. (A torch.profiler range would miss the backward: autograd runs CUDA backward ops on a thread of its
    own.) On other devices a mark is the host clock, which is the device's clock for ops that run synchronously.

        timeline = StepTimeline(device)       # the loop sets step.timeline while --profile records
        ... train_step(step, ...) ...         # marks "start", "forward", "backward", ..., "optimizer"
        timeline.summary(skip=1)              # {part: {"ms": per step, "share": of the step}}
    """

    def __init__(self, device: torch.device | str):
        self.cuda = torch.device(device).type == "cuda"
        self.steps: list[list[tuple[str, Any]]] = []  # per step: (part ending at this mark, stamp)

    def mark(self, part: str) -> None:
        """`part` ends here; "start" begins a step (and ends the gap since the last one)."""
        if part == "start":
            self.steps.append([])
        if self.steps:
            self.steps[-1].append((part, self._stamp()))

    def _stamp(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def _ms(self, a: Any, b: Any) -> float:
        return float(a.elapsed_time(b)) if self.cuda else (b - a) * 1e3

    def summary(self, skip: int = 1) -> dict[str, dict[str, float]]:
        """Mean milliseconds per step and share of the step for each part, over the steps after the first
        `skip` (the profiler's warm-up); "between" is the gap before each counted step."""
        if self.cuda:
            torch.cuda.synchronize()  # every recorded event has happened
        totals = dict.fromkeys(STEP_PARTS, 0.0)
        counted = 0
        for i in range(max(skip, 1), len(self.steps)):
            marks, previous = self.steps[i], self.steps[i - 1]
            if not marks or marks[-1][0] != "optimizer":
                continue  # a step cut short (non-finite gradients skip the update) or still running
            totals["between"] += self._ms(previous[-1][1], marks[0][1])
            for (_, a), (part, b) in zip(marks, marks[1:]):
                totals[part] += self._ms(a, b)
            counted += 1
        if not counted:
            return {}
        whole = sum(totals.values()) or 1.0
        return {p: {"ms": v / counted, "share": v / whole} for p, v in totals.items()}


def format_parts(parts: dict[str, dict[str, float]]) -> str:
    """One line: each part's share of the step and its milliseconds."""
    shown = ", ".join(f"{p} {v['share']:.1%} ({v['ms']:.1f} ms)" for p, v in parts.items())
    return f"step time by part: {shown or 'no complete update recorded'}"


# ============================================================================================ power
def _load_nvml() -> Any | None:
    """The pynvml module (package nvidia-ml-py), or None when it is not installed."""
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def _nvml_handle(nvml: Any, index: int) -> Any:
    """NVML handle of CUDA device `index`: CUDA_VISIBLE_DEVICES renumbers devices (by index or UUID)."""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if index < len(visible):
        entry = visible[index]
        if entry.isdigit():
            return nvml.nvmlDeviceGetHandleByIndex(int(entry))
        return nvml.nvmlDeviceGetHandleByUUID(entry)
    return nvml.nvmlDeviceGetHandleByIndex(index)


class PowerSampler:
    """Background NVML sampling of one CUDA device; `window()` = averages and energy since the last call.

    `nvml` replaces the pynvml module (tests pass a fake); `start=False` leaves sampling to explicit
    `sample()` calls (tests, or callers with their own timer)."""

    def __init__(self, device: torch.device | str, interval: float = 0.1, nvml: Any = None, start: bool = True):
        self.device, self.interval = torch.device(device), interval
        self.enabled = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._reset_window()
        self._last: tuple[float, float] | None = None  # (time, watts) of the latest sample
        self._pending = 0.0  # sequences of windows too short to hold a sample: their energy is in the next one
        if self.device.type != "cuda":
            return  # no NVIDIA GPU: a no-op, pynvml is not even imported
        loaded = nvml if nvml is not None else _load_nvml()
        if loaded is None:
            return
        self._nvml: Any = loaded  # the pynvml module (untyped) or a test's fake
        try:
            self._nvml.nvmlInit()
            self._handle = _nvml_handle(self._nvml, self.device.index or 0)
        except Exception:  # NVMLError (no driver, a non-NVIDIA GPU, no permission): stay disabled
            return
        self._energy_mj = self._read_energy()
        self.enabled = True
        if start:
            self._thread = threading.Thread(target=self._run, name="bertforge-nvml", daemon=True)
            self._thread.start()

    def _reset_window(self, now: float | None = None) -> None:
        self._n = 0
        self._sums = [0.0, 0.0, 0.0, 0.0]  # watts, sm clock MHz, temperature C, memory used GB
        self._joules = 0.0
        self._t0 = time.monotonic() if now is None else now

    def _read_energy(self) -> float | None:
        """NVML's total energy counter in mJ (Volta and newer), or None where the GPU has none."""
        try:
            return float(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))
        except Exception:
            return None

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sample()
            except Exception:  # a transient NVML error must not kill the run; try again next tick
                continue

    def sample(self, now: float | None = None) -> None:
        """Read power, SM clock, temperature and memory once and add them to the window."""
        nv, h = self._nvml, self._handle
        now = time.monotonic() if now is None else now
        watts = nv.nvmlDeviceGetPowerUsage(h) / 1000.0  # milliwatts
        values = (
            watts,
            float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
            float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
            nv.nvmlDeviceGetMemoryInfo(h).used / 1e9,
        )
        with self._lock:
            if self._last is not None:  # trapezoid rule between consecutive samples
                self._joules += 0.5 * (self._last[1] + watts) * (now - self._last[0])
            self._last = (now, watts)
            self._n += 1
            self._sums = [s + v for s, v in zip(self._sums, values)]

    def window(self, sequences: float | None = None, now: float | None = None) -> dict[str, float]:
        """Averages since the last call (watts, sm_clock_mhz, temp_c, mem_used_gb), energy in joules and,
        given the sequences processed in the window, joules_per_seq. {} when disabled or nothing sampled."""
        if not self.enabled:
            return {}
        with self._lock:
            if self._n == 0:  # shorter than one sampling interval: it merges into the next window, and so
                self._pending += sequences or 0.0  # must its sequences, or joules_per_seq counts its energy only
                return {}
            sequences, self._pending = (sequences or 0.0) + self._pending, 0.0
            now = time.monotonic() if now is None else now
            n, sums, joules, seconds = self._n, self._sums, self._joules, now - self._t0
            self._reset_window(now)
        watts = sums[0] / n
        if self._energy_mj is not None:  # the hardware counter is exact and covers the whole window
            energy = self._read_energy()
            if energy is not None:
                joules, self._energy_mj = (energy - self._energy_mj) / 1000.0, energy
                # NVML's power reading is a ~1 s moving average that lags load changes (an H100 ramping up
                # read 592 W on average while its counter gave 736 W over the same 3 s): energy / time
                watts = joules / seconds if seconds > 0 else watts
        out = {
            "watts": watts,
            "sm_clock_mhz": sums[1] / n,
            "temp_c": sums[2] / n,
            "mem_used_gb": sums[3] / n,
            "joules": joules,
            "power_seconds": seconds,
        }
        if sequences:
            out["joules_per_seq"] = joules / sequences
        return out

    def close(self) -> None:
        """Stop the sampling thread and shut NVML down (safe to call twice)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.interval + 1)
            self._thread = None
        if self.enabled:
            self.enabled = False
            with contextlib.suppress(Exception):  # shutting down after a failed NVML call must not raise
                self._nvml.nvmlShutdown()

    def __enter__(self) -> PowerSampler:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
