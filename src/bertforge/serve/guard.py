"""The HTTP front of `bertforge serve`: every HTTP request passes this guard before Triton's own HTTP server,
which listens on a private loopback port.

Why: Triton 2.51's HTTP front end (C++, before any model code) crashes the whole server on a form-encoded body
of a few MB — curl's default `Content-Type` for `-d @file` — and it has no option to cap a body's size. It also
answers bodies it cannot parse with 500. Here, before anything reaches Triton:

- a body over `max_body_bytes` is refused with 413 (read no further than the limit, also for chunked bodies);
- a form-encoded or multipart body with 415 (the KServe v2 protocol is JSON, with an optional binary tail);
- a compressed body (gzip, deflate) is inflated as it is read, so the limit and the JSON checks apply to what
  Triton would read (a small body cannot inflate to gigabytes there); a body that does not inflate is a 400, any
  other Content-Encoding a 415;
- an inference request whose JSON is not UTF-8, does not parse, nests deeper than `MAX_DEPTH`, or holds a member
  of a type Triton's parser does not take (`check_infer`), with 400.

Everything else — health, metadata, the restricted endpoints with their access token, binary-tensor requests —
goes to Triton unchanged, and Triton's answer comes back unchanged (status, headers, compressed or not).
Errors are one line as JSON, `{"error": "..."}`, like Triton's own; a Triton that does not answer (stopping,
gone) is a 502 of the same form. gRPC passes `GrpcGuard` (below), which forwards every call as it is but the one
known to crash Triton; Triton's gRPC front end refuses malformed messages itself.

    guard = HttpGuard(host, port, upstream_port, max_body_bytes)   # serves in a thread of its own
    guard.stop()
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
import zlib
from collections.abc import Callable
from typing import Any

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web
from aiohttp.http_exceptions import HttpProcessingError

FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/")
# connection-level headers: each hop sets its own
HOP_HEADERS = frozenset(
    ["connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "expect"]
)
# the length follows the body forwarded, which aiohttp inflated as it read it: Triton reads it plain
REQUEST_DROP = HOP_HEADERS | {"host", "content-length", "content-encoding"}
RESPONSE_DROP = HOP_HEADERS | {"content-length"}  # Triton's encoding passes (it compressed what was asked for)
BINARY_HEADER = "Inference-Header-Content-Length"  # KServe binary-tensor extension: JSON, then raw tensors
# Content-Encodings the guard inflates (zlib's window bits; `Inflater.feed` picks a raw deflate's); others: 415
ENCODINGS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
# JSON nesting accepted: a request nests 4 levels around its tensors' data, which nests one level per dimension;
# deeper documents only exercise parsers' recursion (Python's json and ours raise RecursionError near 1000)
MAX_DEPTH = 32
# an escaped UTF-16 surrogate ("\ud800"): json.loads keeps a lone one, which Triton's parser answers with 500
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")


def _is_uint(v: Any) -> bool:  # Triton reads these as uint64 (bool is an int to Python, not to JSON)
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 64


def _is_int(v: Any) -> bool:  # int64
    return isinstance(v, int) and not isinstance(v, bool) and -(1 << 63) <= v < 1 << 63


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


def _is_bool(v: Any) -> bool:
    return isinstance(v, bool)


# Members Triton 2.51's HTTP front end reads with one JSON type, answering 500 for another (measured; the
# rest it ignores or refuses with 400 itself): member -> (check, the type to say).
Check = tuple[Callable[[Any], bool], str]
_REQUEST_PARAMETERS: dict[str, Check] = {
    "sequence_id": (lambda v: _is_str(v) or _is_uint(v), "a string or a non-negative integer"),
    "sequence_start": (_is_bool, "true or false"),
    "sequence_end": (_is_bool, "true or false"),
    "priority": (_is_uint, "a non-negative integer"),
    "timeout": (_is_uint, "a non-negative integer"),
    "binary_data_output": (_is_bool, "true or false"),
}
_SHARED_MEMORY: dict[str, Check] = {
    "shared_memory_region": (_is_str, "a string"),
    "shared_memory_byte_size": (_is_uint, "a non-negative integer"),
    "shared_memory_offset": (_is_uint, "a non-negative integer"),
}
# an input's binary tensor (`binary_data_size`, the binary extension): Triton 2.51 answered another type with 500
_INPUT_PARAMETERS: dict[str, Check] = {"binary_data_size": (_is_uint, "a non-negative integer"), **_SHARED_MEMORY}
_OUTPUT_PARAMETERS: dict[str, Check] = {
    "binary_data": (_is_bool, "true or false"),
    "classification": (_is_uint, "a non-negative integer"),
    **_SHARED_MEMORY,
}
# the JSON type of each element of a tensor's `data`, by datatype (unknown datatypes: Triton's 400)
_DATA: dict[str, Check] = {
    "BYTES": (_is_str, "strings"),
    "BOOL": (_is_bool, "true or false"),
    **{f"INT{n}": (_is_int, "integers") for n in (8, 16, 32, 64)},
    **{f"UINT{n}": (_is_uint, "non-negative integers") for n in (8, 16, 32, 64)},
    **{f"FP{n}": (_is_number, "numbers") for n in (16, 32, 64)},
}


def _string_outputs() -> set[str]:
    """The names of the served tasks' BYTES outputs."""
    from bertforge.serve.tasks import TASKS

    return {io.name for spec in TASKS.values() for io in spec.outputs if io.dtype == "BYTES"}


