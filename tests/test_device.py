import dataclasses
import json
import os
import re
from pathlib import Path

import pytest
import torch

from bertforge import device as dev
from bertforge.errors import UserError


def test_auto_resolves_to_an_available_device():
    d = dev.resolve_device("auto")
    assert dev.is_available(d.type)


def test_cpu_and_errors():
    assert dev.resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(UserError, match="unknown device"):
        dev.resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match="no cuda device"):
            dev.resolve_device("cuda:0")


def test_precision_resolution():
    cpu = torch.device("cpu")
    assert dev.resolve_precision("fp32", cpu) == "fp32"
    assert dev.resolve_precision("auto", cpu) in ("fp32", "bf16")
    assert dev.resolve_precision("auto", cpu) == ("bf16" if dev.cpu_has_native_bf16() else "fp32")
    with pytest.raises(UserError):
        dev.resolve_precision("fp8", cpu)


def test_autocast_and_scaler():
    cpu = torch.device("cpu")
    with dev.autocast(cpu, "bf16"):
        y = torch.nn.functional.linear(torch.randn(2, 4), torch.randn(3, 4))
    assert y.dtype == torch.bfloat16
    with dev.autocast(cpu, "fp32"):
        y = torch.nn.functional.linear(torch.randn(2, 4), torch.randn(3, 4))
    assert y.dtype == torch.float32
    assert not dev.grad_scaler(cpu, "bf16").is_enabled()
    assert dev.dist_backend(cpu) == "gloo"


def test_rng_state_round_trip():
    cpu = torch.device("cpu")
    state = dev.rng_state(cpu)
    a = torch.rand(3)
    dev.set_rng_state(cpu, state)
    assert torch.equal(a, torch.rand(3))


def test_matmul_peak_is_cached():
    cpu = torch.device("cpu")
    p1 = dev.matmul_peak(cpu, seconds=0.1)
    p2 = dev.matmul_peak(cpu)
    assert p1 == p2 and p1.fp32_gflops > 1
    assert dev.peak_flops(cpu, "fp32") == pytest.approx(p1.fp32_gflops * 1e9)


@pytest.mark.parametrize(
    "text",
    [
        "[]",
        '{"KEY": {"fp32_gflops": 1.0, "extra_field": 2}}',
        '{"KEY": 3}',
        '{"KEY": {"fp32_gflops": "100.0", "bf16_gflops": null, "fp16_gflops": null, "size": 1, "device": "cpu", '
        '"threads": 1}}',
    ],
)
def test_a_peak_cache_of_another_shape_is_measured_again(tmp_path, monkeypatch, text):
    """Another bertforge version's entry (a field more), or a file of another shape: a TypeError at every MFU."""
    cpu = torch.device("cpu")
    monkeypatch.setenv("BERTFORGE_CACHE", str(tmp_path))
    monkeypatch.setattr(dev, "_measure", lambda device, dtype, max_n, seconds: (100.0, 256))
    first = dev.matmul_peak(cpu)
    key = next(iter(json.loads((tmp_path / "matmul_peak.json").read_text())))
    (tmp_path / "matmul_peak.json").write_text(text.replace("KEY", key))
    assert dev.matmul_peak(cpu) == first


def test_mfu_peak_of_an_emulated_precision_is_at_least_fp32s(monkeypatch):
    """On a CPU without native bf16 the bf16 matmul peak is ~1 GFLOP/s: dividing by it gave MFU of 146-222%."""
    cpu = torch.device("cpu")
    peak = dev.Peak(fp32_gflops=160.0, bf16_gflops=1.4, fp16_gflops=None, size=2048, device="cpu", threads=2)
    monkeypatch.setattr(dev, "matmul_peak", lambda device: peak)
    assert dev.peak_flops(cpu, "bf16") == dev.peak_flops(cpu, "fp16") == pytest.approx(160e9)
    fast = dataclasses.replace(peak, bf16_gflops=400.0)  # native bf16: its own peak
    monkeypatch.setattr(dev, "matmul_peak", lambda device: fast)
    assert dev.peak_flops(cpu, "bf16") == dev.peak_flops(cpu, "fp16") == pytest.approx(400e9)
    assert dev.peak_flops(cpu, "fp32") == pytest.approx(160e9)


def test_an_unavailable_train_device_names_the_config_key():
    from bertforge.runtime import distributed

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    message = "train.device=cuda: no cuda device is available on this machine; try train.device=auto"
    with pytest.raises(UserError, match=re.escape(message)):
        distributed.init_distributed("cuda")


@pytest.mark.skipif(dev._malloc_trim() is None, reason="needs glibc's malloc_trim")
def test_release_host_memory_returns_freed_heap_pages_to_the_os():
    def rss() -> int:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    dev.release_host_memory()
    # 100 KB tensors stay under glibc's initial 128 KB mmap threshold, so they come from the heap; the last one
    # kept alive pins the heap's top, so the 200 MB freed below it stays resident until malloc_trim
    blocks = [torch.ones(25_000) for _ in range(2_000)]
    last = blocks[-1]
    del blocks
    before = rss()
    assert dev.release_host_memory()
    assert before - rss() > 100e6
    assert last.sum() == 25_000


def test_compile_on_cuda_needs_triton_and_a_gpu_it_builds_for(monkeypatch):
    """auto compiles only where Triton builds kernels (one process, capability 7.0+: older GPUs fail at the
    first step); asking for it explicitly there is one line at start-up, naming the setting."""
    cuda = torch.device("cuda")
    monkeypatch.setattr(dev, "has_triton", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert dev.compiles_fast(cuda, distributed=False)
    assert not dev.compiles_fast(cuda, distributed=True) and not dev.compiles_fast(torch.device("cpu"), False)
    dev.check_compile_toolchain(cuda, ["train.compile"])
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (6, 1))  # a P100 or GTX 10xx
    assert not dev.compiles_fast(cuda, distributed=False)
    with pytest.raises(UserError, match=r"train.compile: .* capability 7.0 or newer, and this one is 6.1: set it"):
        dev.check_compile_toolchain(cuda, ["train.compile"])
    monkeypatch.setattr(dev, "has_triton", lambda: False)
    assert not dev.compiles_fast(cuda, distributed=False)
    with pytest.raises(UserError, match="needs Triton"):
        dev.check_compile_toolchain(cuda, ["optim.compile"])
