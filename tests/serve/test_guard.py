"""The HTTP guard's checks of an inference request's JSON (`serve.guard.check_infer`): what Triton's front end
would answer with 500 is a 400 here, and every well-formed KServe v2 request passes (flat or nested data)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from bertforge.serve.guard import Refusal, check_infer


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
    ],
    ids=["flat", "nested", "fp32", "binary", "no inputs"],
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
    ],
    ids=["list", "no inputs", "inputs a string", "input a number", "shape a string", "negative dim", "number",
         "nested null"],
)  # fmt: skip
def test_what_triton_would_answer_with_500_is_a_one_line_400(doc, words):
    with pytest.raises(Refusal, match=words) as e:
        check_infer(doc)
    assert e.value.status == 400 and "\n" not in str(e.value)


def test_the_guard_alone_refuses_before_and_answers_502_when_triton_is_gone():
    """A guard whose Triton is not there (nothing listens upstream): client mistakes still get their 4xx, and
    what reaches the missing server gets a one-line 502 rather than aiohttp's error page."""
    pytest.importorskip("aiohttp")
    from bertforge.serve.guard import HttpGuard
    from bertforge.serve.server import free_ports

    port, upstream = free_ports(2)
    guard = HttpGuard("127.0.0.1", port, upstream, max_body_bytes=4096)
    try:

        def call(body: bytes | None, ctype: str = "application/json") -> tuple[int, str]:
            req = urllib.request.Request(
                f"http://127.0.0.1:{port}/v2/models/classify/infer", data=body, headers={"Content-Type": ctype}
            )
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    return r.status, json.loads(r.read())["error"]
            except urllib.error.HTTPError as e:
                return e.code, json.loads(e.read())["error"]

        assert call(b"x" * 5000)[0] == 413
        assert call(b"a=b", "application/x-www-form-urlencoded")[0] == 415
        assert call(b"{not json")[0] == 400
        status, msg = call(json.dumps({"inputs": [_t()]}).encode())
        assert status == 502 and "not answering" in msg and "\n" not in msg
    finally:
        guard.stop()