class _ClientFaultsOnOneLine(logging.Filter):
    """aiohttp logs each request it cannot parse (bad framing, an over-long header, a client gone mid-body) with a
    traceback through its parser: a dozen lines per malformed request, which any client can repeat at will and
    which read like a server fault. They are the client's: one line each."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, (HttpProcessingError, ConnectionResetError)):
            why = exc.message if isinstance(exc, HttpProcessingError) else str(exc)
            line = next((x.strip() for x in str(why).splitlines() if x.strip()), type(exc).__name__).rstrip(":")
            record.msg, record.args = f"{record.getMessage()}: {line[:200]} (refused; the server goes on)", None
            record.exc_info = record.exc_text = None
        return True


_http_log = logging.getLogger(f"{__name__}.http")
_http_log.addFilter(_ClientFaultsOnOneLine())


class Refusal(Exception):
    """A client mistake the guard answers itself: HTTP status and one line."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def check_infer(doc: Any) -> None:
    """An inference request's JSON as Triton's front end needs it, or `Refusal(400)` saying what is off. Triton
    checks names, datatypes, shapes and batch sizes itself (400s); this covers what it would answer with 500."""
    if not isinstance(doc, dict):
        raise Refusal(400, "the request body must be a JSON object with 'inputs'")
    _check_depth(doc)
    if "id" in doc and not isinstance(doc["id"], str):
        raise Refusal(400, "'id' must be a string")
    _check_parameters(doc, "the request", _REQUEST_PARAMETERS)
    inputs = doc.get("inputs")
    if not isinstance(inputs, list) or not all(isinstance(t, dict) for t in inputs):
        raise Refusal(400, "'inputs' must be a list of tensors ({'name', 'shape', 'datatype', 'data'})")
    for t in inputs:
        _check_input(t)
    outputs = doc.get("outputs", [])
    if not isinstance(outputs, list) or not all(isinstance(o, dict) and _is_str(o.get("name")) for o in outputs):
        raise Refusal(400, "'outputs' must be a list of objects with a string 'name'")
    for o in outputs:
        _check_parameters(o, f"output {o['name']!r}", _OUTPUT_PARAMETERS)
        if "classification" in o.get("parameters", {}) and o["name"] in _string_outputs():
            # Triton 2.51 asked to classify a BYTES output crashes (the whole server, every model): refused here
            raise Refusal(
                400, f"output {o['name']!r} holds strings; the classification extension needs a numeric output"
            )


