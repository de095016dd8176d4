"""`bertforge export`, `bertforge serve` and `bertforge predict`."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, BinaryIO

from bertforge.errors import UserError
from bertforge.runtime.signals import sigterm_interrupts

if TYPE_CHECKING:
    from bertforge.serve.tasks import IOSpec

SERVE_TASKS = ("qa", "classify", "fill-mask", "embed")


# ------------------------------------------------------------------------------------------------ export
def export_add(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="Hugging Face-format model directory (config.json + weights)")
    p.add_argument("--format", required=True, choices=("hf", "onnx"), help="output format")
    p.add_argument(
        "--out",
        required=True,
        help="output directory (written atomically); must be new, empty or an earlier export unless --force",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace --out even if it is a file or a directory that is not an earlier export",
    )
    p.add_argument(
        "--task",
        default=None,
        help="head to export: qa | classify | fill-mask | embed (the bare encoder, no head), or a model head name; "
        "default: config.json's architectures (BertModel/RobertaModel: the bare encoder)",
    )
    p.add_argument(
        "--init-head",
        action="store_true",
        help="allow the head to be missing from the checkpoint and start it from a fresh, seeded init "
        "(a pre-trained encoder; for smoke tests and serving benchmarks)",
    )
    p.add_argument("--num-labels", type=int, default=None, help="labels of a fresh classification head")
    p.add_argument("--seed", type=int, default=0, help="seed of a fresh head")
    p.add_argument("--opset", type=int, default=17, help="ONNX opset")
    p.add_argument("--tolerance", type=float, default=1e-4, help="ONNX: largest allowed |onnxruntime - PyTorch|")


def export_run(args: argparse.Namespace) -> int:
    from bertforge.runtime.io import remove_dead_temporaries

    # a SIGTERM-killed export used to leave a model-sized `.OUT.tmp-PID` beside --out that nothing removed:
    # SIGTERM now unwinds as Ctrl-C does (the temporary goes), and those of dead runs go first
    remove_dead_temporaries(args.out)
    with sigterm_interrupts():
        return _export(args)


def _export(args: argparse.Namespace) -> int:
    from bertforge.serve import export

    if args.format == "hf":
        out = export.export_hf(
            args.model,
            args.out,
            args.task,
            init_head=args.init_head,
            num_labels=args.num_labels,
            seed=args.seed,
            force=args.force,
        )
        print(f"wrote {out} (Hugging Face format)")
    else:
        if args.num_labels is not None:
            raise UserError("--num-labels applies to --format hf; export the HF directory first, then ONNX")
        if not args.tolerance > 0:  # NaN too: checked before the export, not after it
            raise UserError(f"--tolerance is the largest allowed difference; give a number > 0, not {args.tolerance}")
        res = export.export_onnx(
            args.model,
            args.out,
            args.task,
            opset=args.opset,
            tolerance=args.tolerance,
            init_head=args.init_head,
            seed=args.seed,
            force=args.force,
        )
        print(f"wrote {res['path']} (head {res['head']}; onnxruntime vs PyTorch max |diff| {res['max_abs_diff']:.2g})")
    return 0


# ------------------------------------------------------------------------------------------------ serve
def serve_add(p: argparse.ArgumentParser) -> None:
    from bertforge.serve.server import ServeConfig

    sc = ServeConfig()
    p.add_argument(
        "--model",
        action="append",
        required=True,
        help="model directory; repeat --model/--task pairs to serve several tasks from one server",
    )
    p.add_argument(
        "--task",
        action="append",
        required=True,
        choices=SERVE_TASKS,
        help="task of the --model at the same position (Triton model names: qa, classify, fill_mask, embed)",
    )
    p.add_argument("--host", default=sc.host, help="address to bind (loopback unless told otherwise)")
    p.add_argument("--http-port", type=int, default=sc.http_port, help="HTTP/REST (KServe v2) port")
    p.add_argument("--grpc-port", type=int, default=sc.grpc_port, help="gRPC port")
    p.add_argument("--metrics-port", type=int, default=sc.metrics_port, help="Prometheus metrics port")
    p.add_argument(
        "--max-batch",
        type=int,
        default=sc.max_batch,
        help="most rows per model call (Triton max_batch_size); requests with more rows are refused",
    )
    p.add_argument(
        "--dynamic-batching",
        action=argparse.BooleanOptionalAction,
        default=sc.dynamic_batching,
        help="let Triton gather queued requests into one model call",
    )
    p.add_argument(
        "--max-queue-delay-us", type=int, default=sc.max_queue_delay_us, help="longest wait to gather a bigger batch"
    )
    p.add_argument("--instances", type=int, default=sc.instances, help="model instances per task")
    _guard_args(p, sc)
    _request_args(p)
    p.add_argument(
        "--access-token",
        default=None,
        help="token for Triton's restricted endpoints (statistics, model repository, ...), sent by "
        "clients as the triton-access-token header; default $BERTFORGE_ACCESS_TOKEN or a random "
        "one, printed at start",
    )
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    p.add_argument(
        "--device",
        default="auto",
        help="where the model runs: auto (a GPU when there is one, else the CPU), cpu, cuda[:N], ...",
    )
    p.add_argument(
        "--precision",
        default="fp32",
        choices=("auto", "fp32", "bf16", "fp16"),
        help="model arithmetic: fp32, or bf16/fp16 autocast (outputs stay fp32); auto = bf16 where "
        "the device has it natively",
    )
    p.add_argument(
        "--warmup",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run one batch of --max-batch rows of --max-seq-len tokens before reporting ready, so the "
        "first request does not pay for the device's lazy start (seconds on a GPU)",
    )
    p.add_argument("--log-verbose", type=int, default=0, help="Triton log verbosity")


def _guard_args(p: argparse.ArgumentParser, sc) -> None:
    """The guards in front of Triton's own HTTP and gRPC servers (`serve.guard`)."""
    p.add_argument(
        "--http-guard",
        action=argparse.BooleanOptionalAction,
        default=sc.http_guard,
        help="check HTTP requests (size, content type, JSON) in front of Triton's HTTP server; --no-http-guard "
        "saves ~1.4 ms a request, for trusted clients only (a large form-encoded body crashes Triton 2.51)",
    )
    p.add_argument(
        "--grpc-guard",
        action=argparse.BooleanOptionalAction,
        default=sc.grpc_guard,
        help="pass gRPC calls through a guard in front of Triton's gRPC server, which refuses the classification "
        "extension on a string output (it crashes Triton 2.51); --no-grpc-guard: for trusted clients only",
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=sc.max_body_bytes,
        help="largest HTTP request body (after gzip/deflate); larger bodies get 413 before Triton reads them",
    )


