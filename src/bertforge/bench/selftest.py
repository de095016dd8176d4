"""Small benchmark callables that exercise the harness itself (and the matmul peak of `bertforge info`)."""

from __future__ import annotations

import os
import signal
import time

import torch


def matmul(n: int = 512, dtype: str = "fp32", iters: int = 5) -> dict[str, float]:
    """GFLOP/s of `iters` n x n matmuls."""
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    a, b = torch.randn(n, n).to(dt), torch.randn(n, n).to(dt)
    t0 = time.perf_counter()
    for _ in range(iters):
        torch.matmul(a, b)
    return {"gflops": 2 * n**3 * iters / (time.perf_counter() - t0) / 1e9}


def sleep(seconds: float = 0.01) -> dict[str, float]:
    """Sleeps; the wall-clock start and end (epoch seconds) show which calls overlapped."""
    start = time.time()
    time.sleep(seconds)
    return {"slept_s": seconds, "started_at": start, "ended_at": time.time()}


def die() -> dict[str, float]:
    """Kills its own process with SIGKILL, as the out-of-memory killer would: a concurrent spec must report it
    and go on."""
    os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError("survived SIGKILL")  # a self-sent SIGKILL ends the process before kill() returns