def _check_input(t: dict[str, Any]) -> None:
    name, datatype = t.get("name"), t.get("datatype")
    if not _is_str(name):
        raise Refusal(400, "every input needs a string 'name'")
    if not isinstance(datatype, str):
        raise Refusal(400, f"input {name!r} needs a string 'datatype' (BYTES, FP32, INT64, ...)")
    if not isinstance(t.get("shape"), list) or not all(_is_uint(d) for d in t["shape"]):
        raise Refusal(400, f"input {name!r}: 'shape' must be a list of non-negative integers")
    _check_parameters(t, f"input {name!r}", _INPUT_PARAMETERS)
    if "data" not in t:
        return  # binary or shared-memory data: Triton checks which one is set
    if not isinstance(t["data"], list):
        raise Refusal(400, f"input {name!r}: 'data' must be a list")
    check, kind = _DATA.get(datatype, (lambda v: True, ""))
    if not all(check(x) for x in _flat(t["data"])):
        raise Refusal(400, f"input {name!r} is {datatype}: its 'data' must be {kind}")


def _check_parameters(holder: dict[str, Any], what: str, typed: dict[str, Check]) -> None:
    """`holder["parameters"]` is an object whose members of `typed` have their type."""
    params = holder.get("parameters", {})
    if not isinstance(params, dict):
        raise Refusal(400, f"{what}: 'parameters' must be a JSON object")
    for key, (check, kind) in typed.items():
        if key in params and not check(params[key]):
            raise Refusal(400, f"{what}: parameter {key!r} must be {kind}")


def _check_depth(doc: Any) -> None:
    """Refuse JSON nested deeper than MAX_DEPTH, level by level (no recursion to run out of)."""
    level: list[Any] = [doc]
    for _ in range(MAX_DEPTH):
        level = [v for node in level for v in (node.values() if isinstance(node, dict) else node)]
        level = [v for v in level if isinstance(v, (dict, list))]
        if not level:
            return
    raise Refusal(400, f"the request JSON nests more than {MAX_DEPTH} levels")


def _flat(data: Any) -> list[Any]:
    """A tensor's `data`, flat or nested row by row as KServe v2 allows (depth bounded by `_check_depth`)."""
    if not isinstance(data, list):
        return [data]
    return [x for item in data for x in _flat(item)]


