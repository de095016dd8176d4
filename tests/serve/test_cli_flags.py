"""Errors of `bertforge export` and `bertforge serve` name the command-line flag that fixes them, not a Python
keyword argument, on one line."""

from __future__ import annotations

import re

import pytest
from tests.helpers import one_line

from bertforge.cli import main

SERVE = ["serve", "--task", "embed", "--no-warmup"]


@pytest.mark.parametrize(
    "args, flag",
    [
        (["export", "--format", "hf", "--task", "qa"], "--init-head"),  # the encoder has no QA head
        ([*SERVE, "--max-batch", "0"], "--max-batch"),
        ([*SERVE, "--instances", "0"], "--instances"),
        ([*SERVE, "--max-queue-delay-us", "-1"], "--max-queue-delay-us"),
        ([*SERVE, "--max-seq-len", "4"], "--max-seq-len"),
        ([*SERVE, "--max-seq-len", "1024"], "--max-seq-len 512"),  # over the model's 512 positions
        ([*SERVE, "--max-request-bytes", "0"], "--max-request-bytes"),
        ([*SERVE, "--doc-stride", "0"], "--doc-stride must be at least 1, not 0"),  # hung on a long QA context
        ([*SERVE, "--doc-stride", "-5"], "--doc-stride"),
        ([*SERVE, "--top-k", "0"], "--top-k must be at least 1"),  # answered nothing
        ([*SERVE, "--top-k", "-1"], "--top-k"),
        ([*SERVE, "--threads", "0"], "--threads must be at least 1, not 0"),
        ([*SERVE, "--threads", "-1"], "--threads"),
        ([*SERVE, "--http-port", "0"], "--http-port must be at least 1, not 0"),
        ([*SERVE, "--grpc-port", "70000"], "--grpc-port must be between 1 and 65535, not 70000"),
        ([*SERVE, "--metrics-port", "-1"], "--metrics-port"),
    ],
    ids=["init-head", "max-batch", "instances", "queue-delay", "seq-len-small", "seq-len-large", "request-bytes",
         "doc-stride-0", "doc-stride-negative", "top-k-0", "top-k-negative", "threads-0", "threads-negative",
         "http-port-0", "grpc-port-large", "metrics-port-negative"],
)  # fmt: skip
def test_errors_name_the_flag(encoder_dir, tmp_path, capsys, args, flag):
    argv = [*args, "--model", str(encoder_dir)] + (["--out", str(tmp_path / "out")] if args[0] == "export" else [])
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert flag in err and len(err.splitlines()) == 1, err
    assert not re.search(r"(?<![.\w])[a-z]+_[a-z_]+=", err.replace("in Python: allow_missing_head=", "")), err


@pytest.mark.parametrize("flag", ["--http-port", "--grpc-port", "--metrics-port"])
def test_a_port_in_use_is_refused_before_any_model_loads(tmp_path, capsys, flag):
    """A taken port was Triton's timeout traceback (gRPC, metrics) or the guard's OSError (HTTP), after the models
    had loaded. The model here does not exist: the port is refused first."""
    from bertforge.serve.server import free_ports, listening

    http, grpc, metrics = free_ports(3)
    ports = {"--http-port": http, "--grpc-port": grpc, "--metrics-port": metrics}
    with listening("127.0.0.1", ports[flag]):
        argv = ["serve", "--task", "embed", "--model", str(tmp_path / "no-model"), "--host", "127.0.0.1"]
        assert main([*argv, *(str(x) for kv in ports.items() for x in kv)]) == 2
    one_line(capsys.readouterr().err, flag, ports[flag], "cannot listen")


def test_one_port_for_two_endpoints_is_refused(tmp_path, capsys):
    from bertforge.serve.server import free_ports

    (port,) = free_ports(1)
    argv = ["serve", "--task", "embed", "--model", str(tmp_path / "no-model"), "--http-port", str(port)]
    assert main([*argv, "--grpc-port", str(port)]) == 2
    one_line(capsys.readouterr().err, f"--grpc-port {port} is also --http-port")


def _jsonl(tmp_path, content: bytes):
    f = tmp_path / "rows.jsonl"
    f.write_bytes(content)
    return f


