"""The HTTP guard's checks of an inference request's JSON (`serve.guard.check_infer`): what Triton's front end
would answer with 500 is a 400 here, and every well-formed KServe v2 request passes (flat or nested data)."""

from __future__ import annotations

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