def _request_args(p: argparse.ArgumentParser) -> None:
    """What one request may ask for and how it is computed (`tasks.Limits`, embed pooling)."""
    from bertforge.serve.tasks import Limits

    lim = Limits()
    p.add_argument(
        "--max-seq-len",
        type=int,
        default=argparse.SUPPRESS,  # absent: fitted to the model (the help shows no "None")
        help=f"tokens per model row (default {lim.max_seq_len}, or the model's positions when fewer; embed: "
        "a sentence-transformers model's max_seq_length when fewer)",
    )
    p.add_argument("--doc-stride", type=int, default=lim.doc_stride, help="QA: tokens between window starts")
    p.add_argument(
        "--max-request-bytes",
        type=int,
        default=lim.max_request_bytes,
        help="UTF-8 bytes of text per request; larger requests are refused",
    )
    p.add_argument("--top-k", type=int, default=lim.top_k, help="fill-mask: candidates per [MASK]")
    p.add_argument(
        "--pooling",
        choices=("auto", "mean", "cls"),
        default="auto",
        help="embed: mean of the token vectors or the [CLS] vector (then L2-normalised); auto = the model's "
        "sentence-transformers pooling config (modules.json), else mean",
    )


def _check_listening(cfg) -> None:
    """The ports free on --host, and one warning line when --host serves other machines."""
    from bertforge.serve import server

    server.check_ports(cfg)
    if warning := server.exposure_warning(cfg):
        print(warning, file=sys.stderr, flush=True)


