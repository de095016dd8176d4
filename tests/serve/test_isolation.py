"""One bad request never fails another; client mistakes are one-line 4xx; fill-mask on our own checkpoints.

In-process: the served function answers each request of a call on its own (validation before batching, row by
row re-run when the batched model call fails). Over loopback: a real server under concurrent load with every
tenth request malformed, raw HTTP mistakes (bad JSON, wrong `inputs` type), and fill-mask on a checkpoint that
`bertforge pretrain` wrote (vocab.txt only, positions fewer than 384).
"""

from __future__ import annotations

import gzip
import http.client
import json
import random
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from bertforge.serve.server import ERROR_OUTPUT, make_infer_fn
from bertforge.serve.tasks import Limits, Predictor

TOKEN = "isolation-token"
WORDS = [
    "the",
    "cat",
    "sat",
    "on",
    "a",
    "mat",
    "and",
    "the",
    "dog",
    "ran",
    "to",
    "the",
    "park",
    "while",
    "paris",
    "is",
    "the",
    "capital",
    "of",
    "france",
]


# ------------------------------------------------------------------------------------------------ in-process
def _col(*rows: bytes) -> np.ndarray:
    return np.array([[r] for r in rows], dtype=object)


def _error(resp: dict[str, np.ndarray]) -> str | None:
    return bytes(resp[ERROR_OUTPUT][0]).decode() if ERROR_OUTPUT in resp else None


@pytest.fixture(scope="module")
def classify(head_models):
    return Predictor.from_dir("classify", head_models["classify"], Limits(max_seq_len=64))


def test_a_bad_request_gets_its_own_error_and_the_others_their_answers(classify):
    infer = make_infer_fn(classify)
    reqs = [{"text": _col(b"good one")}, {"text": _col(b"fine", b"  ")}, {}, {"text": _col(b"good two", b"three")}]
    out = infer(reqs)
    assert len(out) == 4
    assert [_error(r) for r in out][0] is None and _error(out[3]) is None
    assert _error(out[1]) == "INVALID_ARG input 'text' row 1 is empty; send non-empty text"
    assert _error(out[2]) == "INVALID_ARG input 'text' is missing"
    want = classify({"text": ["good two", "three"]})
    np.testing.assert_allclose(out[3]["probabilities"], want["probabilities"], atol=1e-5)
    assert out[0]["probabilities"].shape == (1, 3)


def test_a_failing_batched_call_is_rerun_request_by_request(classify, monkeypatch):
    """The model call of the whole batch fails (a row the validation let through): the others are answered."""
    predict = classify.predict

    def fragile(rows):
        if any(len(ids) == 3 for ids, _ in rows):  # [CLS] x [SEP]: the poisoned request's row
            raise RuntimeError("CUDA error: device-side assert triggered\n  at /srv/model.py:12")
        return predict(rows)

    monkeypatch.setattr(classify, "predict", fragile)
    out = make_infer_fn(classify)([{"text": _col(b"a good sentence here")}, {"text": _col(b"x")}])
    assert _error(out[0]) is None and out[0]["label"].shape == (1, 1)
    msg = _error(out[1])
    assert msg is not None and msg.startswith("INTERNAL internal error (RuntimeError: CUDA error")
    assert "\n" not in msg


