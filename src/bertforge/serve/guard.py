"""The HTTP front of `bertforge serve`: every HTTP request passes this guard before Triton's own HTTP server,
which listens on a private loopback port.

Why: Triton 2.51's HTTP front end (C++, before any model code) crashes the whole server on a form-encoded body
of a few MB — curl's default `Content-Type` for `-d @file` — and it has no option to cap a body's size. It also
answers bodies it cannot parse with 500. Here, before anything reaches Triton:

- a body over `max_body_bytes` is refused with 413 (read no further than the limit, also for chunked bodies);
- a form-encoded or multipart body with 415 (the KServe v2 protocol is JSON, with an optional binary tail);
- a compressed body (gzip, deflate) is inflated as it is read, so the limit and the JSON checks apply to what
  Triton would read (a small body cannot inflate to gigabytes there);
- an inference request whose JSON does not parse, or whose `inputs` are not tensors (`check_infer`), with 400.

Everything else — health, metadata, the restricted endpoints with their access token, binary-tensor requests —
goes to Triton unchanged, and Triton's answer comes back unchanged (status, headers, compressed or not).
Errors are one line as JSON, `{"error": "..."}`, like Triton's own; a Triton that does not answer (stopping,
gone) is a 502 of the same form. gRPC does not pass here: its front end
refuses malformed messages itself.

    guard = HttpGuard(host, port, upstream_port, max_body_bytes)   # serves in a thread of its own
    guard.stop()
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web

FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/")
# connection-level headers: each hop sets its own
HOP_HEADERS = frozenset(
    ["connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "expect"]
)
# the length follows the body forwarded, which aiohttp inflated as it read it: Triton reads it plain
REQUEST_DROP = HOP_HEADERS | {"host", "content-length", "content-encoding"}
RESPONSE_DROP = HOP_HEADERS | {"content-length"}  # Triton's encoding passes (it compressed what was asked for)
BINARY_HEADER = "Inference-Header-Content-Length"  # KServe binary-tensor extension: JSON, then raw tensors


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
    inputs = doc.get("inputs")
    if not isinstance(inputs, list) or not all(isinstance(t, dict) for t in inputs):
        raise Refusal(400, "'inputs' must be a list of tensors ({'name', 'shape', 'datatype', 'data'})")
    for t in inputs:
        name = t.get("name", "?")
        if not isinstance(t.get("shape"), list) or not all(isinstance(d, int) and d >= 0 for d in t["shape"]):
            raise Refusal(400, f"input {name!r}: 'shape' must be a list of non-negative integers")
        if t.get("datatype") == "BYTES" and "data" in t and not all(isinstance(x, str) for x in _flat(t["data"])):
            raise Refusal(400, f"input {name!r} is BYTES: its 'data' must be strings")


def _flat(data: Any) -> list[Any]:
    """A tensor's `data`, flat or nested row by row as KServe v2 allows."""
    if not isinstance(data, list):
        return [data]
    return [x for item in data for x in _flat(item)]


def _json_length(request: web.Request, size: int) -> int:
    """How many leading bytes of the body are JSON: all, or what the binary-tensor header says."""
    value = request.headers.get(BINARY_HEADER)
    if value is None:
        return size
    if not value.isdigit() or int(value) > size:
        raise Refusal(400, f"{BINARY_HEADER} {value!r} is not a byte count within the {size}-byte body")
    return int(value)


async def read_body(request: web.Request, limit: int) -> bytes:
    """The body (inflated by aiohttp when compressed), refused (413) as soon as it passes `limit` bytes, however it
    is sent."""
    if request.content_length is not None and request.content_length > limit:
        raise Refusal(413, f"the request body has {request.content_length} bytes, over the server's limit of {limit}")
    body = bytearray()
    async for chunk in request.content.iter_chunked(1 << 16):
        body += chunk
        if len(body) > limit:
            raise Refusal(413, f"the request body is over the server's limit of {limit} bytes (--max-body-bytes)")
    return bytes(body)


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
        self._runner = web.AppRunner(app, access_log=None)
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
            head = body[: _json_length(request, len(body))]
            try:
                doc = json.loads(head)
            except (ValueError, UnicodeDecodeError) as e:
                raise Refusal(400, f"the request body is not valid JSON ({e})") from None
            check_infer(doc)
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