def parse_json(head: bytes) -> Any:
    """An inference request's JSON, or `Refusal(400)`: UTF-8 only (json.loads would also take UTF-16 and UTF-32,
    which Triton's parser does not), nesting bounded, no lone surrogate (Triton refuses them with 500)."""
    try:
        text = head.decode("utf-8-sig")  # a UTF-8 byte-order mark Triton accepts
    except UnicodeDecodeError as e:
        raise Refusal(400, f"the request body is not UTF-8 ({e.reason} at byte {e.start}); send UTF-8 JSON") from None
    try:
        doc = json.loads(text)
    except RecursionError:
        raise Refusal(400, f"the request JSON nests more than {MAX_DEPTH} levels") from None
    except ValueError as e:
        raise Refusal(400, f"the request body is not valid JSON ({e})") from None
    if _ESCAPED_SURROGATE.search(text):  # rare: only then re-encode the whole document to find a lone one
        try:
            json.dumps(doc, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise Refusal(
                400, "the request JSON holds an unpaired UTF-16 surrogate (\\ud800-\\udfff); send valid Unicode"
            ) from None
    return doc


def _json_length(request: web.Request, size: int) -> int:
    """How many leading bytes of the body are JSON: all, or what the binary-tensor header says."""
    value = request.headers.get(BINARY_HEADER)
    if value is None:
        return size
    if not value.isdigit() or int(value) > size:
        raise Refusal(400, f"{BINARY_HEADER} {value!r} is not a byte count within the {size}-byte body")
    return int(value)


async def read_body(request: web.Request, limit: int) -> bytes:
    """The body, inflated when compressed (gzip, deflate), refused (413) as soon as it passes `limit` bytes before
    or after inflating, however it is sent; one that does not inflate or arrive whole is a 400, another encoding a
    415. The guard inflates it itself (aiohttp's own decompression is off): aiohttp's errors escaped as 500s, and
    which encodings it takes depends on optional packages (brotli, zstd)."""
    if request.content_length is not None and request.content_length > limit:
        raise Refusal(413, f"the request body has {request.content_length} bytes, over the server's limit of {limit}")
    encoding = request.headers.get("Content-Encoding", "").strip().lower() or "identity"
    inflater = None if encoding == "identity" else Inflater(encoding)
    body, raw = bytearray(), 0
    try:
        async for chunk in request.content.iter_chunked(1 << 16):
            raw += len(chunk)
            body += chunk if inflater is None else inflater.feed(chunk, at_most=limit + 1 - len(body))
            if len(body) > limit or raw > limit:
                raise Refusal(413, f"the request body is over the server's limit of {limit} bytes (--max-body-bytes)")
        if inflater is not None:
            inflater.end()
    except (zlib.error, EOFError) as e:
        raise Refusal(400, f"the request body is not valid {encoding} data ({e})") from None
    except web.RequestPayloadError as e:  # framing (chunked) broken, or the client went away mid-body
        raise Refusal(400, f"the request body could not be read ({e})") from None
    except ConnectionResetError:
        # the client closed the connection mid-body: nobody reads an answer, but answering keeps aiohttp from
        # logging a traceback through this function for what is the client's doing
        raise Refusal(400, "the client closed the connection before sending the whole body") from None
    return bytes(body)


class Inflater:
    """A gzip or deflate body inflated chunk by chunk, never to more bytes than asked for (a small body cannot
    inflate to gigabytes in memory); zlib.error for bytes that do not inflate, EOFError for a stream cut short or
    followed by other bytes."""

    def __init__(self, encoding: str):
        if encoding not in ENCODINGS:
            raise Refusal(415, f"Content-Encoding {encoding} is not accepted; send gzip, deflate or no encoding")
        self.encoding = encoding
        self._z: Any = None

    def feed(self, chunk: bytes, at_most: int) -> bytes:
        if self._z is None:
            # HTTP's deflate is zlib-wrapped (RFC 9110) but some clients send it raw: the first byte tells (a zlib
            # header's low nibble is 8, the deflate method), as aiohttp decides it
            bare = self.encoding == "deflate" and bool(chunk) and chunk[0] & 0xF != 8
            self._z = zlib.decompressobj(-zlib.MAX_WBITS if bare else ENCODINGS[self.encoding])
        if self._z.eof:
            raise EOFError("bytes after the end of the stream")
        return self._z.decompress(chunk, at_most)

    def end(self) -> None:
        if self._z is not None and not self._z.eof:
            raise EOFError("the stream is cut short")
        if self._z is not None and self._z.unused_data:
            raise EOFError("bytes after the end of the stream")


class HttpGuard:
    """The guard's aiohttp server on (host, port), forwarding to Triton on 127.0.0.1:upstream_port."""

    def __init__(self, host: str, port: int, upstream_port: int, max_body_bytes: int):
        self.upstream = f"http://127.0.0.1:{upstream_port}"
        self.limit = max_body_bytes
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._failed: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, args=(host, port), name="bertforge-http", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._failed is not None:
            raise OSError(f"cannot serve HTTP on {host}:{port}: {self._failed}")

    def _serve(self, host: str, port: int) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._start(host, port))
        except BaseException as e:  # reported by __init__ (the port is taken, say)
            self._failed = e
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()

    async def _start(self, host: str, port: int) -> None:
        # no read timeout: a request may queue behind others in Triton's dynamic batcher for a while
        # bodies pass as they are, in both directions: no decompressing Triton's answers, and no Accept-Encoding
        # of aiohttp's own (Triton would then compress for a client that did not ask for it)
        self._session = ClientSession(
            connector=TCPConnector(limit=256),
            timeout=ClientTimeout(total=None),
            auto_decompress=False,
            skip_auto_headers=("Accept-Encoding", "User-Agent"),
        )
        app = web.Application()  # the body limit is read_body's: it reads request.content itself
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # auto_decompress off: read_body inflates the body itself, within the limit and with one-line errors
        self._runner = web.AppRunner(app, access_log=None, auto_decompress=False, logger=_http_log)
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port).start()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await self._checked_body(request)
        except Refusal as r:
            return web.json_response({"error": str(r)}, status=r.status)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in REQUEST_DROP}
        try:
            async with self._session.request(
                request.method, self.upstream + request.path_qs, headers=headers, data=body or None
            ) as up:
                payload = await up.read()
                out = {k: v for k, v in up.headers.items() if k.lower() not in RESPONSE_DROP}
                return web.Response(status=up.status, body=payload, headers=out)
        except ClientError as e:  # Triton gone or stopping: the server's fault, one line, not aiohttp's page
            msg = f"the inference server is not answering ({type(e).__name__}); try again later"
            return web.json_response({"error": msg}, status=502)

    async def _checked_body(self, request: web.Request) -> bytes:
        body = await read_body(request, self.limit)
        if not body:
            return body
        ctype = request.headers.get("Content-Type", "").lower()
        if ctype.startswith(FORM_TYPES):
            raise Refusal(415, f"Content-Type {ctype.split(';')[0]} is not accepted; send application/json")
        if request.method == "POST" and request.path.rstrip("/").endswith("/infer"):
            head = _json_length(request, len(body))
            if head:  # 0: a raw binary request (the one input's bytes, no JSON; Triton's to check), not a 400
                check_infer(parse_json(body[:head]))
        return body

    def stop(self) -> None:
        """Close the port and the upstream connections; returns once the guard's thread has ended."""
        if not self._loop.is_running():
            return

        async def close() -> None:
            await self._runner.cleanup()
            await self._session.close()
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in others:  # connections still open (keep-alive clients): end them with the loop
                t.cancel()
            await asyncio.gather(*others, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


# ------------------------------------------------------------------------------------------------ gRPC
# methods that stream (Triton's bidirectional inference stream, the health service's watch); all others are unary
_GRPC_STREAMS = {
    "/inference.GRPCInferenceService/ModelStreamInfer": "stream_stream",
    "/grpc.health.v1.Health/Watch": "unary_stream",
}
_GRPC_INFER = ("/inference.GRPCInferenceService/ModelInfer", "/inference.GRPCInferenceService/ModelStreamInfer")
# no size limit of gRPC's own (4 MB by default) between the client and Triton: Triton's is what a client meets
_GRPC_OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]


