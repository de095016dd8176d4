"""The HTTP guard's checks of an inference request's JSON (`serve.guard.check_infer`): what Triton's front end
would answer with 500 is a 400 here, and every well-formed KServe v2 request passes (flat or nested data)."""

from __future__ import annotations

import gzip
import json
import urllib.error
import urllib.request
import zlib

import pytest

from bertforge.serve.guard import MAX_DEPTH, Refusal, check_infer, parse_json


def _t(**kw):
    return {"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": ["a"], **kw}


@pytest.mark.parametrize(
    "doc",
    [
        {"inputs": [_t()]},
        {"inputs": [_t(shape=[2, 1], data=[["a"], ["b"]])]},  # nested row by row
        {"inputs": [_t(datatype="FP32", data=[1.5])]},  # numbers where numbers belong: Triton's to check
        {"inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES", "parameters": {"binary_data_size": 5}}]},
        {"inputs": [], "outputs": [{"name": "label"}]},
        {"id": "r1", "inputs": [_t()], "parameters": {"sequence_id": 7, "binary_data_output": True, "custom": 1.5}},
        {
            "inputs": [_t(parameters={"custom": "x"})],
            "outputs": [{"name": "label", "parameters": {"binary_data": False}}],
        },
        {"inputs": [_t(datatype="INT64", data=[-3]), _t(datatype="BOOL", data=[True]), _t(datatype="FOO", data=[{}])]},
    ],
    ids=["flat", "nested", "fp32", "binary", "no inputs", "parameters", "input parameters", "typed data"],
)
def test_well_formed_requests_pass(doc):
    check_infer(doc)  # binary: the data follows the JSON, so there are no strings to check


@pytest.mark.parametrize(
    "doc, words",
    [
        ([1, 2], "JSON object"),
        ({}, "'inputs' must be a list"),
        ({"inputs": "text"}, "'inputs' must be a list"),
        ({"inputs": [1]}, "'inputs' must be a list"),
        ({"inputs": [_t(shape="1,1")]}, "'shape'"),
        ({"inputs": [_t(shape=[-1, 1])]}, "non-negative"),
        ({"inputs": [_t(data=[7])]}, "must be strings"),
        ({"inputs": [_t(shape=[2, 1], data=[["a"], [None]])]}, "must be strings"),
        # each of these Triton 2.51 answered with 500 (measured against a served classify model)
        ({"inputs": [{"name": "text", "shape": [1, 1], "data": ["a"]}]}, "'datatype'"),
        ({"inputs": [_t(datatype=5)]}, "'datatype'"),
        ({"inputs": [{"shape": [1, 1], "datatype": "BYTES", "data": ["a"]}]}, "string 'name'"),
        ({"inputs": [_t(name=5)]}, "string 'name'"),
        ({"id": 5, "inputs": [_t()]}, "'id' must be a string"),
        ({"id": None, "inputs": [_t()]}, "'id' must be a string"),
        ({"inputs": [_t()], "outputs": {"name": "label"}}, "'outputs' must be a list"),
        ({"inputs": [_t()], "outputs": ["label"]}, "'outputs' must be a list"),
        ({"inputs": [_t()], "outputs": [{"name": 3}]}, "'outputs' must be a list"),
        ({"inputs": [_t()], "parameters": [1]}, "the request: 'parameters' must be a JSON object"),
        ({"inputs": [_t(parameters=[1])]}, "input 'text': 'parameters' must be a JSON object"),
        ({"inputs": [_t()], "outputs": [{"name": "label", "parameters": [1]}]}, "output 'label': 'parameters'"),
        ({"inputs": [_t()], "parameters": {"binary_data_output": 1}}, "'binary_data_output' must be true or false"),
        ({"inputs": [_t()], "parameters": {"priority": -1}}, "'priority' must be a non-negative integer"),
        ({"inputs": [_t()], "parameters": {"sequence_id": 1.5}}, "'sequence_id'"),
        ({"inputs": [_t()], "outputs": [{"name": "label", "parameters": {"classification": "1"}}]}, "classification"),
        ({"inputs": [_t(shape=[True, True])]}, "'shape'"),
        ({"inputs": [_t(shape=[2**70, 1])]}, "'shape'"),
        ({"inputs": [_t(data="a")]}, "'data' must be a list"),
        ({"inputs": [_t(datatype="FP32", data=["x"])]}, "FP32: its 'data' must be numbers"),
        ({"inputs": [_t(datatype="FP32", data=[True])]}, "must be numbers"),
        ({"inputs": [_t(datatype="INT64", data=[1.5])]}, "must be integers"),
        ({"inputs": [_t(datatype="INT64", data=[2**70])]}, "must be integers"),
        ({"inputs": [_t(datatype="UINT8", data=[-1])]}, "must be non-negative integers"),
        ({"inputs": [_t(datatype="BOOL", data=[1])]}, "must be true or false"),
        ({"inputs": [_t()], "x": json.loads("[" * MAX_DEPTH + "]" * MAX_DEPTH)}, "nests more than"),
        # Triton 2.51 crashed on this one (every model of the server gone), and answered 500 on the next two
        ({"inputs": [_t()], "outputs": [{"name": "label", "parameters": {"classification": 1}}]}, "holds strings"),
        ({"inputs": [_t(parameters={"shared_memory_byte_size": "4"})]}, "'shared_memory_byte_size' must be a non"),
        ({"inputs": [_t()], "outputs": [{"name": "label", "parameters": {"shared_memory_region": 3}}]}, "a string"),
    ],
    ids=["list", "no inputs", "inputs a string", "input a number", "shape a string", "negative dim", "number",
         "nested null", "no datatype", "datatype a number", "no name", "name a number", "id a number", "id null",
         "outputs an object", "outputs strings", "output name a number", "parameters a list",
         "input parameters a list", "output parameters a list", "binary_data_output 1", "priority -1",
         "sequence_id 1.5", "classification a string", "shape booleans", "shape over uint64", "data a string",
         "fp32 strings", "fp32 bool", "int64 float", "int64 over int64", "uint8 negative", "bool 1", "too deep",
         "classification of strings", "shared memory size a string", "shared memory region a number"],
)  # fmt: skip
def test_what_triton_would_answer_with_500_is_a_one_line_400(doc, words):
    with pytest.raises(Refusal, match=words) as e:
        check_infer(doc)
    assert e.value.status == 400 and "\n" not in str(e.value)


