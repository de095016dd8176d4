"""Device and precision: the one module that touches device-specific APIs (cuda, xpu, hpu, mps).

Everything else asks this module: which device (`resolve_device`), which precision (`resolve_precision`),
an autocast context (`autocast`), a gradient scaler for fp16 (`grad_scaler`), the distributed backend
(`dist_backend`), synchronisation for honest timing (`synchronize`), RNG state for exact resume, and the
measured matmul peak that every MFU we report divides by (`matmul_peak`).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import json
import os
import platform
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bertforge.errors import UserError
from bertforge.runtime.io import cache_dir, write_text

DEVICE_TYPES = ("cpu", "cuda", "xpu", "hpu", "mps")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _hpu_available() -> bool:
    try:
        import habana_frameworks.torch.core  # noqa: F401  (registers the hpu device)
    except ImportError:
        return False
    hpu = getattr(torch, "hpu", None)  # torch.hpu exists only once habana_frameworks has registered it
    return bool(hpu is not None and hpu.is_available())


def is_available(device_type: str) -> bool:
    if device_type == "cpu":
        return True
    if device_type == "cuda":
        return torch.cuda.is_available()
    if device_type == "xpu":
        return bool(getattr(torch, "xpu", None) and torch.xpu.is_available())
    if device_type == "mps":
        return bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
    if device_type == "hpu":
        return _hpu_available()
    return False


def device_count(device_type: str) -> int:
    if not is_available(device_type):
        return 0
    if device_type == "cpu" or device_type == "mps":
        return 1
    return int(getattr(torch, device_type).device_count())


def resolve_device(spec: str = "auto", local_rank: int | None = None, option: str = "--device") -> torch.device:
    """`auto` picks cuda, then xpu, hpu, mps, then cpu; `cuda` under torchrun takes the local rank's index.
    `option` is the flag or config key that gave `spec` (`train.device`), named in the errors."""
    spec = (spec or "auto").strip().lower()
    if spec == "auto":
        spec = next(t for t in ("cuda", "xpu", "hpu", "mps", "cpu") if is_available(t))
    kind, _, index = spec.partition(":")
    said = f"{option} {spec!r}" if option.startswith("--") else f"{option}={spec}"
    if kind not in DEVICE_TYPES:
        raise UserError(f"{said}: unknown device; use auto, cpu, cuda[:N], xpu[:N], hpu or mps")
    if not is_available(kind):
        auto = f"{option} auto" if option.startswith("--") else f"{option}=auto"
        raise UserError(f"{said}: no {kind} device is available on this machine; try {auto}")
    if kind == "cpu":
        return torch.device("cpu")
    if index:
        if not index.isdigit() or int(index) >= device_count(kind):
            raise UserError(f"{said}: this machine has {device_count(kind)} {kind} device(s)")
        return torch.device(kind, int(index))
    if local_rank is None:
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if kind == "mps":
        return torch.device("mps")
    return torch.device(kind, local_rank % max(1, device_count(kind)))


def supports(device: torch.device, precision: str) -> bool:
    """Whether the device runs this precision natively (fast enough to be worth choosing)."""
    kind = device.type
    if precision == "fp32":
        return True
    if kind == "cuda":
        if precision == "bf16":
            # not torch.cuda.is_bf16_supported(): it asks the current device, not this one, and counts bf16 that a
            # V100 or T4 only emulates (no bf16 tensor cores before Ampere, 8.0), where fp16 is the fast path
            return bool(torch.version.hip) or torch.cuda.get_device_capability(device) >= (8, 0)
        return True
    if kind == "cpu":
        if precision == "bf16":
            return cpu_has_native_bf16()
        return False  # fp16 matmul on CPU is emulated: correct but slow
    if kind in ("xpu", "hpu"):
        return True
    if kind == "mps":
        return precision == "fp16" or (precision == "bf16" and torch.backends.mps.is_macos_or_newer(14, 0))
    return False


def _cpuinfo() -> str:
    """/proc/cpuinfo's text, or "" where there is none (macOS, Windows, a sandbox that hides it)."""
    with contextlib.suppress(OSError):
        return Path("/proc/cpuinfo").read_text()
    return ""


