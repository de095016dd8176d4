"""Serving audit 3: a client's gRPC request for the classification of a string output crashed Triton (every model)
and left its Python-backend stub running after `bertforge serve` had exited; the gRPC guard refuses it, and every
way `serve` ends now ends what Triton left running."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

psutil = pytest.importorskip("psutil")


def _classification_request(output: str):
    """A gRPC ModelInferRequest of one classify row asking for the classification extension on `output`."""
    from tritonclient.grpc import service_pb2

    req = service_pb2.ModelInferRequest(model_name="classify")
    t = req.inputs.add(name="text", datatype="BYTES", shape=[1, 1])
    t.contents.bytes_contents.append(b"a fine film")
    o = req.outputs.add(name=output)
    o.parameters["classification"].int64_param = 2
    return req


def test_grpc_refusal_names_string_outputs_only():
    pytest.importorskip("tritonclient.grpc", reason="tritonclient is not installed (pip install -e .[serve])")
    from bertforge.serve.guard import grpc_refusal

    infer = "/inference.GRPCInferenceService/ModelInfer"
    msg = grpc_refusal(infer, _classification_request("label").SerializeToString())
    assert msg is not None and "'label'" in msg and "numeric output" in msg
    assert grpc_refusal(infer, _classification_request("probabilities").SerializeToString()) is None
    assert grpc_refusal("/inference.GRPCInferenceService/ModelMetadata", b"classification label") is None
    assert grpc_refusal(infer, b"\xffclassification not protobuf") is None  # Triton's to refuse


def _grpc_input():
    import tritonclient.grpc as g

    inp = g.InferInput("text", [1, 1], "BYTES")
    inp.set_data_from_numpy(np.array([[b"a fine film"]], dtype=object))
    return inp


ARGS = ["--max-batch", "4", "--max-seq-len", "32", "--threads", "1", "--no-warmup"]


def test_grpc_classification_of_a_string_output_is_a_400_and_the_server_keeps_serving(head_models, serving, tmp_path):
    """Over gRPC (which bypassed the HTTP guard) Triton 2.51 crashed on it, taking every model of the server."""
    pytest.importorskip("pytriton", reason="nvidia-pytriton is not installed (pip install -e .[serve])")
    g = pytest.importorskip("tritonclient.grpc", reason="tritonclient is not installed (pip install -e .[serve])")
    from tritonclient.utils import InferenceServerException

    from bertforge.serve.client import Client

    models = {"classify": head_models["classify"]}
    args = [*ARGS, "--access-token", "tok3", "--max-queue-delay-us", "20000"]
    with serving.serve_process(models, args, tmp_path / "serve.log") as srv:
        c = g.InferenceServerClient(srv["grpc"])
        try:
            with pytest.raises(InferenceServerException) as err:
                c.infer("classify", [_grpc_input()], outputs=[g.InferRequestedOutput("label", class_count=2)])
            assert err.value.status() == "StatusCode.INVALID_ARGUMENT", str(err.value)
            assert "'label' holds strings" in str(err.value)
            # a numeric output's classification is Triton's, and passes
            res = c.infer("classify", [_grpc_input()], outputs=[g.InferRequestedOutput("probabilities", class_count=2)])
            assert res.as_numpy("probabilities").shape == (1, 2)
            # the same on a stream, and the restricted endpoints still take their token through the guard
            answers: queue.Queue = queue.Queue()
            c.start_stream(callback=lambda result, error: answers.put((result, error)))
            c.async_stream_infer("classify", [_grpc_input()], outputs=[g.InferRequestedOutput("tokens", 1)])
            result, error = answers.get(timeout=60)
            c.stop_stream()
            assert result is None and "'tokens' holds strings" in str(error)
            stats = c.get_inference_statistics("classify", headers={"triton-grpc-protocol-triton-access-token": "tok3"})
            assert stats.model_stats[0].name == "classify"
        finally:
            c.close()
        with Client(srv["grpc"], "grpc") as client:
            assert client.infer("classify", text=["still serving"])["probabilities"].shape == (1, 3)

        def one(i: int) -> int:  # concurrent clients through the guard: Triton still batches them
            with Client(srv["grpc"], "grpc", timeout_s=120) as client:
                return len(client.infer("classify", text=[f"sentence {i}"] * (1 + i % 2))["label"])

        with ThreadPoolExecutor(8) as pool:
            assert list(pool.map(one, range(48), timeout=300)) == [1 + i % 2 for i in range(48)]
        stats = srv["get"](f"{srv['base']}/v2/models/classify/stats", "tok3")[1]
        counts = json.loads(stats)["model_stats"][0]
        assert counts["execution_count"] < counts["inference_count"], counts
        assert srv["proc"].poll() is None


def _tree(pid: int) -> list:
    return [p for p in psutil.Process(pid).children(recursive=True) if p.is_running()]


def test_a_triton_crash_leaves_no_stub_running(head_models, serving, tmp_path):
    """Without the gRPC guard the crash still happens: `serve` exits 1, and the stub that waited for the crashed
    Triton's answer (it did for ever, reparented to init, holding its shared memory) is ended with it."""
    pytest.importorskip("pytriton", reason="nvidia-pytriton is not installed (pip install -e .[serve])")
    g = pytest.importorskip("tritonclient.grpc", reason="tritonclient is not installed (pip install -e .[serve])")

    models = {"classify": head_models["classify"]}
    with serving.serve_process(models, [*ARGS, "--no-grpc-guard"], tmp_path / "serve.log") as srv:
        procs = _tree(srv["proc"].pid)
        assert any(p.name() == "triton_python_backend_stub" for p in procs)
        c = g.InferenceServerClient(srv["grpc"])
        try:
            with pytest.raises(Exception):  # noqa: B017, PT011 - the connection drops as Triton dies
                c.infer("classify", [_grpc_input()], outputs=[g.InferRequestedOutput("label", class_count=2)])
        finally:
            c.close()
        assert srv["proc"].wait(timeout=60) == 1
        regions = list(Path("/dev/shm").glob(f"pytrtion{srv['proc'].pid}-*"))
    _, left = psutil.wait_procs(procs, timeout=10)
    for p in left:  # not ours to leave behind either way
        p.kill()
    assert [p.name() for p in left] == []
    assert regions == []  # the stub's shared memory, which the crashed Triton did not remove


