"""SIGTERM stops a multi-process `bertforge data shards` as Ctrl-C does: one line, exit 143, no worker
tracebacks, nothing half-written left (a re-run keeps the finished shards, as after Ctrl-C)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import bertforge
from bertforge.data.vocab import train_wordpiece
from bertforge.data.workers import WorkerPool, bounded_map, quiet_worker
from bertforge.errors import UserError

WORDS = ["alpha", "beta", "gamma", "delta", "river", "mountain", "forest", "city", "ocean", "valley", "stone", "cloud"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("sigterm")
    rng = np.random.default_rng(0)
    docs = d / "docs" / "docs_0.txt"
    docs.parent.mkdir()
    sentence = lambda: " ".join(rng.choice(WORDS, rng.integers(4, 20))).capitalize() + "."  # noqa: E731
    docs.write_text("\n\n".join("\n".join(sentence() for _ in range(6)) for _ in range(3000)) + "\n")
    train_wordpiece([docs], d / "vocab", vocab_size=60)
    return docs.parent, d / "vocab" / "tokenizer.json"


@pytest.mark.parametrize("to_group", [False, True], ids=["kill-pid", "kill-group"])
def test_sigterm_is_one_line_and_quiet_workers(corpus, tmp_path, to_group):
    docs, vocab = corpus
    out = tmp_path / "out"
    argv = ["data", "shards", "--docs", str(docs), "--vocab", str(vocab), "--out", str(out), "--seq-len", "64",
            "--dupe-factor", "4", "--shards", "4", "--workers", "2"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(Path(bertforge.__file__).parents[1])}
    child = subprocess.Popen(
        [sys.executable, "-m", "bertforge", *argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: kill-group reaches the workers too, and only them
    )
    try:
        assert child.stdout is not None
        for line in child.stdout:
            if "building with 2 worker(s)" in line:  # the pool is up and working
                break
        os.killpg(child.pid, signal.SIGTERM) if to_group else child.send_signal(signal.SIGTERM)
        _, err = child.communicate(timeout=60)  # EOF only when the workers, holding the pipe too, are gone
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
    assert child.returncode == 128 + signal.SIGTERM, err
    assert err.strip() == "bertforge data: interrupted", err
    assert not out.exists() or not [p.name for p in out.iterdir() if p.name.startswith(".")]


def _mask_then_quiet() -> None:
    """An initializer that writes down what a fresh worker starts with, then does what every pool's must."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    Path(os.environ["BF_TEST_MASK"]).write_text(" ".join(str(int(s)) for s in held))
    quiet_worker()


def _blocked(_: object) -> set:
    return signal.pthread_sigmask(signal.SIG_BLOCK, [])  # blocking nothing more: the mask as it is


def test_workers_fork_with_stop_signals_held_until_quiet_worker(tmp_path, monkeypatch):
    """Until its initializer runs, a worker has the parent's handlers; a SIGTERM or Ctrl-C in that window must
    wait (pending) rather than run `sigterm_interrupts`' raising handler inside the child."""
    monkeypatch.setenv("BF_TEST_MASK", str(tmp_path / "mask"))
    with WorkerPool(1, _mask_then_quiet) as pool:
        unblocked = list(pool.map(_blocked, [None]))
    assert {signal.SIGINT, signal.SIGTERM} <= {int(s) for s in (tmp_path / "mask").read_text().split()}
    assert unblocked == [set()]  # once quiet_worker has run
    assert not signal.pthread_sigmask(signal.SIG_BLOCK, []) & {signal.SIGINT, signal.SIGTERM}  # parent as before


SIGTERM_AT_START = """
import os, signal
from bertforge.data.workers import WorkerPool
from bertforge.errors import UserError
from bertforge.runtime.signals import sigterm_interrupts
with sigterm_interrupts():
    for _ in range(200):
        try:
            with WorkerPool(2) as pool:
                for p in pool.procs:
                    os.kill(p.pid, signal.SIGTERM)  # most likely before the worker has set its own handlers
                list(pool.map(abs, range(3)))
        except UserError:  # the workers are gone: said in one line, which this script expects
            pass
"""


