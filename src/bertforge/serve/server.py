"""NVIDIA Triton Inference Server (through PyTriton) serving the tasks of `tasks.TASKS`.

One Triton server, one model per task (`qa`, `classify`, `fill_mask`). Triton itself refuses requests with
unknown input names, wrong datatypes or shapes and batches over `max_batch`; the served function refuses
empty or non-UTF-8 strings and oversized requests (`tasks.RequestError`), and the server keeps serving.
With dynamic batching, Triton gathers queued requests into one call (up to `max_batch` rows, waiting at most
`max_queue_delay_us`); the function encodes each request, runs the model once on all rows padded to the
longest, and splits the outputs back. PyTriton answers a call with one error for all its requests, so a
malformed request batched together with good ones fails them too (see docs/serving.md).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sysconfig
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.errors import UserError
from bertforge.serve.tasks import TASKS, Predictor, RequestError, decode_strings, stack_outputs

log = logging.getLogger(__name__)

_NP = {"BYTES": np.bytes_, "FP32": np.float32, "INT64": np.int64}


@dataclasses.dataclass
class ServeConfig:
    """How `bertforge serve` runs Triton."""

    host: str = "127.0.0.1"
    """Address the HTTP, gRPC and metrics endpoints bind to; loopback unless told otherwise."""
    http_port: int = 8000
    """HTTP/REST (KServe v2) port."""
    grpc_port: int = 8001
    """gRPC port."""
    metrics_port: int = 8002
    """Prometheus metrics port (GET /metrics)."""
    max_batch: int = 16
    """Most rows one model call takes (Triton's max_batch_size); a request with more rows is refused."""
    dynamic_batching: bool = True
    """Let Triton gather queued requests into one model call."""
    max_queue_delay_us: int = 2000
    """Longest time Triton holds a request to gather a bigger batch (dynamic batching only)."""
    instances: int = 1
    """Model instances per task (parallel calls; each uses its own threads)."""
    access_token: str | None = None
    """Token for Triton's restricted endpoints (model repository, statistics, trace, logging, shared memory);
    None generates a random one. Clients send it as the `triton-access-token` header."""
    exit_timeout_s: int = 5
    """Seconds Triton waits for in-flight requests when stopping."""
    log_verbose: int = 0
    """Triton's log verbosity (0 = quiet)."""

    def __post_init__(self) -> None:
        if self.max_batch < 1:
            raise UserError(f"max_batch must be at least 1, not {self.max_batch}")
        if self.instances < 1:
            raise UserError(f"instances must be at least 1, not {self.instances}")
        if self.max_queue_delay_us < 0:
            raise UserError("max_queue_delay_us must be >= 0")


def ensure_libpython() -> str:
    """Put this interpreter's libpython directory on LD_LIBRARY_PATH for the Triton server to inherit.

    Triton's Python backend stub links libpython3.X.so dynamically; with a pyenv/venv interpreter that
    library is not on the loader's default path and every model fails to load. PyTriton copies os.environ
    into the tritonserver process when it starts it, so setting it here (before starting) is enough.
    Returns the directory added.
    """
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    ldlib = sysconfig.get_config_var("LDLIBRARY") or ""
    if not libdir or not (Path(libdir) / ldlib).exists():
        raise UserError(
            f"this Python has no shared libpython ({Path(libdir) / ldlib} is missing), which Triton's "
            "Python backend needs; use a Python built with --enable-shared"
        )
    parts = [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
    if libdir not in parts:
        os.environ["LD_LIBRARY_PATH"] = os.pathsep.join([libdir, *parts])
    return libdir


def make_infer_fn(predictor: Predictor) -> Callable[[list[Any]], list[dict[str, np.ndarray]]]:
    """The function Triton calls with a list of requests (each a dict of input name -> array with batch dim)."""
    spec = TASKS[predictor.task]

    def infer(requests: list[Any]) -> list[dict[str, np.ndarray]]:
        encoded: list[list[Any]] = []
        for req in requests:
            inputs = {}
            for io in spec.inputs:
                if io.name in req.keys():  # noqa: SIM118 -- pytriton's Request has keys() but no __contains__
                    inputs[io.name] = decode_strings(io.name, req[io.name], allow_empty=io.optional)
                elif not io.optional:
                    raise RequestError(f"input {io.name!r} is missing")
            if "text_pair" in inputs and not any(s.strip() for s in inputs["text_pair"]):
                del inputs["text_pair"]
            encoded.append(predictor.encode(inputs))
        rows = [r for rs in encoded for r in rs]
        outs = predictor.predict(rows)
        responses, i = [], 0
        for rs in encoded:
            responses.append(stack_outputs(predictor.task, outs[i : i + len(rs)]))
            i += len(rs)
        return responses

    return infer


def model_config(cfg: ServeConfig):
    from pytriton.model_config import DynamicBatcher, ModelConfig

    batcher = DynamicBatcher(max_queue_delay_microseconds=cfg.max_queue_delay_us) if cfg.dynamic_batching else None
    return ModelConfig(batching=True, max_batch_size=cfg.max_batch, batcher=batcher)


def tensors(specs) -> list:
    from pytriton.model_config import Tensor

    return [Tensor(name=s.name, dtype=_NP[s.dtype], shape=s.shape, optional=s.optional) for s in specs]


def start(models: Sequence[tuple[str, Predictor | Callable[[], Predictor]]], cfg: ServeConfig):
    """Start Triton serving `(task, predictor)` pairs; returns the running `pytriton.triton.Triton`.

    The caller stops it with `.stop()` or blocks in `.serve()`.
    """
    ensure_libpython()
    from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

    tc = TritonConfig(
        http_address=cfg.host,
        http_port=cfg.http_port,
        grpc_address=cfg.host,
        grpc_port=cfg.grpc_port,
        metrics_address=cfg.host,
        metrics_port=cfg.metrics_port,
        exit_timeout_secs=cfg.exit_timeout_s,
        log_verbose=cfg.log_verbose,
    )
    triton = Triton(config=tc, security_config=TritonSecurityConfig(access_token=cfg.access_token))
    try:
        for task, predictor in models:
            if callable(predictor) and not isinstance(predictor, Predictor):
                predictor = predictor()
            spec = TASKS[task]
            fns = [make_infer_fn(predictor) for _ in range(cfg.instances)]
            triton.bind(
                model_name=spec.model_name,
                infer_func=fns,
                inputs=tensors(spec.inputs),
                outputs=tensors(spec.outputs),
                config=model_config(cfg),
                strict=True,
            )
        triton.run()
    except Exception:
        triton.stop()
        raise
    return triton


def access_token(triton) -> str:
    """The access token a started server uses (generated when ServeConfig.access_token is None)."""
    return triton._security_config.access_token  # noqa: SLF001 - PyTriton keeps it there