@pytest.mark.parametrize(
    "task, content, words",
    [
        ("classify", None, ["cannot read it", "No such file"]),
        ("classify", b'{"text": "fine"}\n{"text": "caf\xe9"}\n', ["line 2: not UTF-8"]),
        ("classify", b'{"text": "fine"}\n[1, 2]\n', ["line 2: expected a JSON object with 'text'"]),
        ("classify", b'"just text"\n', ["line 1: expected a JSON object"]),
        ("classify", b"{not json\n", ["line 1: not JSON"]),
        ("qa", b'{"question": "q", "context": "c"}\n\n{"question": "who?"}\n', ["line 3: no 'context'", "task qa"]),
        ("classify", b'{"text": null}\n', ["line 1: 'text' must be a string", "null"]),
        ("classify", b'{"text": ["a", "b"]}\n', ["line 1: 'text' must be a string", '["a", "b"]']),
        ("classify", b'{"text": "ok", "text_pair": 5}\n', ["line 1: 'text_pair' must be a string"]),
        ("classify", b'{"text": "\\ud800"}\n', ["line 1: 'text' must be a string of text"]),  # lone surrogate
        ("classify", b"\n  \n", ["holds no rows"]),
    ],
    ids=["missing", "not utf-8", "a list", "a string", "not json", "no context", "null", "list value", "number",
         "surrogate", "empty"],
)  # fmt: skip
def test_predict_jsonl_mistakes_are_one_line_naming_file_and_line(tmp_path, capsys, task, content, words):
    """Each was a traceback (FileNotFoundError, UnicodeDecodeError, TypeError, UnicodeEncodeError) or sent "None" /
    a list's repr to the server as text. No server is needed: the file is refused before any request."""
    f = tmp_path / "absent.jsonl" if content is None else _jsonl(tmp_path, content)
    assert main(["predict", "--task", task, "--url", "127.0.0.1:1", "--jsonl", str(f)]) == 2
    one_line(capsys.readouterr().err, f, *words)


def test_predict_jsonl_fills_a_missing_optional_input_so_columns_stay_in_step(tmp_path):
    """Rows where only some have text_pair gave columns of different lengths, which the server refused (400)."""
    from bertforge.serve.cli import read_jsonl

    f = _jsonl(tmp_path, b'{"text": "a", "id": 1}\n{"text": "b", "text_pair": "c"}\n{"text": "d"}\n')
    assert read_jsonl(str(f), "classify")[0] == {"text": ["a", "b", "d"], "text_pair": ["", "c", ""]}
    f = _jsonl(tmp_path, b'{"text": "a"}\n{"text": "b"}\n')
    assert read_jsonl(str(f), "classify")[0] == {"text": ["a", "b"]}  # no row has one: no column


@pytest.mark.parametrize(
    "url, grpc",
    [("nohost:abc", False), ("127.0.0.1", False), ("localhost:70000", False), (":8000", False), ("h:8001/x", True)],
)
def test_predict_url_not_host_port_is_one_line(capsys, url, grpc):
    """ "nohost:abc" was tritonclient's ValueError and then an AttributeError from its __del__."""
    args = ["predict", "--task", "classify", "--text", "fine", "--url", url] + (["--grpc"] if grpc else [])
    assert main(args) == 2
    one_line(capsys.readouterr().err, f"--url {url!r}", "host:port")


def test_server_addresses_tritonclient_takes_pass_the_url_check():
    from bertforge.serve.client import check_url

    for url in ("127.0.0.1:8000", "localhost:1", "[::1]:8001", "my-host.example:65535", "h:8000/base/path"):
        check_url(url, "http")
    check_url("[::1]:8001", "grpc")


@pytest.mark.parametrize("timeout", ["-1", "0", "nan"])
def test_predict_timeout_out_of_range_is_one_line(capsys, timeout):
    """-1 was urllib3's traceback ("Timeout value out of range"); 0 a misleading "cannot reach a server"."""
    assert main(["predict", "--task", "classify", "--text", "fine", "--timeout", timeout]) == 2
    one_line(capsys.readouterr().err, "--timeout", "> 0")


@pytest.mark.parametrize("tolerance", ["-1", "0", "nan"])
def test_export_onnx_tolerance_out_of_range_is_refused_before_exporting(tmp_path, capsys, tolerance):
    """It was refused only after a whole export, as "differs from PyTorch by 7.15e-07 (> -1.0)"."""
    argv = ["export", "--model", str(tmp_path / "nomodel"), "--format", "onnx", "--task", "embed"]
    assert main([*argv, "--out", str(tmp_path / "o"), "--tolerance", tolerance]) == 2
    one_line(capsys.readouterr().err, "--tolerance", "> 0")
    assert not (tmp_path / "o").exists()
