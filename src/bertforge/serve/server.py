"""NVIDIA Triton Inference Server (through PyTriton) serving the tasks of `tasks.TASKS`.

One Triton server, one model per task (`qa`, `classify`, `fill_mask`, `embed`). Triton itself refuses requests with
unknown input names, wrong datatypes or shapes and batches over `max_batch`; the served function refuses
empty or non-UTF-8 strings and oversized requests (`tasks.RequestError`), and the server keeps serving.
With dynamic batching, Triton gathers queued requests into one call (up to `max_batch` rows, waiting at most
`max_queue_delay_us`); the function encodes each request, runs the model once on all rows padded to the
longest, and splits the outputs back. Each request is validated before it joins the call, and answered with
its own error (`patch_proxy`: PyTriton itself has only one error per call), so a bad request never fails the
requests batched with it (see docs/serving.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import ipaddress
import logging
import os
import socket
import sysconfig
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bertforge.errors import UserError
from bertforge.serve.tasks import TASKS, Predictor, RequestError, check_bounds, decode_strings

if TYPE_CHECKING:
    import psutil

    from bertforge.serve.guard import GrpcGuard, HttpGuard

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
    http_guard: bool = True
    """Put `serve.guard` in front of Triton's HTTP server (body size and content checks; 4xx, never a crash or a 500
    for a client's mistake). Off: Triton's HTTP server faces the clients itself (~1.4 ms less per request on a
    2-core CPU; for trusted clients only: a large form-encoded body crashes Triton 2.51)."""
    max_body_bytes: int = 1 << 20
    """Largest HTTP request body, after any gzip/deflate (`serve.guard`: 413 above it, before Triton reads it)."""
    grpc_guard: bool = True
    """Put `serve.guard.GrpcGuard` in front of Triton's gRPC server: it refuses (INVALID_ARGUMENT) the classification
    extension on a string output, which crashes Triton 2.51 (every model of the server). Off: Triton's gRPC server
    faces the clients itself (~1.2 ms less per gRPC request on a 2-core CPU), for trusted clients only."""
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
        check_bounds(self, SERVE_BOUNDS)


SERVE_BOUNDS: dict[str, tuple[str, int, int | None]] = {
    "http_port": ("--http-port", 1, 65535),
    "grpc_port": ("--grpc-port", 1, 65535),
    "metrics_port": ("--metrics-port", 1, 65535),
    "max_batch": ("--max-batch", 1, None),
    "instances": ("--instances", 1, None),
    "max_queue_delay_us": ("--max-queue-delay-us", 0, None),
    "max_body_bytes": ("--max-body-bytes", 1024, None),
}
"""`tasks.check_bounds` of ServeConfig's fields: (flag, lowest, highest)."""


def check_ports(cfg: ServeConfig) -> None:
    """Listen on each of the server's ports on `cfg.host` for a moment, before any model loads: a port that is
    taken (or not ours to take) is one line naming its flag, instead of Triton's timeout traceback (gRPC,
    metrics) or the guard's OSError (HTTP) after the models have loaded. Triton binds them again later; a port
    taken in between still fails there."""
    ports = {SERVE_BOUNDS[f][0]: getattr(cfg, f) for f in ("http_port", "grpc_port", "metrics_port")}
    seen: dict[int, str] = {}
    for flag, port in ports.items():
        if port in seen:
            raise UserError(f"{flag} {port} is also {seen[port]}; give each its own port")
        seen[port] = flag
        try:
            with listening(cfg.host, port):
                pass
        except socket.gaierror as e:
            raise UserError(f"--host {cfg.host} is not an address this machine can listen on ({e.strerror})") from None
        except OSError as e:
            if e.errno == errno.EADDRNOTAVAIL:  # the address is not this machine's: no port would do
                raise UserError(
                    f"--host {cfg.host} is not an address of this machine ({e.strerror}); give one of its own "
                    "addresses, 127.0.0.1 (this machine only) or 0.0.0.0 (every interface)"
                ) from None
            raise UserError(
                f"{flag} {port}: cannot listen on {cfg.host}:{port} ({e.strerror or e}); stop what uses it or "
                f"choose another {flag}"
            ) from None


