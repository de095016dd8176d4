"""Device and precision selection on hardware this machine is not (pre-Ampere GPUs, Arm, containers, a torch
without oneDNN), and the matmul peak's measurement and cache under load: all through monkeypatching, no timings."""

import json
import pathlib
import types

import numpy as np
import pytest
import torch

from bertforge import device as dev

X86_BF16 = "processor\t: 0\nmodel name\t: AMD EPYC 9R14\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 avx512_vnni\n"
X86_NO_BF16 = "processor\t: 0\nmodel name\t: Intel Xeon E5-2686\nflags\t\t: fpu sse avx2 fma\n"
ARM = (
    "processor\t: 0\nBogoMIPS\t: 2100.00\nFeatures\t: fp asimd evtstrm {features}\nCPU implementer\t: 0x41\n"
    "CPU architecture: 8\nCPU variant\t: 0x1\nCPU part\t: {part}\nCPU revision\t: 1\n"
)


@pytest.fixture
def files(monkeypatch):
    """files[path] = text: what Path(path).read_text() returns (OSError for a path set to None); others as is."""
    fake: dict[str, str | None] = {}
    real = pathlib.Path.read_text

    def read_text(self, *args, **kwargs):
        if str(self) in fake:
            if fake[str(self)] is None:
                raise FileNotFoundError(str(self))
            return fake[str(self)]
        return real(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "read_text", read_text)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    return fake


@pytest.mark.parametrize(
    ("capability", "auto"), [((7, 0), "fp16"), ((7, 5), "fp16"), ((8, 0), "bf16"), ((9, 0), "bf16")]
)
def test_auto_precision_on_a_gpu_before_ampere_is_fp16(monkeypatch, capability, auto):
    """torch.cuda.is_bf16_supported() says True on a V100 or T4 (bf16 there is emulated, no tensor cores): auto
    trained in slow bf16 there instead of fp16 with loss scaling, as the docs promise."""
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    cuda = torch.device("cuda", 0)
    assert dev.supports(cuda, "bf16") == (auto == "bf16")
    assert dev.resolve_precision("auto", cuda) == auto


def test_bf16_support_is_asked_of_the_device_itself(monkeypatch):
    """A machine with an A100 as cuda:0 and a T4 as cuda:1: is_bf16_supported() asks the current device only."""
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    caps = {0: (8, 0), 1: (7, 5)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: caps[torch.device(device).index])
    assert dev.resolve_precision("auto", torch.device("cuda", 0)) == "bf16"
    assert dev.resolve_precision("auto", torch.device("cuda", 1)) == "fp16"


@pytest.mark.parametrize(
    ("cpuinfo", "native"),
    [
        (X86_BF16, True),
        (X86_NO_BF16, False),
        (ARM.format(features="bf16 i8mm", part="0xd40"), True),  # Graviton 3
        (ARM.format(features="asimddp", part="0xd0c"), False),  # Graviton 2
        ("", False),  # no /proc/cpuinfo text
        (None, False),  # no /proc/cpuinfo (macOS, Windows)
    ],
)
def test_native_bf16_is_read_from_the_cpu_flags(files, cpuinfo, native):
    files["/proc/cpuinfo"] = cpuinfo
    assert dev.cpu_has_native_bf16() == native
    assert dev.resolve_precision("auto", torch.device("cpu")) == ("bf16" if native else "fp32")


def test_a_torch_without_onednn_emulates_bf16_whatever_the_cpu_has(files, monkeypatch):
    """Its bf16 matmuls run in torch's reference kernels, ~100x slower than fp32: auto must not pick bf16."""
    files["/proc/cpuinfo"] = X86_BF16
    assert dev.cpu_has_native_bf16()
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    assert not dev.cpu_has_native_bf16()
    assert dev.resolve_precision("auto", torch.device("cpu")) == "fp32"


