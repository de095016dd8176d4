"""Edges of the serving surface a client or an operator meets: the HTTP guard's typed parameters, the server's log
when clients send broken HTTP or hang up mid-body, `bertforge serve --host` mistakes and exposure, and what
`bertforge predict` says when the server is absent, busy, of another task, or refuses a row of a long --jsonl.
One real server on loopback (one small regression model, no warm-up) for the checks that need one."""

from __future__ import annotations

import json
import socket
import time

import pytest
from tests.helpers import one_line

from bertforge.cli import main
from bertforge.serve.guard import Refusal, check_infer
from bertforge.serve.server import free_ports, listening

ARGS = ["--max-batch", "4", "--max-seq-len", "32", "--threads", "1", "--no-warmup"]


def _binary_input(size):
    return {"name": "text", "shape": [1, 1], "datatype": "BYTES", "parameters": {"binary_data_size": size}}


@pytest.mark.parametrize("size", ["6", -1, 1.5, True, None, 1 << 64])
def test_binary_data_size_of_another_type_is_a_400(size):
    """Triton 2.51 answered each with 500 ("attempt to access JSON non-unsigned-integer as unsigned-integer")."""
    with pytest.raises(Refusal) as r:
        check_infer({"inputs": [_binary_input(size)]})
    assert r.value.status == 400 and "binary_data_size" in str(r.value)
    check_infer({"inputs": [_binary_input(6)]})


def test_a_raw_binary_request_passes_the_guard():
    """`Inference-Header-Content-Length: 0` is the binary extension's raw request (the one input's bytes, no JSON),
    which Triton answers for a one-input model (fill_mask, embed); the guard refused it as "not valid JSON".
    A guard with no Triton behind it: what passes its checks gets a 502."""
    pytest.importorskip("aiohttp")
    from bertforge.serve.guard import HttpGuard

    port, upstream = free_ports(2)
    guard = HttpGuard("127.0.0.1", port, upstream, max_body_bytes=4096)
    try:
        for header, status in (("0", 502), ("00", 502), ("-0", 400), ("x", 400)):
            req = b"POST /v2/models/fill_mask/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 14\r\n"
            req += b"Inference-Header-Content-Length: %s\r\nConnection: close\r\n\r\nthe [MASK] sat" % header.encode()
            answer = _exchange(port, req)
            assert answer.startswith(b"HTTP/1.1 %d" % status), (header, answer[-200:])
    finally:
        guard.stop()


def test_a_host_that_is_not_this_machines_names_the_host(tmp_path, capsys):
    """It said "--http-port N: cannot listen on ...; stop what uses it or choose another --http-port": no port
    would have done. 192.0.2.1 is TEST-NET-1 (RFC 5737), no machine's own address."""
    (port,) = free_ports(1)
    argv = ["serve", "--task", "embed", "--model", str(tmp_path / "none"), "--host", "192.0.2.1"]
    assert main([*argv, "--http-port", str(port)]) == 2
    line = one_line(capsys.readouterr().err, "--host 192.0.2.1", "not an address of this machine")
    assert "--http-port" not in line