def cpu_has_native_bf16() -> bool:
    """AVX-512 BF16 or AMX on x86, or BF16 on Arm: what oneDNN uses for fast bf16 matmuls. A torch built without
    oneDNN (or with it switched off) runs bf16 matmuls in its reference kernels, emulated whatever the CPU has."""
    if not (torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled):
        return False
    try:
        cap = torch.backends.cpu.get_cpu_capability()
    except AttributeError:  # older torch
        cap = ""
    if "AMX" in cap.upper():
        return True
    # the words of the flags (x86) and Features (Arm) lines, not substrings of the whole text
    words = {
        word
        for line in _cpuinfo().splitlines()
        if line.split(":", 1)[0].strip().lower() in ("flags", "features")
        for word in line.partition(":")[2].split()
    }
    return bool(words & {"avx512_bf16", "amx_bf16", "bf16"})


def resolve_precision(spec: str, device: torch.device) -> str:
    """`auto`: bf16 where the device supports it natively, else fp16 on accelerators, else fp32."""
    spec = (spec or "auto").lower()
    if spec not in PRECISIONS:
        raise UserError(f"precision {spec!r}: use one of {', '.join(PRECISIONS)}")
    if spec != "auto":
        if spec in ("fp16", "bf16") and device.type == "cpu" and not supports(device, spec):
            # autocast runs it, emulated: the user's call, but not a silent one
            print(f"warning: {spec} is emulated on this CPU (`bertforge info`): fp32 is faster here", file=sys.stderr)
        return spec
    if supports(device, "bf16"):
        return "bf16"
    if device.type != "cpu" and supports(device, "fp16"):
        return "fp16"
    return "fp32"


def has_triton() -> bool:
    """Whether Triton, which torch.compile builds its CUDA kernels with, is installed."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


TRITON_MIN_CAPABILITY = (7, 0)
"""The oldest CUDA compute capability inductor's Triton kernels build for (older GPUs fail at the first step)."""


def compiles_fast(device: torch.device, distributed: bool) -> bool:
    """Whether a pre-training run's auto settings turn torch.compile on (`config.resolve_auto`): on one CUDA
    device that Triton builds for, where the H100 loop measured it win; multi-process runs were not measured."""
    return (
        device.type == "cuda"
        and not distributed
        and has_triton()
        and torch.cuda.get_device_capability(device) >= TRITON_MIN_CAPABILITY
    )


def check_compile_toolchain(device: torch.device, keys: list[str]) -> None:
    """torch.compile (the settings `keys` that asked for it) builds its kernels at the first step: on the CPU
    with a C++ compiler, on CUDA with Triton. Missing, that is a failure minutes into a run; checked here
    before it starts instead. An inductor whose internals moved (the lookup fails otherwise) is not refused."""
    if not keys:
        return
    asked = " and ".join(keys)
    if "train.cuda_graphs" in keys and device.type != "cuda":
        raise UserError(f"train.cuda_graphs needs a CUDA device; this run is on {device.type}: set it false")
    if device.type == "cuda":
        if not has_triton():
            raise UserError(f"{asked}: torch.compile on CUDA needs Triton (pip install triton); or set it false")
        if (cap := torch.cuda.get_device_capability(device)) < TRITON_MIN_CAPABILITY:
            raise UserError(
                f"{asked}: torch.compile's Triton kernels need a GPU of compute capability "
                f"{'.'.join(map(str, TRITON_MIN_CAPABILITY))} or newer, and this one is {cap[0]}.{cap[1]}: set it false"
            )
    elif device.type == "cpu":
        try:
            from torch._inductor import cpp_builder
            from torch._inductor.exc import InvalidCxxCompiler
        except ImportError:
            return
        try:
            cpp_builder.get_cpp_compiler()
        except InvalidCxxCompiler:
            raise UserError(
                f"{asked}: torch.compile on the CPU builds its kernels with a C++ compiler and none was found "
                "(g++ on PATH, or $CXX): install one (apt install g++) or set it false"
            ) from None