def is_loopback(host: str) -> bool:
    """Whether every address `host` names is this machine's loopback (127.0.0.0/8, ::1): only local clients."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in infos)


def exposure_warning(cfg: ServeConfig) -> str | None:
    """One line for stderr when the server binds more than loopback: inference needs no token (Triton's access
    token guards the restricted endpoints only), so anyone who can reach the host can use the models."""
    if is_loopback(cfg.host):
        return None
    unguarded = "" if cfg.http_guard else "; --no-http-guard: a large form-encoded body crashes Triton 2.51"
    if not cfg.grpc_guard:
        unguarded += "; --no-grpc-guard: a gRPC request for the classification of a string output crashes Triton 2.51"
    return (
        f"warning: --host {cfg.host} serves other machines: anyone who can reach it may run inference (the access "
        f"token guards only the restricted endpoints){unguarded}; firewall the ports or bind 127.0.0.1"
    )


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


ERROR_OUTPUT = "bertforge_error"
"""Output name that carries one request's error from the served function to the proxy patch below."""

# Appended to PyTriton's proxy model.py (it runs inside Triton's Python-backend stub): PyTriton 0.7 answers a
# model call with one result for all its requests and has no per-request error, so a response that carries
# ERROR_OUTPUT becomes that request's own error, INVALID_ARG (HTTP 400) or INTERNAL (500); the others of the
# batch keep their outputs.
_PROXY_PATCH = f"""

# --- bertforge: per-request errors (bertforge/serve/server.py) ---
_bertforge_wrap_response = _wrap_response


def _wrap_response(response, requested_outputs_names, model_outputs_dict):
    if response.data is not None and "{ERROR_OUTPUT}" in response.data:
        code, _, msg = bytes(response.data["{ERROR_OUTPUT}"].reshape(-1)[0]).decode("utf-8", "replace").partition(" ")
        code = getattr(pb_utils.TritonError, code, pb_utils.TritonError.INTERNAL)
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(msg, code))
    return _bertforge_wrap_response(response, requested_outputs_names, model_outputs_dict)
"""


def patch_proxy() -> None:
    """Make PyTriton's generated Triton models answer ERROR_OUTPUT responses as per-request errors (idempotent)."""
    from pytriton.models.model import Model

    if getattr(Model, "_bertforge_patched", False):
        return
    generate, files = Model.generate_model, Model.get_proxy_model_files

    def generate_model(self, model_repository: Path) -> None:
        generate(self, model_repository)
        script = Path(model_repository) / self.model_name / str(self.model_version) / "model.py"
        with open(script, "a", encoding="utf-8") as f:
            f.write(_PROXY_PATCH)

    def get_proxy_model_files(self) -> dict[str, bytes]:
        out = files(self)
        key = f"file:{self.model_version}/model.py"
        out[key] = out[key] + _PROXY_PATCH.encode()
        return out

    Model.generate_model, Model.get_proxy_model_files = generate_model, get_proxy_model_files
    Model._bertforge_patched = True


def error_response(message: str, client: bool = True) -> dict[str, np.ndarray]:
    """One request's error: one line, a client mistake (4xx) or the server's own failure (500)."""
    line = " ".join(message.split()) or "error"
    return {ERROR_OUTPUT: np.array([f"{'INVALID_ARG' if client else 'INTERNAL'} {line}".encode()], dtype=object)}


def encode_request(predictor: Predictor, req: Any) -> list[Any]:
    """Decode and validate one request (raises RequestError); its rows, ready for `predictor.predict`."""
    inputs = {}
    for io in TASKS[predictor.task].inputs:
        if io.name in req.keys():  # noqa: SIM118 -- pytriton's Request has keys() but no __contains__
            inputs[io.name] = decode_strings(io.name, req[io.name], allow_empty=io.optional)
        elif not io.optional:
            raise RequestError(f"input {io.name!r} is missing")
    if "text_pair" in inputs and not any(s.strip() for s in inputs["text_pair"]):
        del inputs["text_pair"]
    return predictor.encode(inputs)


def _failure(e: Exception) -> dict[str, np.ndarray]:
    if isinstance(e, RequestError):
        return error_response(str(e))
    log.exception("request failed")  # the traceback stays in the server's log, the client gets one line
    return error_response(f"internal error ({type(e).__name__}: {e})", client=False)


class InFlight:
    """How many served-function calls are running (in PyTriton's threads). The process must not exit while one is in
    the model: a Triton that dies (or stops after its exit timeout) mid-request left `serve` to exit with the model
    still computing in a thread, and the interpreter's shutdown aborted it ("terminate called without an active
    exception", SIGABRT instead of exit status 1)."""

    def __init__(self) -> None:
        self._n = 0
        self._cv = threading.Condition()

    @contextlib.contextmanager
    def call(self) -> Iterator[None]:
        with self._cv:
            self._n += 1
        try:
            yield
        finally:
            with self._cv:
                self._n -= 1
                self._cv.notify_all()

    def wait_idle(self, timeout_s: float) -> bool:
        """Whether every call has ended within `timeout_s`."""
        with self._cv:
            return self._cv.wait_for(lambda: self._n == 0, timeout_s)