def grpc_refusal(method: str, message: bytes) -> str | None:
    """Why the guard refuses a gRPC message (one line), or None to forward it: a ModelInferRequest asking for the
    classification extension on a string output, on which Triton 2.51 crashes (the whole server, every model)."""
    if method not in _GRPC_INFER or b"classification" not in message:  # the usual request: no parsing
        return None
    from google.protobuf.message import DecodeError
    from tritonclient.grpc import service_pb2

    try:
        request = service_pb2.ModelInferRequest.FromString(message)
    except DecodeError:
        return None  # Triton's to refuse
    for o in request.outputs:
        if "classification" in o.parameters and o.name in _string_outputs():
            return f"output {o.name!r} holds strings; the classification extension needs a numeric output"
    return None


def _deadline(context: Any) -> float | None:
    """The client's deadline, in seconds from now, for the call to Triton; None without one (gRPC gives an
    infinite time remaining then, which as a timeout was a deadline already past)."""
    left = context.time_remaining()
    return left if left is not None and left < 1e9 else None


def _forwarded_metadata(context: Any) -> list[tuple[str, str | bytes]]:
    """The client's metadata (the access token, ...), without what gRPC sets for each hop itself."""
    return [(k, v) for k, v in context.invocation_metadata() if not k.startswith((":", "grpc-")) and k != "user-agent"]