def _predictors(args: argparse.Namespace, limits, call_rows: int) -> list:
    """(task, Predictor) of each --model/--task pair, loaded with the request limits and the device flags."""
    from bertforge.serve.tasks import Predictor

    pooling = None if args.pooling == "auto" else args.pooling
    return [
        (t, Predictor.from_dir(t, m, limits, args.precision, args.device, fit_seq_len="max_seq_len" not in args,
                               pooling=pooling, call_rows=call_rows))
        for m, t in zip(args.model, args.task)
    ]  # fmt: skip


def serve_run(args: argparse.Namespace) -> int:
    import torch

    from bertforge.serve import server
    from bertforge.serve.tasks import Limits

    if len(args.model) != len(args.task):
        raise UserError(f"give one --task per --model ({len(args.model)} models, {len(args.task)} tasks)")
    if len(set(args.task)) != len(args.task):
        raise UserError("each task can be served once per server")
    if args.threads is not None and args.threads < 1:
        raise UserError(f"--threads must be at least 1, not {args.threads}")
    token = args.access_token or os.environ.get("BERTFORGE_ACCESS_TOKEN") or None  # never echoed by --help
    cfg = server.ServeConfig(
        host=args.host,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        max_batch=args.max_batch,
        dynamic_batching=args.dynamic_batching,
        max_queue_delay_us=args.max_queue_delay_us,
        instances=args.instances,
        http_guard=args.http_guard,
        grpc_guard=args.grpc_guard,
        max_body_bytes=args.max_body_bytes,
        access_token=token,
        log_verbose=args.log_verbose,
    )
    if args.http_guard and args.max_body_bytes < args.max_request_bytes:
        raise UserError(
            f"--max-body-bytes {args.max_body_bytes} is below --max-request-bytes {args.max_request_bytes}: "
            "requests the model would take could not arrive; raise --max-body-bytes"
        )
    limits = Limits(
        max_seq_len=getattr(args, "max_seq_len", Limits.max_seq_len),
        doc_stride=args.doc_stride,
        max_request_bytes=args.max_request_bytes,
        top_k=args.top_k,
    )
    _check_listening(cfg)  # after the flags, before any model loads (seconds to minutes)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    predictors = _predictors(args, limits, cfg.max_batch)
    if args.warmup:
        for _, p in predictors:
            p.warmup(rows=cfg.max_batch)
    with sigterm_interrupts():  # SIGTERM while Triton starts: `start` stops what it started (no orphans)
        running = server.start(predictors, cfg)
    names = ", ".join(server.TASKS[t].model_name for t in args.task)
    batching = f"dynamic, max {cfg.max_batch} rows, {cfg.max_queue_delay_us} us" if cfg.dynamic_batching else "off"
    print(
        f"bertforge serve: models {names} ready; http {cfg.host}:{cfg.http_port}, grpc {cfg.host}:{cfg.grpc_port}, "
        f"metrics {cfg.host}:{cfg.metrics_port}; batching {batching}",
        flush=True,
    )
    if token is None:
        print(f"bertforge serve: access token {server.access_token(running)}", flush=True)
    try:
        with sigterm_interrupts():  # SIGTERM stops Triton as Ctrl-C does (no orphaned tritonserver)
            running.serve()  # returns only when Triton is gone
        print("bertforge serve: error: the inference server stopped on its own (its log is above)", file=sys.stderr)
        return 1  # not 0: a supervisor restarts it
    except KeyboardInterrupt:
        return 0
    finally:
        running.stop()