IN_FLIGHT = InFlight()
STOP_WAIT_S = 60.0
"""Longest `Server.stop` waits for model calls still running (a 64 KB QA context takes seconds on a CPU)."""


def make_infer_fn(predictor: Predictor) -> Callable[[list[Any]], list[dict[str, np.ndarray]]]:
    """The function Triton calls with a list of requests (each a dict of input name -> array with batch dim).

    Each request is validated on its own before its rows join the model call, so a bad request gets its own
    error and never fails the others. If the batched model call fails anyway, every request is re-run on its
    own and only the one that still fails gets an error.
    """

    def infer(requests: list[Any]) -> list[dict[str, np.ndarray]]:
        with IN_FLIGHT.call():
            return answer(requests)

    def answer(requests: list[Any]) -> list[dict[str, np.ndarray]]:
        responses: list[dict[str, np.ndarray] | None] = [None] * len(requests)
        encoded: dict[int, list[Any]] = {}
        for n, req in enumerate(requests):
            try:
                encoded[n] = encode_request(predictor, req)
            except Exception as e:
                responses[n] = _failure(e)
        try:
            outs = predictor.predict([r for rs in encoded.values() for r in rs]) if encoded else []
        except Exception:
            log.warning("batched call of %d requests failed; re-running them one by one", len(encoded))
            outs = None
        i = 0
        for n, rows in encoded.items():
            if outs is not None:
                responses[n] = predictor.stack(outs[i : i + len(rows)])
                i += len(rows)
                continue
            try:
                responses[n] = predictor.stack(predictor.predict(rows))
            except Exception as e:
                responses[n] = _failure(e)
        return [r for r in responses if r is not None]

    return infer


def model_config(cfg: ServeConfig):
    from pytriton.model_config import DynamicBatcher, ModelConfig

    batcher = DynamicBatcher(max_queue_delay_microseconds=cfg.max_queue_delay_us) if cfg.dynamic_batching else None
    return ModelConfig(batching=True, max_batch_size=cfg.max_batch, batcher=batcher)


def tensors(specs) -> list:
    from pytriton.model_config import Tensor

    return [Tensor(name=s.name, dtype=_NP[s.dtype], shape=s.shape, optional=s.optional) for s in specs]


def free_ports(n: int, avoid: Collection[int] = ()) -> list[int]:
    """`n` different TCP ports free on loopback now (the OS picks them), none of `avoid`: ports chosen but not
    yet bound, which the OS may hand out again because nothing holds them."""
    ports: list[int] = []
    while len(ports) < n:
        with listening("127.0.0.1", 0) as s:
            port = s.getsockname()[1]
        if port not in avoid and port not in ports:
            ports.append(port)
    return ports