class GrpcGuard:
    """The gRPC front of `bertforge serve` on (host, port), forwarding every call, as raw bytes, to Triton's gRPC
    server on 127.0.0.1:upstream_port, after `grpc_refusal`: the one request known to crash Triton 2.51 over gRPC
    (the HTTP guard refuses the same in `check_infer`) is answered INVALID_ARGUMENT here."""

    def __init__(self, host: str, port: int, upstream_port: int, workers: int = 64):
        from concurrent.futures import ThreadPoolExecutor

        import grpc

        self._grpc = grpc
        self._channel = grpc.insecure_channel(f"127.0.0.1:{upstream_port}", options=_GRPC_OPTIONS)
        # each call in flight holds a worker (a stream, for its whole life): more than a load test's concurrency
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="bertforge-grpc")
        # no SO_REUSEPORT (gRPC's default): a port that something else holds is an error, not shared
        self._server = grpc.server(pool, handlers=[self], options=[*_GRPC_OPTIONS, ("grpc.so_reuseport", 0)])
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            bound = self._server.add_insecure_port(address)
        except RuntimeError as e:  # grpcio >= 1.5x raises where older ones returned 0
            raise OSError(f"cannot serve gRPC on {address}: {e}") from None
        if bound == 0:
            raise OSError(f"cannot serve gRPC on {address}")
        self._server.start()

    # grpc.GenericRpcHandler: every method goes to Triton as it came
    def service(self, details: Any) -> Any:
        grpc, method = self._grpc, details.method
        kind = _GRPC_STREAMS.get(method, "unary_unary")
        upstream = getattr(self._channel, kind)(method)  # no (de)serializers: raw bytes both ways

        def relay(e: Any, context: Any) -> None:
            if isinstance(e, grpc.Call):  # Triton's answer (an error it sent, or UNAVAILABLE: Triton gone)
                context.abort(e.code(), e.details() or "")
            context.abort(grpc.StatusCode.UNAVAILABLE, "the inference server is not answering; try again later")

        if kind == "unary_unary":

            def unary(request: bytes, context: Any) -> bytes:
                refusal = grpc_refusal(method, request)
                if refusal is not None:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, refusal)
                call = upstream.future(request, timeout=_deadline(context), metadata=_forwarded_metadata(context))
                context.add_callback(call.cancel)  # the client gone: so is Triton's call
                try:
                    return call.result()
                except grpc.RpcError as e:
                    relay(e, context)
                    raise  # not reached: abort raises

            return grpc.unary_unary_rpc_method_handler(unary)
        if kind == "unary_stream":

            def unary_stream(request: bytes, context: Any) -> Any:
                responses = upstream(request, timeout=_deadline(context), metadata=_forwarded_metadata(context))
                context.add_callback(responses.cancel)
                try:
                    yield from responses
                except grpc.RpcError as e:
                    relay(e, context)

            return grpc.unary_stream_rpc_method_handler(unary_stream)

        def stream(requests: Any, context: Any) -> Any:
            refused: list[str] = []
            started = threading.Event()
            call: list[Any] = []

            def checked() -> Any:  # consumed by gRPC's own thread, as Triton takes the stream's requests
                for request in requests:
                    refusal = grpc_refusal(method, request)
                    if refusal is not None:  # ends the stream: the client hears INVALID_ARGUMENT below
                        refused.append(refusal)
                        started.wait(10)
                        if call:
                            call[0].cancel()
                        return
                    yield request

            responses = upstream(checked(), timeout=_deadline(context), metadata=_forwarded_metadata(context))
            call.append(responses)
            started.set()
            context.add_callback(responses.cancel)
            try:
                yield from responses
            except grpc.RpcError as e:
                if refused:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, refused[0])
                relay(e, context)

        return grpc.stream_stream_rpc_method_handler(stream)

    def stop(self) -> None:
        """Close the port (calls in flight are cancelled) and the channel to Triton."""
        self._server.stop(grace=None).wait(10)
        self._channel.close()