@contextlib.contextmanager
def reproducible_compiled_step(device: torch.device, compiled: bool) -> Iterator[None]:
    """Inductor's multi-threaded CPU kernels accumulate some gradients (the embeddings' scatter-add) with atomic
    adds, in an order that varies from run to run: a compiled CPU run drifts ~1e-7 from its own repeat, and a
    resumed run from an uninterrupted one. In torch's deterministic mode inductor uses ordered kernels instead,
    and exact resume holds (tests/train/test_loop.py). Set for the run on the CPU when compiling, restored after;
    a no-op otherwise (on CUDA the mode also changes eager kernels and needs cuBLAS settings)."""
    if not compiled or device.type != "cpu":
        yield
        return
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """Mixed-precision context for forward passes; a no-op in fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[precision])


def grad_scaler(device: torch.device, precision: str) -> torch.amp.GradScaler:
    """Dynamic loss scaling for fp16; a disabled scaler (pass-through) for fp32 and bf16."""
    return torch.amp.GradScaler(device.type, enabled=(precision == "fp16"))


def dist_backend(device: torch.device) -> str:
    return {"cuda": "nccl", "xpu": "xccl", "hpu": "hccl"}.get(device.type, "gloo")


def set_device(device: torch.device) -> None:
    """Make `device` the current one for libraries that use the implicit current device (NCCL)."""
    if device.type in ("cuda", "xpu") and device.index is not None:
        getattr(torch, device.type).set_device(device)


def synchronize(device: torch.device) -> None:
    if device.type in ("cuda", "xpu", "mps", "hpu"):
        getattr(torch, device.type).synchronize()


def empty_cache(device: torch.device) -> None:
    if device.type in ("cuda", "xpu", "mps"):
        getattr(torch, device.type).empty_cache()


@functools.cache
def _malloc_trim():
    """glibc's `malloc_trim`, or None (another C library, another OS)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def release_host_memory() -> bool:
    """Hand the heap pages glibc holds free back to the OS; True if it did (glibc only).

    Why: training on batches padded to their own longest row allocates tensors of a new size every step, and
    glibc keeps the freed chunks between live ones instead of returning them. Fine-tuning SQuAD on CPU grew to
    11.3 GB resident in 48 minutes that way; one `malloc_trim` brought it back to 4.1 GB. The loop calls this
    every few updates; a call takes milliseconds.
    """
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False


def max_memory_allocated(device: torch.device) -> int:
    if device.type in ("cuda", "xpu"):
        return int(getattr(torch, device.type).max_memory_allocated(device))
    return 0


def reset_peak_memory(device: torch.device) -> None:
    if device.type in ("cuda", "xpu"):
        getattr(torch, device.type).reset_peak_memory_stats(device)


def device_name(device: torch.device) -> str:
    if device.type in ("cuda", "xpu"):
        return str(getattr(torch, device.type).get_device_name(device))
    if device.type == "cpu":
        return cpu_model()
    return device.type


def cpuinfo_fields() -> dict[str, str]:
    """/proc/cpuinfo's fields of the first CPU listed (names lower-cased; empty values left out), {} without it."""
    fields: dict[str, str] = {}
    for line in _cpuinfo().splitlines():
        name, sep, value = line.partition(":")
        if sep and value.strip():
            fields.setdefault(name.strip().lower(), value.strip())  # the first CPU's
    return fields


def cpu_model() -> str:
    """The CPU's name: part of the matmul peak's cache key, so two machines must not share one name. Arm Linux
    has no "model name" line, only the implementer and part numbers that tell a Graviton 2 from a Graviton 3."""
    fields = cpuinfo_fields()
    for name in ("model name", "cpu model", "hardware", "cpu", "uarch"):  # x86; MIPS; old Arm; POWER; RISC-V
        if name in fields:
            return fields[name]
    machine = platform.processor() or platform.machine() or "cpu"
    if "cpu implementer" in fields and "cpu part" in fields:
        return f"{machine} (implementer {fields['cpu implementer']}, part {fields['cpu part']})"
    return machine


# ------------------------------------------------------------------------------------------------ RNG
def rng_state(device: torch.device) -> dict[str, Any]:
    """Every RNG a training step draws from, for exact resume (torch CPU + the accelerator's)."""
    state: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if device.type in ("cuda", "xpu"):
        state[device.type] = getattr(torch, device.type).get_rng_state(device)
    return state


def set_rng_state(device: torch.device, state: dict[str, Any]) -> None:
    torch.set_rng_state(state["cpu"])
    if device.type != "cpu" and device.type in state:
        getattr(torch, device.type).set_rng_state(state[device.type], device)


# ---------------------------------------------------------------------------------------- matmul peak
@dataclass
class Peak:
    fp32_gflops: float
    bf16_gflops: float | None
    fp16_gflops: float | None
    size: int
    device: str
    threads: int
    bf16_native: bool = False