@contextlib.contextmanager
def listening(host: str, port: int) -> Iterator[socket.socket]:
    """A TCP socket listening on (host, port) — port 0: one the OS picks — closed on leaving."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[
        0
    ]
    with socket.socket(family, kind, proto) as s:
        # as Triton and aiohttp bind: a port whose last connection is in TIME_WAIT is free to them
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(address)
        s.listen()
        yield s


@dataclasses.dataclass
class Server:
    """A running `bertforge serve`: Triton (HTTP and gRPC on private loopback ports) and the guards in front of it."""

    triton: Any
    """The running `pytriton.triton.Triton`."""
    guard: HttpGuard | None
    grpc_guard: GrpcGuard | None = None
    children: dict[int, psutil.Process] = dataclasses.field(default_factory=dict)
    """tritonserver and its descendants (the Python-backend stubs) as last seen: `stop` ends those still running."""
    others: frozenset[int] = frozenset()
    """The pids of tritonservers this process ran before this one started (another server's, not to be ended)."""

    def __post_init__(self) -> None:
        self.watch()

    def watch(self) -> None:
        """Note tritonserver's process tree while it lives: a stub outlives a Triton that crashed in the middle of a
        response (it waits for Triton's answer for ever), then reparented away from us, where nothing finds it."""
        for pid, p in triton_processes(self.others).items():
            self.children.setdefault(pid, p)

    def serve(self, period_s: float = 1.0) -> None:
        """Block until interrupted (Ctrl-C, or SIGTERM turned into KeyboardInterrupt by the caller: it propagates)
        or until Triton is no longer alive (returns: the caller says so). Not PyTriton's `serve()`: that catches
        the interrupt and stops Triton while the guard still holds a connection to it, so Triton waited out its
        exit timeout and reported a failed stop."""
        while self.triton.is_alive():
            self.watch()
            time.sleep(period_s)

    def stop(self) -> None:
        """The guards first (their connections to Triton closed), then Triton, then what Triton left running."""
        try:
            for guard in (self.guard, self.grpc_guard):
                if guard is not None:
                    guard.stop()
            self.triton.stop()
        finally:
            end_processes(list(self.children.values()))
            if not IN_FLIGHT.wait_idle(STOP_WAIT_S):
                log.warning("model calls still running after %.0f s; exiting with them", STOP_WAIT_S)


def triton_processes(skip: Collection[int] = ()) -> dict[int, psutil.Process]:
    """This process's tritonserver children (but those whose pid is in `skip`) and their descendants, by pid."""
    import psutil

    found: dict[int, psutil.Process] = {}
    for p in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            if p.name() == "tritonserver" and p.pid not in skip:
                found.update((q.pid, q) for q in [p, *p.children(recursive=True)])
    return found


def end_processes(procs: Sequence[psutil.Process], timeout_s: float = 5.0) -> None:
    """SIGTERM each process still running (psutil checks that the pid is still the one it saw), SIGKILL those left
    after `timeout_s`, and remove the shared memory a Python-backend stub named on its command line, which its
    Triton would have removed. A stub's multiprocessing resource tracker goes last, given the time to exit on its
    own: it removes the shared memory its stub leaves (ended first, it left it in /dev/shm)."""
    import psutil

    regions: list[str] = []
    running: list[psutil.Process] = []
    trackers: list[psutil.Process] = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                cmd = p.cmdline()
                regions += [a for a in cmd if a.startswith("pytrtion")]  # PyTriton's region names
                (trackers if any("resource_tracker" in a for a in cmd) else running).append(p)
    for p in running:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    for group in (running, trackers):  # the trackers are not signalled: they exit once their stub has
        _, left = psutil.wait_procs(group, timeout=timeout_s)
        for p in left:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(left, timeout=timeout_s)
    shm = Path("/dev/shm")
    for name in regions:
        for f in shm.glob(f"{name}*") if shm.is_dir() and "/" not in name else ():
            with contextlib.suppress(OSError):
                f.unlink()


def start(models: Sequence[tuple[str, Predictor | Callable[[], Predictor]]], cfg: ServeConfig) -> Server:
    """Start Triton serving `(task, predictor)` pairs, and the HTTP and gRPC guards on `cfg.host` in front of its
    HTTP and gRPC servers (which then bind private ports on 127.0.0.1; without a guard, Triton binds the public
    address itself); metrics are Triton's own. The caller stops it with `.stop()` or blocks in `.serve()`.
    """
    ensure_libpython()
    patch_proxy()
    from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

    from bertforge.serve.guard import GrpcGuard, HttpGuard  # aiohttp: the serve extra, like pytriton

    # the guard's upstream: not one of the ports chosen for this server, which a caller may have only picked so far
    ours = {cfg.http_port, cfg.grpc_port, cfg.metrics_port}
    private = iter(free_ports(2, avoid=ours))
    tc = TritonConfig(
        http_address="127.0.0.1" if cfg.http_guard else cfg.host,
        http_port=next(private) if cfg.http_guard else cfg.http_port,
        grpc_address="127.0.0.1" if cfg.grpc_guard else cfg.host,
        grpc_port=next(private) if cfg.grpc_guard else cfg.grpc_port,
        metrics_address=cfg.host,
        metrics_port=cfg.metrics_port,
        exit_timeout_secs=cfg.exit_timeout_s,
        log_verbose=cfg.log_verbose,
    )
    triton = Triton(config=tc, security_config=TritonSecurityConfig(access_token=cfg.access_token))
    # what Triton leaves at its stop is ended (`Server.stop`): not the tritonservers this process already ran
    running = Server(triton, None, others=frozenset(triton_processes()))
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
                outputs=tensors(predictor.outputs),  # a regression model's differ from its task's
                config=model_config(cfg),
                strict=False,  # an error response carries ERROR_OUTPUT, which no model declares
            )
        triton.run()
        running.watch()  # the stubs, now that the models are loaded
        if cfg.http_guard:
            running.guard = HttpGuard(cfg.host, cfg.http_port, tc.http_port, cfg.max_body_bytes)
        if cfg.grpc_guard:
            running.grpc_guard = GrpcGuard(cfg.host, cfg.grpc_port, tc.grpc_port)
        return running
    except BaseException:  # Ctrl-C or SIGTERM (`sigterm_interrupts`) while starting too: no tritonserver left behind
        running.stop()
        raise


def access_token(server: Server) -> str:
    """The access token a started server uses (generated when ServeConfig.access_token is None)."""
    return server.triton._security_config.access_token  # noqa: SLF001 - PyTriton keeps it there
