"""A regression model (STS-B's kind) served as `classify`, and `bertforge predict` against it: a real Triton server
on loopback ports (one model, small limits, no warm-up), a few requests."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("pytriton", reason="nvidia-pytriton is not installed (pip install -e .[serve])")
pytest.importorskip("tritonclient.http", reason="tritonclient is not installed (pip install -e .[serve])")

from bertforge.cli import main  # noqa: E402
from bertforge.serve.client import Client  # noqa: E402
from bertforge.serve.tasks import Limits, Predictor  # noqa: E402

TEXTS = ["A man plays a guitar.", "A cat sleeps."]
PAIRS = ["Someone plays music.", "A dog runs in a park."]


@pytest.fixture(scope="module")
def server(stsb, serving, tmp_path_factory):
    args = ["--max-batch", "4", "--max-seq-len", "64", "--threads", "1", "--no-warmup"]
    with serving.serve_process({"classify": stsb}, args, tmp_path_factory.mktemp("serve") / "serve.log") as srv:
        yield srv


@pytest.fixture(scope="module")
def local(stsb):
    return Predictor.from_dir("classify", stsb, Limits(max_seq_len=64))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_regression_model_answers_its_score_over_both_protocols(server, local, protocol):
    """Served as a classifier it answered softmax over one logit, 1.0 for every row, with status 200."""
    with Client(server[protocol], protocol) as c:
        assert [o["name"] for o in c.metadata("classify")["outputs"]] == ["score"]
        got = c.infer("classify", text=TEXTS, text_pair=PAIRS)
    want = local({"text": TEXTS, "text_pair": PAIRS})
    assert set(got) == {"score"} and got["score"].shape == (2, 1)
    np.testing.assert_allclose(got["score"], want["score"], atol=1e-4)


def test_predict_jsonl_with_text_pair_on_some_rows(server, local, tmp_path, capsys):
    """Only some rows with text_pair: the columns went out of step and the server refused valid input (400)."""
    rows = [{"text": TEXTS[0], "text_pair": PAIRS[0]}, {"text": TEXTS[1], "id": 7}]
    f = tmp_path / "rows.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n", encoding="utf-8")
    assert main(["predict", "--task", "classify", "--url", server["http"], "--jsonl", str(f)]) == 0
    got = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [set(r) for r in got] == [{"score"}, {"score"}]
    pair = local({"text": TEXTS[:1], "text_pair": PAIRS[:1]})["score"][0, 0]
    alone = local({"text": TEXTS[1:]})["score"][0, 0]  # the row without text_pair is scored alone
    np.testing.assert_allclose([got[0]["score"], got[1]["score"]], [pair, alone], atol=1e-4)


def test_predict_sends_a_long_jsonl_in_requests_the_server_takes(server, local, tmp_path, capsys):
    """All rows went out as one request: any file longer than the server's --max-batch (4 here, 16 by default)
    was refused with a 400. Now --batch rows go per request, in order; too many is refused with the hint."""
    texts = [f"Row number {i} of the file." for i in range(10)]
    f = tmp_path / "rows.jsonl"
    f.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    argv = ["predict", "--task", "classify", "--url", server["http"], "--jsonl", str(f)]
    assert main([*argv, "--batch", "4"]) == 0
    got = [json.loads(line)["score"] for line in capsys.readouterr().out.splitlines()]
    np.testing.assert_allclose(got, local({"text": texts})["score"][:, 0], atol=1e-4)
    assert main([*argv, "--batch", "10"]) == 2
    err = capsys.readouterr().err
    assert "--batch" in err and len(err.strip().splitlines()) == 1


def test_predict_over_http_against_the_grpc_port_is_one_line(server, capsys):
    assert main(["predict", "--task", "classify", "--text", "hi", "--url", server["grpc"]]) == 2
    err = capsys.readouterr().err
    assert "does not answer HTTP" in err and "--grpc" in err and len(err.strip().splitlines()) == 1