def _cache_path() -> Path:
    return cache_dir() / "matmul_peak.json"


def _measure(device: torch.device, dtype: torch.dtype, max_n: int, seconds: float) -> tuple[float, int]:
    """Best GFLOP/s of an n x n matmul; n grows from 256 until a product takes >= 20 ms (or max_n), so a
    dtype the device only emulates (bf16 on a CPU without AVX-512 BF16/AMX) is measured in bounded time. The
    fastest of three products decides: one delayed by a page fault or a preemption stopped the growth at a size
    far below the device's peak (a 256 x 256 fp32 matmul on a CPU), and that low peak was cached."""
    n = 256
    while True:
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        torch.matmul(a, b)  # warm-up: kernel selection, page faults, clocks
        synchronize(device)
        took = []
        for _ in range(3):
            t0 = time.perf_counter()
            torch.matmul(a, b)
            synchronize(device)
            took.append(time.perf_counter() - t0)
            if took[-1] < 0.02:  # one fast product is enough to grow
                break
        if min(took) >= 0.02 or n >= max_n:
            break
        n *= 2
    best = 0.0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        t0 = time.perf_counter()
        torch.matmul(a, b)
        synchronize(device)
        best = max(best, 2 * n**3 / (time.perf_counter() - t0) / 1e9)
    return best, n


def _cpu_snapshot() -> tuple[float, float, float]:
    """(wall seconds, CPU seconds spent busy on the cores this process may run on, by anyone, this process's own
    CPU seconds): two of them bracket a measurement to tell how much of the cores other processes took."""
    import psutil

    per_core = psutil.cpu_times(percpu=True)
    try:
        mine = [per_core[i] for i in sorted(os.sched_getaffinity(0))]
    except (AttributeError, IndexError):  # no affinity API (macOS, Windows), or a container's renumbered cores
        mine = per_core
    # busy = everything but idle and iowait; steal is a hypervisor giving the core to another guest
    busy = sum(t.user + t.nice + t.system + sum(getattr(t, f, 0.0) for f in ("irq", "softirq", "steal")) for t in mine)
    return time.perf_counter(), busy, time.process_time()


CONTENDED_SHARE = 0.15
"""A CPU peak measured while other processes took more than this share of the cores its threads ran on is not
cached: it reads low, and every later MFU divided by it reads high."""


def _contended_share(before: tuple[float, float, float], after: tuple[float, float, float], threads: int) -> float:
    """The share of `threads` cores that other processes kept busy between two `_cpu_snapshot`s, beyond the cores
    the measurement left free. 0 for a window under 0.2 s: the kernel counts CPU time in 10 ms ticks."""
    wall = after[0] - before[0]
    if wall < 0.2:
        return 0.0
    others = max(0.0, (after[1] - before[1]) - (after[2] - before[2])) / wall  # cores' worth kept busy by others
    try:
        spare = max(0, len(os.sched_getaffinity(0)) - threads)
    except AttributeError:
        spare = max(0, (os.cpu_count() or threads) - threads)
    return max(0.0, others - spare) / max(1, threads)


_uncached: dict[tuple[str, str], Peak] = {}
"""Peaks measured under load, not written to the cache: kept for this process, so that its later calls (every
logged MFU) do not measure again."""