@pytest.mark.parametrize("host, warned", [("0.0.0.0", True), ("127.0.0.1", False), ("localhost", False)])
def test_serving_other_machines_is_said_at_start(tmp_path, capsys, host, warned):
    """--host 0.0.0.0 opened inference to every machine that can reach this one without a word: the access token
    guards only the restricted endpoints. The model here does not exist: the warning comes before it is read."""
    http, grpc, metrics = free_ports(3)
    argv = ["serve", "--task", "embed", "--model", str(tmp_path / "none"), "--host", host, "--no-http-guard"]
    assert main([*argv, "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)]) == 2
    err = capsys.readouterr().err
    warnings = [x for x in err.splitlines() if x.startswith("warning: ")]
    if warned:
        assert len(warnings) == 1 and f"--host {host}" in warnings[0] and "127.0.0.1" in warnings[0], err
        assert "--no-http-guard" in warnings[0]
    else:
        assert not warnings, err
    one_line(err, "not a Hugging Face model directory")


@pytest.mark.parametrize(
    "args, words",
    [
        (["--task", "classify", "--text", "a", "--text", "b", "--text-pair", "x"], ["2 --text, 1 --text-pair"]),
        (["--task", "qa", "--question", "q", "--context", "c", "--context", "d"], ["1 --question, 2 --context"]),
    ],
    ids=["text-pair", "context"],
)
def test_predict_inputs_of_different_counts_are_refused_before_sending(capsys, args, words):
    """They went to the server, which answered "batch size does not match other inputs"; with --batch the later
    requests went out with an empty text_pair column."""
    assert main(["predict", *args, "--url", "127.0.0.1:1"]) == 2
    one_line(capsys.readouterr().err, "one value of each input per row", *words)


def test_predict_over_grpc_with_no_server_says_it_cannot_reach_one(capsys):
    """It said the server "refused the request: [StatusCode.UNAVAILABLE] ..." when nothing listened."""
    (port,) = free_ports(1)
    argv = ["predict", "--task", "classify", "--text", "hi", "--url", f"127.0.0.1:{port}", "--grpc", "--timeout", "5"]
    assert main(argv) == 2
    one_line(capsys.readouterr().err, "cannot reach a gRPC server", f"127.0.0.1:{port}", "bertforge serve")


@pytest.mark.parametrize("grpc", [False, True], ids=["http", "grpc"])
def test_predict_against_a_server_that_does_not_answer_names_the_timeout(capsys, grpc):
    """A server that took longer than --timeout was "cannot reach a server ... (timed out); start one" over HTTP
    and "refused the request: Deadline Exceeded" over gRPC: it was there, and refused nothing."""
    with listening("127.0.0.1", 0) as s:  # accepts connections (the backlog) and never answers
        url = f"127.0.0.1:{s.getsockname()[1]}"
        t0 = time.perf_counter()
        argv = ["predict", "--task", "classify", "--text", "hi", "--url", url, "--timeout", "0.5"]
        assert main([*argv, *(["--grpc"] if grpc else [])]) == 2
        assert time.perf_counter() - t0 < 10
    one_line(capsys.readouterr().err, f"the server at {url} did not answer within 0.5 s", "--timeout")


# ------------------------------------------------------------------------------------------------ a real server
@pytest.fixture(scope="module")
def server(stsb, serving, tmp_path_factory):
    pytest.importorskip("pytriton", reason="nvidia-pytriton is not installed (pip install -e .[serve])")
    pytest.importorskip("tritonclient.http", reason="tritonclient is not installed (pip install -e .[serve])")
    with serving.serve_process({"classify": stsb}, ARGS, tmp_path_factory.mktemp("serve") / "serve.log") as srv:
        yield srv


def _exchange(port: int, data: bytes, close: bool = False) -> bytes:
    """Send raw bytes to the guard; its answer (b"" when it had none to give)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        if close:
            return b""
        out = b""  # until the guard closes the connection: these answers all close it
        while chunk := s.recv(65536):
            out += chunk
        return out


def test_binary_data_size_of_another_type_is_a_400_over_http(server):
    head = json.dumps({"inputs": [_binary_input("6")]}).encode()
    port = int(server["http"].rsplit(":", 1)[1])
    req = b"POST /v2/models/classify/infer HTTP/1.1\r\nHost: x\r\nInference-Header-Content-Length: %d\r\n" % len(head)
    body = head + b"\x02\x00\x00\x00hi"
    answer = _exchange(port, req + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
    assert answer.startswith(b"HTTP/1.1 400") and b"binary_data_size" in answer, answer[:300]


def test_broken_http_and_clients_gone_mid_body_are_one_log_line_each(server):
    """Each wrote a traceback of a dozen or more lines to the server's log (aiohttp's parser, or the guard's
    read_body with ConnectionResetError for a client gone mid-body): any client could fill the log with what
    reads like server faults."""
    port = int(server["http"].rsplit(":", 1)[1])
    post = b"POST /v2/models/classify/infer HTTP/1.1\r\nHost: x\r\n"
    for bad in (
        post + b"Content-Length: -1\r\n\r\n{}",
        post + b"Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
        b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 9000 + b"\r\n\r\n",
    ):
        assert _exchange(port, bad).startswith(b"HTTP/1.0 400"), bad[:60]
    for _ in range(3):  # the body is announced, a part sent, and the client hangs up
        _exchange(port, post + b"Content-Length: 500\r\n\r\n" + b'{"inputs": [', close=True)
    time.sleep(0.5)  # the guard notices the closed connections
    status, _ = server["get"](f"{server['base']}/v2/models/classify/ready")
    assert status == 200 and server["proc"].poll() is None
    log = server["log"].read_text(errors="replace")
    assert "Traceback" not in log, log[-3000:]
    lines = [x for x in log.splitlines() if x.startswith("Error handling request")]
    assert len(lines) >= 3 and all("refused; the server goes on" in x for x in lines), lines


def test_predict_jsonl_names_the_line_of_a_refused_row_past_the_first_request(server, tmp_path, capsys):
    """With --batch 2, the blank text on line 5 (the file's fourth row, a blank line before it) was "row 1" of
    the second request: the error pointed at the wrong row."""
    f = tmp_path / "rows.jsonl"
    f.write_text('{"text": "one"}\n\n{"text": "two"}\n{"text": "three"}\n{"text": "  "}\n', encoding="utf-8")
    argv = ["predict", "--task", "classify", "--url", server["http"], "--jsonl", str(f), "--batch", "2"]
    assert main(argv) == 2
    out = capsys.readouterr()
    assert len(out.out.splitlines()) == 2  # the first request's rows were answered and printed
    line = one_line(out.err, f"refused {f} line 5", "'text' is empty")
    assert "row 1" not in line  # the request's row, which is not the file's


def test_predict_a_task_the_server_does_not_serve_says_so(server, capsys):
    argv = ["predict", "--task", "qa", "--question", "q", "--context", "c", "--url", server["http"]]
    assert main(argv) == 2
    one_line(capsys.readouterr().err, "does not serve task qa", "--task qa", "404")
