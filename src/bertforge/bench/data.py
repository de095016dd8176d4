"""Data-pipeline benchmarks: `bertforge data shards` wall time and peak memory of all its processes.

The input is WikiText-2 raw test (../shared/data/wikitext-2/raw/wiki.test.raw) repeated `repeat` times,
turned into documents once by `bertforge data docs` (cached under the bench cache directory; WikiText's
` = Title = ` headings start documents, paragraphs are split into sentences) — then `bertforge data shards`
runs as a child process with the uncased BERT vocab, and is timed. Peak RSS is the largest sum of the RSS of
the child and all its descendants, sampled every 10 ms with psutil (pages shared after fork count once per
process); a spike shorter than that is caught only through the kernel's high-water mark of the largest
process (ru_maxrss), which raises both figures to at least that process's peak.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from bertforge.runtime.io import atomic_path

SHARED = Path(__file__).resolve().parents[3].parent / "shared" / "data"


def _cache_dir() -> Path:
    d = Path(os.environ.get("BERTFORGE_BENCH_CACHE", Path(tempfile.gettempdir()) / "bertforge-bench-data"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def _docs(repeat: int) -> Path:
    """Documents of WikiText-2 raw test repeated `repeat` times (built once, then cached)."""
    raw = SHARED / "wikitext-2" / "raw" / "wiki.test.raw"
    if not raw.is_file():
        raise FileNotFoundError(f"{raw} is needed for this benchmark")
    cache = _cache_dir()
    docs = cache / f"wikitext2_test_x{repeat}_docs"
    if (docs / "manifest.json").is_file():
        return docs
    src = cache / f"wikitext2_test_x{repeat}.raw"
    if not src.is_file():
        text = raw.read_bytes()
        # atomically: a first run stopped mid-write would leave a short input that every later run reuses
        with atomic_path(src) as tmp, open(tmp, "wb") as f:
            for _ in range(repeat):
                f.write(text)
    subprocess.run(
        [sys.executable, "-m", "bertforge", "data", "docs", "--source", str(src), "--out", str(docs), "--shards", "8"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return docs


def _tree_rss(proc: psutil.Process) -> tuple[int, int]:
    """(sum, max) of the RSS of `proc` and its descendants, bytes."""
    total = biggest = 0
    try:
        procs = [proc] + proc.children(recursive=True)
    except psutil.NoSuchProcess:
        return 0, 0
    for p in procs:
        try:
            rss = p.memory_info().rss
        except psutil.NoSuchProcess:
            continue
        total += rss
        biggest = max(biggest, rss)
    return total, biggest


def run_measured(cmd: list[str], env: dict[str, str] | None = None) -> dict[str, float]:
    """Run `cmd` (with `env` added to the environment); wall and CPU seconds, peak summed RSS (MB) of it and its
    children."""
    peak = peak_one = 0
    t0 = time.perf_counter()
    child = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, **env} if env else None
    )
    ps = psutil.Process(child.pid)
    done = threading.Event()

    def sample() -> None:
        nonlocal peak, peak_one
        while not done.is_set():
            total, biggest = _tree_rss(ps)
            peak, peak_one = max(peak, total), max(peak_one, biggest)
            time.sleep(0.01)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    assert child.stderr is not None
    with child.stderr:
        err = child.stderr.read()
    # wait4, not Popen.wait: the kernel's usage of this child and the descendants it waited for, this run only
    _, status, ru = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    done.set()
    th.join()
    if child.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {err.decode()[-2000:]}")
    cpu = ru.ru_utime + ru.ru_stime
    # The samples miss a spike shorter than their 10 ms: the kernel's high-water mark of the largest process
    # (ru_maxrss, KiB on Linux) catches it, and the tree's sum at that moment was at least that much
    peak_one = max(peak_one, ru.ru_maxrss * 1024)
    peak = max(peak, peak_one)
    # cpu_s: CPU seconds of all processes; on a shared, loaded machine cpu_s / cores is the wall time the run
    # would take with the cores to itself
    return {"shards_wall_s": wall, "cpu_s": cpu, "peak_rss_mb": peak / 2**20, "max_process_rss_mb": peak_one / 2**20}


def shards_argv(
    docs, vocab, out, seq_len: int, max_pred: int, dupe_factor: int, num_shards: int, workers: int
) -> list[str]:
    """`bertforge data shards ...` arguments (the benchmarks that build shards share them)."""
    flags = {
        "--docs": docs,
        "--vocab": vocab,
        "--out": out,
        "--seq-len": seq_len,
        "--max-pred": max_pred,
        "--dupe-factor": dupe_factor,
        "--shards": num_shards,
        "--workers": workers,
    }
    return ["data", "shards", *(x for k, v in flags.items() for x in (k, str(v)))]


def shards(
    repeat: int = 10,
    seq_len: int = 128,
    max_pred: int = 20,
    dupe_factor: int = 5,
    num_shards: int = 16,
    workers: int = 0,
    wwm: bool = False,
) -> dict[str, float]:
    """`bertforge data shards` on WikiText-2 raw test x `repeat` with the uncased BERT vocab."""
    docs = _docs(repeat)
    vocab = SHARED / "bert_vocab" / "bert-base-uncased-vocab.txt"
    out = Path(tempfile.mkdtemp(prefix="bertforge-bench-shards-"))
    try:
        cmd = [
            sys.executable,
            "-m",
            "bertforge",
            *shards_argv(docs, vocab, out, seq_len, max_pred, dupe_factor, num_shards, workers),
        ]
        if wwm:
            cmd.append("--wwm")
        m = run_measured(cmd)
        import json

        man = json.loads((out / "manifest.json").read_text())
        m["instances"] = float(man["instances"])
        m["tokens"] = float(man["tokens"])
        m["mb_input"] = float(sum(f.stat().st_size for f in docs.glob("*.txt")) / 1e6)
        m["instances_per_s"] = m["instances"] / m["shards_wall_s"]
        return m
    finally:
        shutil.rmtree(out, ignore_errors=True)


def tokenize_only(repeat: int = 10) -> dict[str, float]:
    """HF tokenizers alone on the same documents, both cores (`encode_batch_fast`): the floor for `shards`."""
    from bertforge.data.vocab import load_tokenizer

    docs = _docs(repeat)
    tok = load_tokenizer(SHARED / "bert_vocab" / "bert-base-uncased-vocab.txt")
    lines = [ln for f in sorted(docs.glob("*.txt")) for ln in f.read_text(encoding="utf-8").split("\n") if ln]
    t0, c0 = time.perf_counter(), time.process_time()
    n = sum(len(e.ids) for e in tok.encode_batch_fast(lines, add_special_tokens=False))
    return {"tokenize_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0, "tokens": float(n)}