def matmul_peak(device: torch.device, refresh: bool = False, seconds: float = 1.0) -> Peak:
    """Best dense n x n matmul throughput in GFLOP/s per dtype on `device`, cached per machine setup.

    This is the denominator of every MFU bertforge reports: the peak this machine reaches in practice,
    not a datasheet number. On the CPU the measurement is not cached when other processes competed with it
    for the cores (a run beside another job, or `bertforge info` during a build): the next run measures again.
    """
    threads = torch.get_num_threads()
    # "guarded": entries cached before the load check and the three-product size ramp may be low; measured again
    key = f"{device_name(device)}|{device}|torch {torch.__version__}|threads {threads}|guarded"
    path = _cache_path()
    cache: Any = {}
    with contextlib.suppress(OSError, ValueError):
        cache = json.loads(path.read_text())
    cache = cache if isinstance(cache, dict) else {}  # another program's file, or a damaged one: measure again
    if not refresh and key in cache:
        with contextlib.suppress(TypeError):  # an entry of another bertforge version's shape: measured again
            cached = Peak(**cache[key])
            rates = (cached.fp32_gflops, cached.bf16_gflops or 0.0, cached.fp16_gflops or 0.0)
            if all(isinstance(r, (int, float)) and not isinstance(r, bool) for r in rates):
                # asked now, not read from the file: an entry cached before a fix to `supports` stays true
                return dataclasses.replace(cached, bf16_native=supports(device, "bf16"))
    if not refresh and (str(path), key) in _uncached:
        return _uncached[(str(path), key)]
    before = _cpu_snapshot() if device.type == "cpu" else None
    max_n = 4096 if device.type == "cpu" else 8192
    fp32, n = _measure(device, torch.float32, max_n, seconds)
    # bf16 is measured even where it is only emulated: the number tells users not to pick it there
    bf16, _ = _measure(device, torch.bfloat16, max_n, seconds)
    fp16 = _measure(device, torch.float16, max_n, seconds)[0] if device.type != "cpu" else None
    peak = Peak(fp32, bf16, fp16, n, str(device), threads, supports(device, "bf16"))
    contended = 0.0 if before is None else _contended_share(before, _cpu_snapshot(), threads)
    if contended > CONTENDED_SHARE and not refresh:
        print(
            f"warning: other processes took {contended:.0%} of the {threads} cores the matmul peak was measured on: "
            "not cached, as MFU against it reads high; it is measured again at the next run "
            "(or `bertforge info --refresh`, which caches it whatever the load, on an idle machine)",
            file=sys.stderr,
        )
        _uncached[(str(path), key)] = peak
        return peak
    if contended > CONTENDED_SHARE:  # asked for: a host that is never idle must be able to keep a peak
        print(f"warning: other processes took {contended:.0%} of the cores; cached as --refresh asks", file=sys.stderr)
    _uncached.pop((str(path), key), None)
    cache[key] = peak.__dict__
    with contextlib.suppress(OSError, UserError):  # write_text says an unwritable cache as a UserError: no cache
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text(path, json.dumps(cache, indent=1))
    return peak


def peak_flops(device: torch.device, precision: str) -> float:
    """FLOP/s denominator for MFU at a training precision: its measured matmul peak (fp16 unmeasured: bf16's),
    or fp32's where that is higher — an emulated bf16 (1 GFLOP/s on a CPU without AVX-512 BF16) is no
    ceiling, as autocast runs much of the step in fp32, and MFU must stay a fraction of what the device can do."""
    peak = matmul_peak(device)
    own = {"fp32": peak.fp32_gflops, "bf16": peak.bf16_gflops, "fp16": peak.fp16_gflops}.get(precision)
    return max(own or peak.bf16_gflops or 0.0, peak.fp32_gflops or 0.0) * 1e9


@contextlib.contextmanager
def threads(n: int | None) -> Iterator[None]:
    """Temporarily set torch's intra-op thread count (benchmarks)."""
    old = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def available_devices() -> list[dict[str, Any]]:
    """Every device type torch can use here, with names and per-precision support."""
    out = []
    for kind in DEVICE_TYPES:
        for i in range(device_count(kind)):
            dev = torch.device(kind) if kind in ("cpu", "mps") else torch.device(kind, i)
            out.append(
                {
                    "device": str(dev),
                    "name": device_name(dev),
                    "bf16": supports(dev, "bf16"),
                    "fp16": supports(dev, "fp16"),
                    "memory_gb": _memory_gb(dev),
                }
            )
    return out


def _memory_gb(device: torch.device) -> float | None:
    if device.type in ("cuda", "xpu"):
        return round(getattr(torch, device.type).get_device_properties(device).total_memory / 2**30, 1)
    if device.type == "cpu":
        import psutil

        total = psutil.virtual_memory().total
        limit = _cgroup_memory_limit()
        return round(min(total, limit or total) / 2**30, 1)
    return None


def _cgroup_memory_limit() -> int | None:
    """The memory limit of this process's container (cgroup v2, then v1) in bytes, or None: /proc/meminfo, which
    psutil reads, gives the host's memory inside a container, and a 16 GiB container on a 512 GiB host is
    killed long before the host's memory runs out."""
    for name in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        with contextlib.suppress(OSError):
            text = Path(name).read_text().strip()
            if text.isdigit():  # "max" (v2) is no limit; v1 says a huge number instead, which min() ignores
                return int(text)
    return None