# ------------------------------------------------------------------------------------- a pre-trained checkpoint
@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> Path:
    """A BERT-tiny that `bertforge pretrain` wrote (a few steps), with the tokenizer files it ships."""
    from bertforge.cli import main

    root = tmp_path_factory.mktemp("pretrained")
    rng = random.Random(0)
    docs = ["\n".join(" ".join(rng.choice(WORDS) for _ in range(12)) + "." for _ in range(6)) for _ in range(40)]
    (root / "corpus.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    d = str(root)
    assert main(["data", "docs", "--source", f"{d}/corpus.txt", "--out", f"{d}/docs", "--shards", "1"]) == 0
    assert main(["data", "vocab", "--docs", f"{d}/docs", "--out", f"{d}/vocab", "--vocab-size", "120"]) == 0
    shards = ["--seq-len", "32", "--max-pred", "5", "--shards", "2", "--workers", "1", "--dupe-factor", "1"]
    assert (
        main(["data", "shards", "--docs", f"{d}/docs", "--vocab", f"{d}/vocab", "--out", f"{d}/shards", *shards]) == 0
    )
    vocab = len((root / "vocab" / "vocab.txt").read_text(encoding="utf-8").splitlines())
    sets = {
        "model.preset": "tiny",
        "model.vocab_size": vocab,
        "model.max_position_embeddings": 64,
        "data.input_dir": f"{d}/shards",
        "data.vocab": f"{d}/vocab/vocab.txt",
        "data.num_workers": 0,
        "data.eval_dir": "null",
        "train.output_dir": f"{d}/run",
        "train.max_steps": 4,
        "train.global_batch_size": 8,
        "train.micro_batch_size": 8,
        "train.precision": "fp32",
        "train.device": "cpu",
        "train.save_every": 4,
        "train.tensorboard": "false",
        "train.plot": "false",
    }
    assert main(["pretrain", *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")]]) == 0
    model = Path(json.loads((root / "run" / "summary.json").read_text())["model_dir"])
    assert {"vocab.txt", "tokenizer.json", "tokenizer_config.json"} <= {f.name for f in model.iterdir()}
    return model


@pytest.mark.parametrize("files", ["as written", "vocab.txt only"])
def test_fill_mask_predictor_on_a_pretrained_checkpoint(pretrained, tmp_path, files):
    """[MASK] stays one token, with the shipped tokenizer files and with a vocab.txt alone (as Google's and
    NVIDIA's checkpoints come); max_seq_len fits the model's 64 positions."""
    model = pretrained
    if files == "vocab.txt only":
        model = tmp_path / "m"
        model.mkdir()
        for name in ("config.json", "model.safetensors", "vocab.txt"):
            shutil.copy2(pretrained / name, model / name)
    p = Predictor.from_dir("fill-mask", model, fit_seq_len=True)
    assert p.limits.max_seq_len == 64
    assert p.tok.encode("paris is the [MASK] .", add_special_tokens=False).tokens[3] == "[MASK]"
    p.warmup(rows=2)  # what `bertforge serve` runs before it reports ready
    out = p({"text": ["paris is the [MASK] of france ."]})
    assert out["tokens"].shape == (1, 1, 5) and all(t for t in out["tokens"].ravel())


# ------------------------------------------------------------------------------------------------ over loopback
@pytest.fixture(scope="module")
def server(head_models, pretrained, serving, tmp_path_factory):
    pytest.importorskip("pytriton", reason="nvidia-pytriton is not installed (pip install -e .[serve])")
    pytest.importorskip("tritonclient.http", reason="tritonclient is not installed (pip install -e .[serve])")
    # no --max-seq-len: 384 for classify, the checkpoint's 64 positions for fill-mask
    args = ["--max-batch", "8", "--max-queue-delay-us", "20000", "--access-token", TOKEN, "--threads", "1"]
    models = {"classify": head_models["classify"], "fill-mask": pretrained}
    with serving.serve_process(models, args, tmp_path_factory.mktemp("serve") / "serve.log") as srv:
        yield srv


def _post(base: str, model: str, body: bytes) -> tuple[int, dict]:
    req = urllib.request.Request(
        f"{base}/v2/models/{model}/infer", data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _infer_json(base: str, model: str, *inputs: dict) -> tuple[int, dict]:
    return _post(base, model, json.dumps({"inputs": list(inputs)}).encode())


def _text(*rows: str, name: str = "text") -> dict:
    return {"name": name, "shape": [len(rows), 1], "datatype": "BYTES", "data": list(rows)}


BAD = [  # (request inputs, words the error must contain)
    ({"name": "text", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}, ["FP32"]),  # wrong type
    ({"name": "text", "shape": [1, 2], "datatype": "BYTES", "data": ["a", "b"]}, ["shape"]),  # wrong shape
    (_text(""), ["empty"]),  # passes Triton's checks: joins a batch
    (_text("fine", "   "), ["row 1", "empty"]),  # one good row, one blank
    (_text("word " * 20000), ["bytes", "--max-request-bytes"]),  # over the request byte limit
]


def _assert_one_line_4xx(status: int, body: dict, words: list[str]) -> None:
    assert 400 <= status < 500, (status, body)
    _assert_one_line(body, words)


def _assert_one_line(body: dict, words: list[str]) -> None:
    msg = body.get("error", "")
    assert msg and "\n" not in msg and "Traceback" not in msg and ".py" not in msg, msg[:500]
    for w in words:
        assert w.lower() in msg.lower(), (w, msg)


def _load(server, n: int) -> None:
    """n classify requests from 8 threads, every tenth malformed: the good answered, the bad a one-line 4xx."""
    stats_url = f"{server['base']}/v2/models/classify/stats"
    before = json.loads(server["get"](stats_url, TOKEN)[1])["model_stats"][0]

    def one(i: int) -> tuple[int, int, dict]:
        if i % 10 == 9:
            inputs, _ = BAD[(i // 10) % len(BAD)]
            return (i, *_infer_json(server["base"], "classify", inputs))
        rows = [f"{' '.join(WORDS[i % 7 : i % 7 + 5])} number {i}"] * (1 + i % 3)
        return (i, *_infer_json(server["base"], "classify", _text(*rows)))

    t0 = time.time()
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(n), timeout=300))
    assert time.time() - t0 < 300
    for i, status, body in results:
        if i % 10 == 9:
            _assert_one_line_4xx(status, body, BAD[(i // 10) % len(BAD)][1])
        else:
            assert status == 200, (i, body)
            probs = next(o for o in body["outputs"] if o["name"] == "probabilities")
            assert probs["shape"] == [1 + i % 3, 3]
    after = json.loads(server["get"](stats_url, TOKEN)[1])["model_stats"][0]
    served = after["inference_count"] - before["inference_count"]
    # dynamic batching was on: fewer model executions than requests that reached the model
    assert after["execution_count"] - before["execution_count"] < served
    assert server["proc"].poll() is None
    assert server["get"](f"{server['base']}/v2/health/ready")[0] == 200
    assert _infer_json(server["base"], "classify", _text("still serving"))[0] == 200


def test_load_300_requests_every_tenth_malformed(server):
    """About 3 s on 2 CPU cores: in the default suite."""
    _load(server, 300)


# Bodies Triton's HTTP front end (C++) would answer with 500 get 400 from the guard in front of it (serve.guard);
# what Triton parses but does not fit is its own 400.
@pytest.mark.parametrize(
    "body, status, words",
    [
        (b'{"inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": ["a"]}', 400, ["json"]),
        (b"not json at all", 400, ["json"]),
        (b'{"inputs": "text"}', 400, ["inputs"]),
        (b'{"inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": [7]}]}', 400, ["strings"]),
        (b'{"inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES"}]}', 400, ["data"]),
        (b'{"inputs": [{"name": "text", "shape": [2, 1], "datatype": "BYTES", "data": ["a"]}]}', 400, ["text"]),
        (b'{"inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": [""]}]}', 400, ["empty"]),
        (json.dumps({"inputs": [_text(*["a"] * 9)]}).encode(), 400, ["batch"]),
    ],
    ids=[
        "truncated json",
        "not json",
        "inputs not a list",
        "number for a string",
        "no data",
        "short data",
        "empty",
        "9 rows",
    ],
)
def test_client_mistakes_get_one_line(server, body, status, words):
    got, answer = _post(server["base"], "classify", body)
    assert got == status, answer
    _assert_one_line(answer, words)
    assert _infer_json(server["base"], "classify", _text("still serving"))[0] == 200


def _raw(base: str, body: bytes | Iterator[bytes], headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    """POST to classify's infer as it comes, chunked when `body` is an iterator: status, headers, body."""
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    try:
        conn.request(
            "POST", "/v2/models/classify/infer", body=body, headers=headers, encode_chunked=not isinstance(body, bytes)
        )
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def test_large_and_form_encoded_bodies_are_refused_and_the_server_stays_up(server):
    """A 5 MB body with curl's default form content type killed Triton 2.51's HTTP front end (SIGSEGV, the
    whole server gone); the guard refuses it, and any body over --max-body-bytes (1 MiB), sent whole, chunked
    or gzipped small, before Triton reads a byte."""
    five_mb = json.dumps({"inputs": [_text("x" * 5_000_000)]}).encode()
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    assert _raw(server["base"], five_mb, form)[0] == 413
    status, _, body = _raw(server["base"], json.dumps({"inputs": [_text("hi")]}).encode(), form)
    assert status == 415 and "application/json" in json.loads(body)["error"]
    chunks = (b"x" * 65536 for _ in range(40))  # 2.6 MB, no Content-Length
    assert _raw(server["base"], chunks, {"Content-Type": "application/json"})[0] == 413
    bomb = gzip.compress(b'{"inputs": [' + b" " * 50_000_000 + b"]}")  # 50 KB that inflates to 50 MB
    gz = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    status, _, body = _raw(server["base"], bomb, gz)
    assert status == 413 and "--max-body-bytes" in json.loads(body)["error"]
    assert server["proc"].poll() is None
    assert _infer_json(server["base"], "classify", _text("still serving"))[0] == 200


def test_compressed_requests_and_answers_pass_as_the_client_asks(server):
    """gzip in (inflated on the way), and an answer compressed only for a client that accepts it."""
    good = json.dumps({"inputs": [_text("a short sentence")]}).encode()
    plain = {"Content-Type": "application/json"}
    status, headers, body = _raw(server["base"], gzip.compress(good), {**plain, "Content-Encoding": "gzip"})
    assert status == 200 and "content-encoding" not in headers and json.loads(body)["outputs"]
    status, headers, body = _raw(server["base"], good, {**plain, "Accept-Encoding": "gzip"})
    assert status == 200 and headers.get("content-encoding") == "gzip" and json.loads(gzip.decompress(body))["outputs"]


def test_fill_mask_served_from_a_pretrained_checkpoint(server):
    status, body = _infer_json(server["base"], "fill_mask", _text("paris is the [MASK] of france ."))
    assert status == 200, body
    tokens = next(o for o in body["outputs"] if o["name"] == "tokens")
    assert tokens["shape"] == [1, 1, 5] and all(tokens["data"])
    # the model has 64 positions: without --max-seq-len the server refuses longer text instead of failing
    status, body = _infer_json(server["base"], "fill_mask", _text("the " * 80 + "[MASK]"))
    _assert_one_line_4xx(status, body, ["64", "--max-seq-len"])