def test_sigterm_to_workers_as_they_start_is_quiet_under_sigterm_interrupts():
    """The CI hang: SIGTERM reached workers that had not yet run `quiet_worker`, so `sigterm_interrupts`' handler
    raised in them, and a child that unwound before it was inside `Process._bootstrap` never exited. Forked with
    the stop signals held, they die silently instead; with nothing held, this script printed over a thousand lines
    of worker tracebacks."""
    env = {**os.environ, "PYTHONPATH": str(Path(bertforge.__file__).parents[1])}
    run = subprocess.run([sys.executable, "-c", SIGTERM_AT_START], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stderr == "", run.stderr[-2000:]


def _die(_: object) -> None:
    os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer would


def _fail(x: int) -> int:
    if x == 3:
        raise UserError(f"item {x} is bad")
    return x


def test_map_in_order_or_as_finished_and_errors_as_raised():
    with WorkerPool(2) as pool:
        assert list(pool.map(abs, range(-6, 0))) == [6, 5, 4, 3, 2, 1]
        assert sorted(pool.map(abs, range(-6, 0), ordered=False)) == [1, 2, 3, 4, 5, 6]
    with pytest.raises(UserError, match="item 3 is bad") as caught, WorkerPool(2) as pool:
        list(pool.map(_fail, range(6)))
    assert "in _fail" in str(caught.value.__cause__)  # the worker's traceback, chained
    assert not any(p.is_alive() for p in pool.procs)
    assert list(bounded_map(abs, range(-3, 0), 1)) == [3, 2, 1]  # one worker: in this process


def _nap(seconds: float) -> float:
    import time

    time.sleep(seconds)
    return seconds


def test_in_order_results_behind_a_slow_item_stay_bounded():
    """Item 0 takes a second, the rest none: the other worker must not run through the whole input meanwhile,
    piling its results up in memory behind item 0."""
    pulled = []

    def items():
        for i, s in enumerate([1.0] + [0.0] * 40):
            pulled.append(i)
            yield s

    with WorkerPool(2) as pool:
        out = pool.map(_nap, items())
        assert next(out) == 1.0 and len(pulled) <= 2 * 2 + 1  # 2 per worker in flight or waiting, 1 read ahead
        assert sum(1 for _ in out) == 40


def test_a_worker_killed_from_outside_is_one_line_not_a_hang():
    with pytest.raises(UserError, match=r"a worker process died \(SIGKILL: .*\); run the command again"):
        list(bounded_map(_die, range(4), 2))
    assert list(bounded_map(abs, range(-5, 0), 2)) == [5, 4, 3, 2, 1]  # a new pool works after it


KILLED_MID_SEND = """
import os, random, signal, threading
from bertforge.data.workers import WorkerPool
from bertforge.errors import UserError
def big(_):
    return bytes(8 << 20)  # 8 MB: sending it takes long enough that a kill often lands half-way through
died = 0
for _ in range(25):
    try:
        with WorkerPool(2) as pool:
            victim = random.choice(pool.procs).pid
            threading.Timer(random.uniform(0, 0.05), os.kill, (victim, signal.SIGKILL)).start()
            for _ in pool.map(big, range(30)):
                pass
    except UserError as e:
        assert "a worker process died (SIGKILL" in str(e), e
        died += 1
print(died)
"""


def test_a_worker_killed_half_way_through_a_result_is_not_a_hang():
    """multiprocessing.Pool waited for ever on a queue lock a killed worker held (SIGTERM to the process group
    hung `data shards` in about 1 try in 4 when sent 20-30 ms after the pool started), and ProcessPoolExecutor on
    the rest of a result a killed worker had half written (`data docs`, 1 try in 25); a pipe per worker ends in
    end-of-file instead."""
    env = {**os.environ, "PYTHONPATH": str(Path(bertforge.__file__).parents[1])}
    run = subprocess.run([sys.executable, "-c", KILLED_MID_SEND], env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0 and int(run.stdout) > 0, run.stderr[-2000:]


def test_an_interrupted_pool_stops_its_workers_at_once():
    """Leaving the block by an exception kills the workers rather than waiting for the work in flight."""
    import time

    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt), WorkerPool(2) as pool:
        for _ in pool.map(time.sleep, [0, 60, 60], ordered=False):
            raise KeyboardInterrupt  # the first is in; the other worker is a minute from done
    assert time.monotonic() - t0 < 30 and not any(p.is_alive() for p in pool.procs)