def test_cpu_model_on_arm_and_odd_cpuinfo(files, monkeypatch):
    """Arm Linux has no "model name": every Arm machine was called "aarch64", and so shared one matmul peak in a
    cache on a shared home directory (a Graviton 2's peak divided a Graviton 3's MFU)."""
    monkeypatch.setattr(dev.platform, "processor", lambda: "")
    monkeypatch.setattr(dev.platform, "machine", lambda: "aarch64")
    files["/proc/cpuinfo"] = X86_BF16
    assert dev.cpu_model() == "AMD EPYC 9R14"
    files["/proc/cpuinfo"] = ARM.format(features="bf16", part="0xd40")
    graviton3 = dev.cpu_model()
    files["/proc/cpuinfo"] = ARM.format(features="", part="0xd0c")
    graviton2 = dev.cpu_model()
    assert graviton3 != graviton2 and graviton3.startswith("aarch64") and "0xd40" in graviton3
    files["/proc/cpuinfo"] = "processor\t: 0\nmodel name\t:\nflags\t\t: fpu\n"  # an empty name: not ""
    assert dev.cpu_model() == "aarch64"
    files["/proc/cpuinfo"] = None
    assert dev.cpu_model() == "aarch64"
    (cpu,) = (d for d in dev.available_devices() if d["device"] == "cpu")
    assert cpu["name"] == "aarch64" and cpu["bf16"] is False and cpu["fp16"] is False


@pytest.mark.parametrize(
    ("v2", "v1", "gib"),
    [
        ("17179869184\n", None, 16.0),
        ("max\n", None, 512.0),
        (None, "9223372036854771712\n", 512.0),
        (None, None, 512.0),
    ],
)
def test_cpu_memory_is_the_containers_limit(files, monkeypatch, v2, v1, gib):
    """Inside a container /proc/meminfo gives the host's memory: `bertforge info` said 512 GiB in a 16 GiB one."""
    import psutil

    monkeypatch.setattr(psutil, "virtual_memory", lambda: types.SimpleNamespace(total=512 * 2**30))
    files["/sys/fs/cgroup/memory.max"] = v2
    files["/sys/fs/cgroup/memory/memory.limit_in_bytes"] = v1
    (cpu,) = (d for d in dev.available_devices() if d["device"] == "cpu")
    assert cpu["memory_gb"] == gib


