"""A real Triton server (`bertforge serve` in a subprocess, all three models) on loopback ports.

Answers over HTTP and gRPC are checked against the same models run in-process; each malformed request gets an
error that says what is wrong and the server keeps serving; a bounded load test at concurrency 8 has no failures.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

pytest.importorskip("pytriton", reason="nvidia-pytriton is not installed (pip install -e .[serve])")
pytest.importorskip("tritonclient.http", reason="tritonclient is not installed (pip install -e .[serve])")

from tritonclient.utils import InferenceServerException  # noqa: E402

from bertforge.serve.client import Client, server_message  # noqa: E402
from bertforge.serve.tasks import Limits, Predictor  # noqa: E402

TOKEN = "test-token-123"
MAX_BATCH = 8
MAX_BYTES = 16384
CONTEXT = (
    "The Amazon river flows through Brazil, Peru and Colombia. It carries more water than any other river. "
    "Its basin covers about seven million square kilometres, and the forest around it is the largest "
    "tropical rainforest on Earth. "
)


@pytest.fixture(scope="module")
def server(head_models, serving, tmp_path_factory):
    args = ["--max-batch", str(MAX_BATCH), "--max-queue-delay-us", "5000", "--max-request-bytes", str(MAX_BYTES)]
    args += ["--max-seq-len", "128", "--doc-stride", "64", "--access-token", TOKEN, "--threads", "1"]
    with serving.serve_process(head_models, args, tmp_path_factory.mktemp("serve") / "serve.log") as srv:
        yield srv


@pytest.fixture(scope="module")
def local(head_models):
    """The same models in-process, with the server's limits."""
    lim = Limits(max_seq_len=128, doc_stride=64, max_request_bytes=MAX_BYTES)
    return {t: Predictor.from_dir(t, d, lim) for t, d in head_models.items()}


def test_health_ready_metrics_and_model_metadata(server):
    assert server["get"](f"{server['base']}/v2/health/live")[0] == 200
    assert server["get"](f"{server['base']}/v2/health/ready")[0] == 200
    for name in ("qa", "classify", "fill_mask"):
        assert server["get"](f"{server['base']}/v2/models/{name}/ready")[0] == 200
    status, body = server["get"](f"{server['base']}/v2/models/qa")
    md = json.loads(body)
    assert [i["name"] for i in md["inputs"]] == ["question", "context"]
    assert [o["name"] for o in md["outputs"]] == ["answer", "score"]
    assert all(i["datatype"] == "BYTES" for i in md["inputs"])
    with Client(server["grpc"], "grpc") as c:
        md = c.metadata("classify")
        assert [i["name"] for i in md["inputs"]] == ["text", "text_pair"]
        assert [o["name"] for o in md["outputs"]] == ["label", "label_id", "probabilities"]
        assert [o["name"] for o in c.metadata("fill_mask")["outputs"]] == ["tokens", "token_ids", "scores"]
    status, body = server["get"](f"http://{server['metrics']}/metrics")
    assert status == 200 and b"nv_inference_request_success" in body


def test_restricted_endpoints_need_the_token(server):
    assert server["get"](f"{server['base']}/v2/models/stats")[0] in (401, 403)
    status, body = server["get"](f"{server['base']}/v2/models/stats", TOKEN)
    assert status == 200 and b"model_stats" in body


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_answers_match_in_process(server, local, protocol):
    long_context = CONTEXT * 6  # several 128-token windows
    with Client(server[protocol], protocol) as c:
        q = {
            "question": ["Which countries does the Amazon flow through?", "What covers the basin?"],
            "context": [CONTEXT, long_context],
        }
        got, want = c.infer("qa", **q), local["qa"](q)
        assert got["answer"].tolist() == want["answer"].tolist()
        assert all(a[0].decode() in ctx for a, ctx in zip(got["answer"], q["context"]))
        np.testing.assert_allclose(got["score"], want["score"], atol=1e-4)

        for cl in (
            {"text": ["a lovely, moving film", "dull"]},
            {"text": ["The cat sat.", "It rains."], "text_pair": ["A cat was sitting.", "The sun shines."]},
        ):
            got, want = c.infer("classify", **cl), local["classify"](cl)
            assert got["label"].tolist() == want["label"].tolist()
            np.testing.assert_allclose(got["probabilities"], want["probabilities"], atol=1e-5)
            assert got["probabilities"].shape == (2, 3)

        fm = {"text": ["the capital of france is [MASK].", "[MASK] is a [MASK] of [MASK]."]}
        got, want = c.infer("fill-mask", **fm), local["fill-mask"](fm)
        assert got["tokens"].shape == (2, 3, 5)  # padded to the request's most masks (3), top-5
        assert got["token_ids"].tolist() == want["token_ids"].tolist()
        assert got["token_ids"][0, 1:].tolist() == [[-1] * 5] * 2  # row 0 has one mask: the rest is padding
        np.testing.assert_allclose(got["scores"], want["scores"], atol=1e-5)