def _fake_triton_tree(tmp_path: Path, region: str) -> tuple[subprocess.Popen, int]:
    """A process named tritonserver with a child that outlives it, as a stub did (its command line names its
    shared-memory region, as a stub's does)."""
    exe = tmp_path / "tritonserver"
    exe.symlink_to(sys.executable)
    script = (
        "import subprocess, sys, time;"
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', {region!r}]);"
        "print(p.pid, flush=True); time.sleep(120)"
    )
    proc = subprocess.Popen([str(exe), "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_stop_ends_what_a_crashed_triton_left(tmp_path):
    """`serve` exited 1 after Triton crashed, and the stub stayed (reparented to init, so nothing found it)."""
    from bertforge.serve import server

    region = f"pytrtion{os.getpid()}-audit3test"
    shm = Path("/dev/shm") / f"{region}-0000"
    if shm.parent.is_dir():
        shm.write_bytes(b"x")
    triton, stub = _fake_triton_tree(tmp_path, region)
    try:

        class Crashed:
            def is_alive(self) -> bool:
                return triton.poll() is None

            def stop(self) -> None:
                pass  # PyTriton's stop: nothing to do for a Triton that is gone

        running = server.Server(Crashed(), None)
        triton.kill()  # Triton crashes; its stub is left behind
        triton.wait()
        running.serve(period_s=0.1)  # returns: Triton is gone
        running.stop()
        assert _gone(stub)
        assert not shm.exists()
    finally:
        with contextlib.suppress(OSError):
            os.kill(stub, signal.SIGKILL)
        shm.unlink(missing_ok=True)


def test_triton_dying_mid_request_is_still_exit_1(head_models, serving, tmp_path):
    """With the model computing a request when Triton died, `serve` exited while that thread was still in torch and
    the interpreter's shutdown aborted it: SIGABRT ("terminate called without an active exception"), not exit 1."""
    pytest.importorskip("pytriton", reason="nvidia-pytriton is not installed (pip install -e .[serve])")
    pytest.importorskip("tritonclient.http", reason="tritonclient is not installed (pip install -e .[serve])")
    import threading

    from bertforge.serve.client import Client

    args = ["--max-batch", "4", "--max-seq-len", "128", "--threads", "1", "--no-warmup"]
    args += ["--max-request-bytes", "200000"]
    with serving.serve_process({"qa": head_models["qa"]}, args, tmp_path / "serve.log") as srv:
        tritons = [p for p in _tree(srv["proc"].pid) if p.name() == "tritonserver"]
        sent = threading.Event()

        def ask() -> None:  # ~400 windows of 128 tokens: seconds of model time on a CPU
            with contextlib.suppress(Exception), Client(srv["http"], "http", timeout_s=120) as c:
                sent.set()
                c.infer("qa", question=["which word?"], context=["word " * 25_000])

        asker = threading.Thread(target=ask, daemon=True)
        asker.start()
        assert sent.wait(30)
        time.sleep(1.5)  # the request is in the model
        for p in tritons:
            p.kill()
        assert srv["proc"].wait(timeout=120) == 1
        asker.join(timeout=30)
    log = (tmp_path / "serve.log").read_text(errors="replace")
    assert "terminate called" not in log and "the inference server stopped on its own" in log, log[-1500:]


def test_longest_first_keeps_what_hugging_face_tokenizers_keep():
    from bertforge.serve.tasks import longest_first

    assert longest_first(14, 13, 13) == (7, 6)  # cut one at a time, the first at a tie: 6 + 7
    assert longest_first(13, 13, 13) == (6, 7)  # a tie: the odd token to b, as tokenizers does
    assert longest_first(3, 20, 10) == (3, 7) and longest_first(20, 3, 10) == (7, 3)
    assert longest_first(4, 5, 9) == (4, 5)


def test_served_pairs_are_cut_as_fine_tuning_cuts_them(encoder_dir):
    """Served pairs were cut otherwise than `finetune.runner.encode_glue` (tokenizers' longest_first) cuts them for
    training and evaluation: the served model saw a different token split of pairs over --max-seq-len."""
    import random

    from bertforge.serve.tasks import Limits, Predictor

    rng = random.Random(0)
    words = ["the", "cat", "sat", "on", "a", "mat", "and", "the", "dog", "ran", "far", "away", "quickly", "today"]
    for max_len in (16, 17):
        p = Predictor.from_dir("embed", encoder_dir, Limits(max_seq_len=max_len))
        for _ in range(100):
            a, b = (" ".join(rng.choices(words, k=rng.randint(1, 14))) for _ in range(2))
            p.tok.enable_truncation(max_len, strategy="longest_first")
            try:
                want = p.tok.encode(a, b, add_special_tokens=True)
            finally:
                p.tok.no_truncation()
            assert p.encode_pair(a, b) == (want.ids, want.type_ids), (a, b)


@pytest.mark.parametrize(
    "rows, words",
    [([], "has no rows"), (["fine", 3], "holds int 3"), ([None], "holds NoneType None"), ([b"x"], "holds bytes")],
    ids=["empty", "int", "none", "bytes"],
)
def test_client_rows_that_are_not_strings_are_one_line(rows, words):
    """An int or None row was an AttributeError from `.encode` (a traceback), no rows Triton's shape error."""
    pytest.importorskip("tritonclient.http", reason="tritonclient is not installed (pip install -e .[serve])")
    from bertforge.errors import UserError
    from bertforge.serve.client import Client

    port = serving_port()
    with Client(f"127.0.0.1:{port}", "http", timeout_s=5) as c, pytest.raises(UserError, match=words):
        c.infer("classify", text=rows)


def serving_port() -> int:
    from bertforge.serve.server import free_ports

    return free_ports(1)[0]  # nothing listens there: the rows are refused before anything is sent


def test_predict_prints_every_output_of_a_multi_output_regression_model():
    """transformers' regression with num_labels > 1 answers one score per label; predict printed the first only."""
    from bertforge.serve.client import rows_as_json

    two = {"score": np.array([[0.5, -1.25], [2.0, 3.0]], np.float32)}
    assert rows_as_json("classify", two) == [{"score": [0.5, -1.25]}, {"score": [2.0, 3.0]}]
    one = {"score": np.array([[0.5], [2.0]], np.float32)}
    assert rows_as_json("classify", one) == [{"score": 0.5}, {"score": 2.0}]  # STS-B's one score stays a number