# ------------------------------------------------------------------------------------- the matmul peak
@pytest.fixture
def measured(tmp_path, monkeypatch):
    """A fake measurement (100 GFLOP/s fp32, 200 bf16) on 2 threads of 2 cores, counted; the cache in tmp_path."""
    monkeypatch.setenv("BERTFORGE_CACHE", str(tmp_path))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(dev.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    calls = []

    def measure(device, dtype, max_n, seconds):
        calls.append(dtype)
        return (200.0 if dtype == torch.bfloat16 else 100.0), 2048

    monkeypatch.setattr(dev, "_measure", measure)
    return calls


def snapshots(monkeypatch, *values):
    """`_cpu_snapshot` returns these (wall, busy CPU seconds on our cores, our CPU seconds) in turn."""
    it = iter(values)
    monkeypatch.setattr(dev, "_cpu_snapshot", lambda: next(it), raising=False)


def test_a_peak_measured_under_load_is_not_cached(measured, tmp_path, monkeypatch, capsys):
    """Measured while another job kept the cores busy, a CPU's peak read 2 GFLOP/s instead of ~170 and was cached:
    every later run's MFU read ~85x high. Now it serves this process only, and the next one measures again."""
    snapshots(monkeypatch, (0.0, 0.0, 0.0), (3.0, 6.0, 3.0))  # 3 s: others kept 1 of the 2 cores busy
    loaded = dev.matmul_peak(torch.device("cpu"))
    assert loaded.fp32_gflops == 100.0 and len(measured) == 2
    assert "other processes took 50% of the 2 cores" in capsys.readouterr().err
    assert not (tmp_path / "matmul_peak.json").exists()
    assert dev.matmul_peak(torch.device("cpu")) == loaded and len(measured) == 2  # every logged MFU: no re-measure
    assert dev.peak_flops(torch.device("cpu"), "fp32") == pytest.approx(100e9)

    snapshots(monkeypatch, (0.0, 10.0, 0.0), (3.0, 16.1, 5.9))  # idle: 0.2 core-s of others in 3 s
    idle = dev.matmul_peak(torch.device("cpu"), refresh=True)
    assert len(measured) == 4 and capsys.readouterr().err == ""
    (entry,) = json.loads((tmp_path / "matmul_peak.json").read_text()).values()
    assert entry["fp32_gflops"] == 100.0
    assert dev.matmul_peak(torch.device("cpu")) == idle and len(measured) == 4

    # an explicit --refresh caches whatever the load (a host that is never idle must be able to keep a peak), and
    # says so
    snapshots(monkeypatch, (0.0, 0.0, 0.0), (3.0, 6.0, 3.0))
    dev.matmul_peak(torch.device("cpu"), refresh=True)
    assert "cached as --refresh asks" in capsys.readouterr().err
    assert len(json.loads((tmp_path / "matmul_peak.json").read_text())) == 1 and len(measured) == 6


def test_load_on_cores_the_measurement_left_free_is_no_contention(measured, tmp_path, monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    snapshots(monkeypatch, (0.0, 0.0, 0.0), (2.0, 3.8, 1.9))  # another process on the other core: 0.95 cores
    dev.matmul_peak(torch.device("cpu"))
    assert (tmp_path / "matmul_peak.json").exists()
    assert dev._contended_share((0.0, 0.0, 0.0), (0.1, 0.2, 0.0), 2) == 0.0  # too short for 10 ms ticks to tell


def test_a_cached_entry_says_whether_bf16_is_native_now(measured, monkeypatch):
    """An entry cached before a fix to `supports` (a T4's bf16_native: true) kept telling `bertforge info` so."""
    snapshots(monkeypatch, (0.0, 0.0, 0.0), (0.0, 0.0, 0.0))
    monkeypatch.setattr(dev, "supports", lambda device, precision: True)
    assert dev.matmul_peak(torch.device("cpu")).bf16_native
    monkeypatch.setattr(dev, "supports", lambda device, precision: False)
    assert not dev.matmul_peak(torch.device("cpu")).bf16_native and len(measured) == 2


def test_one_delayed_product_does_not_stop_the_size_at_256(monkeypatch):
    """The size grew until one timed product took 20 ms: a single preemption at 256 x 256 kept it there, where
    the matmul runs far below peak, and that low peak was cached. Simulated clock: 1 ms overhead per product
    plus 2n^3 FLOPs at 100 GFLOP/s, and the first timed product delayed by 30 ms."""
    clock = types.SimpleNamespace(t=0.0, products=0)

    def matmul(a, b):
        clock.products += 1
        clock.t += 1e-3 + 2 * a.shape[0] ** 3 / 100e9 + (0.03 if clock.products == 2 else 0.0)
        return a

    monkeypatch.setattr(dev, "time", types.SimpleNamespace(perf_counter=lambda: clock.t))
    monkeypatch.setattr(torch, "matmul", matmul)
    gflops, n = dev._measure(torch.device("cpu"), torch.float32, max_n=1024, seconds=0.5)
    assert n == 1024 and gflops == pytest.approx(2 * 1024**3 / (1e-3 + 2 * 1024**3 / 100e9) / 1e9)


def test_a_peak_cached_before_the_load_check_is_measured_again(measured, tmp_path, monkeypatch):
    """An entry cached by an earlier bertforge may be one measured under load (a peak ~85x low): not trusted."""
    snapshots(monkeypatch, (0.0, 0.0, 0.0), (0.0, 0.0, 0.0))
    cpu = torch.device("cpu")
    old_key = f"{dev.device_name(cpu)}|cpu|torch {torch.__version__}|threads 2"
    low = {"fp32_gflops": 2.0, "bf16_gflops": 1.0, "fp16_gflops": None, "size": 256, "device": "cpu", "threads": 2}
    (tmp_path / "matmul_peak.json").write_text(json.dumps({old_key: low}))
    assert dev.matmul_peak(cpu).fp32_gflops == 100.0 and len(measured) == 2


def test_an_unwritable_cache_is_no_cache_not_an_error(measured, monkeypatch):
    """write_text says an unwritable path as a UserError, which the cache's `suppress(OSError)` let through: a
    read-only ~/.cache stopped `bertforge info` and every run's set-up instead of measuring without caching."""
    from bertforge.errors import UserError

    def unwritable(path, text):
        raise UserError(f"cannot write {path} (Read-only file system)")

    monkeypatch.setattr(dev, "write_text", unwritable)
    snapshots(monkeypatch, (0.0, 0.0, 0.0), (3.0, 3.0, 3.0))  # idle: would be cached
    assert dev.matmul_peak(torch.device("cpu")).fp32_gflops == 100.0


def test_an_unwritable_cache_does_not_stop_a_packed_synthetic_source(tmp_path, monkeypatch):
    from bertforge.data import synthetic
    from bertforge.errors import UserError

    def unwritable(path, text):
        raise UserError(f"cannot write {path} (Read-only file system)")

    monkeypatch.setenv("BERTFORGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("bertforge.runtime.io.write_text", unwritable)  # imported where the cache is written
    hist = np.zeros(33, np.int64)
    hist[[10, 20, 32]] = [40, 30, 20]
    strategy = synthetic._cached_strategy(hist, 32, 3, "lpfhp")
    assert strategy.sequences == 90