def _body(doc) -> bytes:
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    "body, words",
    [
        (_body({"inputs": [_t()]}).decode().encode("utf-16"), "not UTF-8"),  # json.loads would take it; Triton not
        (_body({"inputs": [_t()]}).decode().encode("utf-32"), "not UTF-8"),
        (_body({"inputs": [_t(data=["\ud800"])]}), "unpaired UTF-16 surrogate"),
        (_body({"inputs": [_t()], "parameters": {"\udc00": 1}}), "unpaired UTF-16 surrogate"),  # in a key
        (b"[" * 100_000 + b"]" * 100_000, "nests more than"),
        (_body({"inputs": [_t(data="X")]}).replace(b'"X"', b"[" * 5000 + b'"a"' + b"]" * 5000), "nests more than"),
        (b"{not json", "not valid JSON"),
    ],
    ids=["utf-16", "utf-32", "lone surrogate", "surrogate key", "100000 deep", "5000 deep in data", "not json"],
)
def test_bodies_triton_cannot_parse_are_one_line_400s(body, words):
    with pytest.raises(Refusal, match=words) as e:
        check_infer(parse_json(body))
    assert e.value.status == 400 and "\n" not in str(e.value) and len(str(e.value)) < 300


def test_parse_json_takes_what_triton_takes():
    doc = {"inputs": [_t(data=["caf\u00e9 \U0001f600"])]}  # a surrogate pair escaped by json.dumps: valid
    assert parse_json(_body(doc)) == doc
    assert parse_json(b"\xef\xbb\xbf" + _body(doc)) == doc  # a UTF-8 byte-order mark: Triton accepts it
    rank = MAX_DEPTH - 3  # the request object, its inputs and the tensor hold the data: MAX_DEPTH in all
    nested = {"inputs": [_t(shape=[1] * rank, data=json.loads("[" * rank + '"a"' + "]" * rank))]}
    check_infer(parse_json(_body(nested)))
    with pytest.raises(Refusal, match="nests more than"):
        check_infer({"inputs": [_t(data=[nested["inputs"][0]["data"]])]})


def _post(port: int, body: bytes | None, headers: dict[str, str]) -> tuple[int, str]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/classify/infer", data=body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())["error"]
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())["error"]


@pytest.fixture
def lone_guard():
    """A guard on a free loopback port whose Triton is not there: what passes its checks gets a 502."""
    pytest.importorskip("aiohttp")
    from bertforge.serve.guard import HttpGuard
    from bertforge.serve.server import free_ports

    port, upstream = free_ports(2)
    guard = HttpGuard("127.0.0.1", port, upstream, max_body_bytes=4096)
    try:
        yield port
    finally:
        guard.stop()


def test_compressed_bodies_are_inflated_or_refused_in_one_line(lone_guard):
    """aiohttp's own decompression answered a body that does not inflate with its HTML 500 page, and took br or
    zstd only where optional packages were installed; the guard inflates gzip and deflate itself."""
    good = _body({"inputs": [_t()]})
    raw_deflate = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    cases = [
        ("gzip", gzip.compress(good), 502),  # passed the checks; no Triton behind
        ("deflate", zlib.compress(good), 502),
        ("deflate", raw_deflate.compress(good) + raw_deflate.flush(), 502),  # raw deflate, as some clients send
        ("GZIP", gzip.compress(good), 502),
        ("identity", good, 502),
        ("gzip", b"not gzip at all", 400),
        ("deflate", b"not deflate", 400),
        ("gzip", gzip.compress(good)[:-12], 400),  # cut short
        ("gzip", gzip.compress(good) + b"junk", 400),  # bytes after the stream
        ("gzip", gzip.compress(b"{" * 5000), 413),  # inflates past --max-body-bytes
        ("br", b"xx", 415),
        ("zstd", b"xx", 415),
        ("gzip, deflate", gzip.compress(good), 415),
    ]
    for encoding, body, status in cases:
        got, msg = _post(lone_guard, body, {"Content-Type": "application/json", "Content-Encoding": encoding})
        assert got == status and "\n" not in msg, (encoding, body[:20], got, msg)
        if status in (400, 415):
            assert encoding.split(",")[0].lower() in msg, msg


def test_the_guard_alone_refuses_before_and_answers_502_when_triton_is_gone(lone_guard):
    """A guard whose Triton is not there (nothing listens upstream): client mistakes still get their 4xx, and
    what reaches the missing server gets a one-line 502 rather than aiohttp's error page."""
    json_type = {"Content-Type": "application/json"}
    assert _post(lone_guard, b"x" * 5000, json_type)[0] == 413
    assert _post(lone_guard, b"a=b", {"Content-Type": "application/x-www-form-urlencoded"})[0] == 415
    assert _post(lone_guard, b"{not json", json_type)[0] == 400
    status, msg = _post(lone_guard, _body({"inputs": [_t()]}), json_type)
    assert status == 502 and "not answering" in msg and "\n" not in msg