def _bytes_col(*rows) -> np.ndarray:
    return np.array([[r] for r in rows], dtype=object)


MALFORMED = {
    # name: (model, arrays, datatypes, words the error must contain)
    "wrong input name": ("classify", {"sentence": _bytes_col(b"hi")}, None, ["sentence"]),
    "wrong dtype": ("classify", {"text": np.array([[1.0]], np.float32)}, None, ["FP32"]),
    "wrong shape": ("classify", {"text": np.array([[b"a", b"b"]], dtype=object)}, None, ["shape"]),
    "empty string": ("classify", {"text": _bytes_col(b"fine", b"   ")}, None, ["row 1", "empty"]),
    "non-UTF-8": (
        "qa",
        {"question": _bytes_col(b"who?"), "context": _bytes_col(b"caf\xe9 \xff")},
        None,
        ["context", "UTF-8"],
    ),
    "1 MB context": (
        "qa",
        # 1.0 MB: under the HTTP guard's 1 MiB body limit, so the served function's own byte limit answers
        {"question": _bytes_col(b"what?"), "context": _bytes_col(b"word " * 200_000)},
        None,
        ["bytes", str(MAX_BYTES)],
    ),
    "batch over the limit": ("classify", {"text": _bytes_col(*[b"x"] * (MAX_BATCH + 1))}, None, ["batch"]),
    "no [MASK]": ("fill_mask", {"text": _bytes_col(b"nothing to fill")}, None, ["[MASK]"]),
    "missing input": ("qa", {"question": _bytes_col(b"who?")}, None, ["context"]),
}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_malformed_requests_get_errors_and_server_keeps_serving(server, protocol):
    with Client(server[protocol], protocol) as c:
        for what, (model, arrays, dtypes, words) in MALFORMED.items():
            with pytest.raises(InferenceServerException) as err:
                c.infer_raw(model, arrays, dtypes)
            msg = server_message(err.value) + " " + str(err.value)
            for w in words:
                assert w.lower() in msg.lower(), f"{what}: {w!r} not in the error: {msg[:500]}"
        out = c.infer("classify", text=["still serving"])
        assert out["probabilities"].shape == (1, 3)
    assert server["proc"].poll() is None


def test_load_concurrency_8_no_failures(server):
    """64 requests (classify and qa, 1-3 rows each) from 8 threads, loopback, bounded in time."""
    jobs = [
        ("classify", {"text": [f"sentence number {i}"] * (1 + i % 3)})
        if i % 2
        else ("qa", {"question": [f"what is {i}?"], "context": [CONTEXT]})
        for i in range(64)
    ]

    def run(job):
        task, cols = job
        with Client(server["http"], "http", timeout_s=120) as c:
            return len(next(iter(c.infer(task, **cols).values())))

    t0 = time.time()
    with ThreadPoolExecutor(8) as pool:
        rows = list(pool.map(run, jobs, timeout=300))
    assert rows == [len(next(iter(cols.values()))) for _, cols in jobs]
    assert time.time() - t0 < 300
    # dynamic batching was active: Triton ran fewer model executions than it served requests
    stats = json.loads(server["get"](f"{server['base']}/v2/models/classify/stats", TOKEN)[1])["model_stats"][0]
    assert stats["inference_count"] >= 64 and stats["execution_count"] < stats["inference_count"]


def test_predict_cli(server, capsys):
    from bertforge.cli import main

    assert main(["predict", "--task", "classify", "--url", server["http"], "--text", "good", "--text", "bad"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 2 and len(rows[0]["probabilities"]) == 3
    assert main(["predict", "--task", "fill-mask", "--url", server["grpc"], "--grpc", "--text", "no mask"]) == 2
    assert "[MASK]" in capsys.readouterr().err