# ------------------------------------------------------------------------------------------------ predict
def predict_add(p: argparse.ArgumentParser) -> None:
    from bertforge.serve.server import ServeConfig

    p.add_argument("--task", required=True, choices=SERVE_TASKS)
    p.add_argument("--url", default="127.0.0.1:8000", help="server address host:port (HTTP, or gRPC with --grpc)")
    p.add_argument("--grpc", action="store_true", help="use gRPC instead of HTTP")
    p.add_argument("--question", action="append", help="qa: a question (repeat for a batch)")
    p.add_argument("--context", action="append", help="qa: its context (one per --question)")
    p.add_argument("--text", action="append", help="classify / fill-mask / embed: a text (repeat for a batch)")
    p.add_argument("--text-pair", action="append", help="classify: the second sentence (one per --text)")
    p.add_argument(
        "--jsonl",
        default=None,
        help="read rows from a JSON-lines file (keys: question+context | text [+text_pair]); '-' = stdin",
    )
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the server")
    p.add_argument(
        "--batch",
        type=int,
        default=ServeConfig().max_batch,
        help="rows per request (default: `bertforge serve`'s --max-batch, the most a server takes by default)",
    )


def predict_run(args: argparse.Namespace) -> int:
    from bertforge.serve.client import Client, rows_as_json, server_message
    from bertforge.serve.tasks import TASKS

    if not 0 < args.timeout < math.inf:
        raise UserError(f"--timeout is in seconds; give a number > 0, not {args.timeout}")
    if args.batch < 1:
        raise UserError(f"--batch is rows per request; give a number >= 1, not {args.batch}")
    spec = TASKS[args.task]
    lines: list[int] | None = None
    if args.jsonl:
        cols, lines = read_jsonl(args.jsonl, args.task)
    else:
        given = {"question": args.question, "context": args.context, "text": args.text, "text_pair": args.text_pair}
        cols = {io.name: given[io.name] for io in spec.inputs if given.get(io.name)}
        _check_counts(cols)
    missing = [io.name for io in spec.inputs if not io.optional and io.name not in cols]
    if missing:
        raise UserError(f"task {args.task} needs --{' --'.join(m.replace('_', '-') for m in missing)} (or --jsonl)")
    from tritonclient.utils import InferenceServerException

    n = len(next(iter(cols.values())))
    start = 0
    try:
        with Client(args.url, "grpc" if args.grpc else "http", timeout_s=args.timeout) as c:
            # --batch rows per request: a server refuses more than its --max-batch (16 by default) in one
            for start in range(0, n, args.batch):
                part = {name: col[start : start + args.batch] for name, col in cols.items()}
                for row in rows_as_json(args.task, c.infer(args.task, **part)):
                    print(json.dumps(row, ensure_ascii=False), flush=True)
    except InferenceServerException as e:
        status = str(e.status() or "")
        if status.endswith("UNAVAILABLE"):  # gRPC's "cannot connect": nothing refused anything
            raise UserError(
                f"cannot reach a gRPC server at {args.url} ({server_message(e)}); start one with `bertforge serve`, "
                "or give its --grpc-port"
            ) from None
        if status.endswith("DEADLINE_EXCEEDED"):
            raise UserError(_no_answer(args)) from None
        hint = " (fewer rows per request: --batch)" if "batch-size must be" in str(e) else ""
        if "unknown model" in str(e):  # a server of other tasks: 404 alone did not say what to do
            hint = f" (it does not serve task {args.task}: start one with --task {args.task}, or give its --url)"
        what, msg = _refused_rows(server_message(e), start, min(start + args.batch, n), args.jsonl, lines)
        raise UserError(f"server at {args.url} refused {what}{hint}: {msg}") from None
    except TimeoutError:  # connected (or trying to) but no answer within --timeout: a busy server is not absent
        raise UserError(_no_answer(args)) from None
    except (ConnectionError, OSError) as e:
        raise UserError(f"cannot reach a server at {args.url} ({e}); start one with `bertforge serve`") from None
    except Exception as e:  # noqa: BLE001 - a port that answers something other than HTTP: the parser's error
        if type(e).__name__ != "HTTPParseError":
            raise
        raise UserError(
            f"{args.url} does not answer HTTP ({e}); is it the gRPC port? Add --grpc, or give the HTTP port"
        ) from None
    return 0


def _no_answer(args: argparse.Namespace) -> str:
    return (
        f"the server at {args.url} did not answer within {args.timeout:g} s; it may be busy (raise --timeout) "
        "or not a bertforge server"
    )


def _check_counts(cols: dict[str, list[str]]) -> None:
    """The command line's columns are of one length: --context per --question, --text-pair per --text (the server
    refused a mismatch as "batch size does not match", and with --batch the later requests went out unpaired)."""
    counts = {name: len(col) for name, col in cols.items()}
    if len(set(counts.values())) > 1:
        given = ", ".join(f"{k} --{name.replace('_', '-')}" for name, k in counts.items())
        raise UserError(f"give one value of each input per row: got {given}")


def _refused_rows(msg: str, start: int, end: int, jsonl: str | None, lines: list[int] | None) -> tuple[str, str]:
    """What a refused request held, and the server's message: its "row K" counts from the request's first row,
    which past the first request (--batch) is not the input's row K, so the input's own row (or --jsonl line)
    is named instead."""
    m = re.search(r"\brow (\d+)\b", msg)
    if m is not None and start + int(m[1]) < end:
        k = start + int(m[1])
        if jsonl is not None and lines is not None:
            return f"{jsonl} line {lines[k]}", msg[: m.start()].rstrip() + msg[m.end() :]
        return "the request", f"{msg[: m.start()]}row {k}{msg[m.end() :]}"
    if jsonl is not None and lines is not None:
        span = f"line {lines[start]}" if end - start == 1 else f"lines {lines[start]}-{lines[end - 1]}"
        return f"the request of {jsonl} {span}", msg
    return "the request" if start == 0 else f"the request of rows {start}-{end - 1}", msg


def read_jsonl(path: str, task: str) -> tuple[dict[str, list[str]], list[int]]:
    """`bertforge predict --jsonl`: the file's rows (`-`: stdin) as columns, one JSON object per non-blank line
    holding the task's inputs as strings (other keys are ignored), and each row's line number in the file (blank
    lines hold no row). A row without an optional input (text_pair) gets an empty string, which the server takes
    as "no pair" for that row, so the columns stay in step."""
    from bertforge.serve.tasks import TASKS

    inputs = TASKS[task].inputs
    rows, lines = [], []
    with _open_jsonl(path) as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise UserError(
                    f"{path} line {n}: not UTF-8 ({e.reason} at byte {e.start}); save it as UTF-8"
                ) from None
            if line.strip():
                rows.append(_jsonl_row(line, f"{path} line {n}", task, inputs))
                lines.append(n)
    if not rows:
        raise UserError(f"{path} holds no rows; write one JSON object per line (--jsonl)")
    names = [io.name for io in inputs if any(io.name in r for r in rows)]
    return {name: [r.get(name, "") for r in rows] for name in names}, lines


def _open_jsonl(path: str) -> contextlib.AbstractContextManager[BinaryIO]:
    if path == "-":
        return contextlib.nullcontext(sys.stdin.buffer)  # not closed: it is the process's
    try:
        return open(path, "rb")
    except OSError as e:
        raise UserError(f"--jsonl {path}: cannot read it ({e.strerror or e})") from None


def _jsonl_row(line: str, where: str, task: str, inputs: Sequence[IOSpec]) -> dict[str, str]:
    """One line's inputs, or a UserError naming the line and what is wrong with it."""
    try:
        row = json.loads(line)
    except ValueError as e:
        raise UserError(f"{where}: not JSON ({e})") from None
    if not isinstance(row, dict):
        keys = " and ".join(repr(io.name) for io in inputs if not io.optional)
        raise UserError(f"{where}: expected a JSON object with {keys}, not {json.dumps(row)[:40]}")
    out = {}
    for io in inputs:
        if io.name not in row:
            if io.optional:
                continue
            raise UserError(f"{where}: no {io.name!r}, which task {task} needs in every row")
        value = row[io.name]
        if not isinstance(value, str) or not _utf8(value):
            raise UserError(f"{where}: {io.name!r} must be a string of text, not {json.dumps(value)[:40]}")
        out[io.name] = value
    return out


def _utf8(text: str) -> bool:
    """Whether `text` has a UTF-8 form: json.loads keeps an escaped lone surrogate ("\\ud800"), which has none."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
