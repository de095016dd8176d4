"""Worker processes for `bertforge data`: one pipe per worker, stopped at once on Ctrl-C, SIGTERM or an error.

Why not multiprocessing.Pool or concurrent.futures.ProcessPoolExecutor: a worker killed from outside (SIGTERM
to the process group by `kill`, SLURM or Kubernetes; the OOM killer) dies in the middle of whatever it was doing.
Both share one task queue and one result queue between all workers, so a worker that dies holding a queue lock,
or half-way through writing a result, leaves the main process waiting for ever: Pool's teardown on the lock
(`bertforge data shards` hung in about 1 try in 4 when its group got SIGTERM 20-30 ms after the pool started),
the executor's result thread on the rest of the half-written result (`data docs`, whose results are large).
Here each worker has a pipe of its own that only it and the main process hold: when it dies, the main process
reads end-of-file from that pipe and knows; no lock is shared with a worker.

Signals: a worker ignores SIGINT (a terminal sends it to the whole group; the main process alone stops the
work) and dies silently on SIGTERM (`quiet_worker`). The workers are forked with both signals blocked, and
unblocked only once those handlers are in place: a child starts with the parent's handlers, and before then a
SIGTERM would run `sigterm_interrupts`' raising handler inside the child, which could unwind into a copy of the
parent's own program.
"""

from __future__ import annotations

import contextlib
import signal
import traceback
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NoReturn

from bertforge.errors import UserError
from bertforge.runtime.signals import STOP_SIGNALS, stop_signals_held

_END = object()


def quiet_worker() -> None:
    """The handlers every worker runs first (a pool's `initializer` must call it): SIGINT ignored, SIGTERM the
    default (a silent death), then both unblocked."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


class RemoteTraceback(Exception):
    """The worker's traceback, chained as the cause of the exception it raised."""

    def __str__(self) -> str:
        return str(self.args[0])


def _serve(conn: Any, initializer: Callable[[], None]) -> None:
    """A worker: (fn, item) in, (True, fn(item)) or (False, exception, traceback text) out, until None."""
    initializer()
    while True:
        try:
            task = conn.recv()
        except EOFError:  # the main process is gone (killed): nothing left to do, nothing to say
            return
        if task is None:
            return
        fn, item = task
        try:
            reply: tuple = (True, fn(item))
        except Exception as e:
            reply = (False, e, traceback.format_exc())
        try:
            conn.send(reply)
        except OSError:  # the main process is gone
            return
        except Exception as e:  # an unpicklable result or exception: its text still reaches the main process
            conn.send((False, RuntimeError(f"{type(e).__name__}: {e}"), "".join(traceback.format_exception(e))))


class WorkerPool:
    """`workers` processes (fork, or spawn where there is none), each given one item at a time by `map`.

    Leaving the `with` block normally lets the workers finish and exit; leaving it by an exception (Ctrl-C,
    SIGTERM, an error) kills them at once rather than waiting for the work in flight, which may take minutes."""

    def __init__(self, workers: int, initializer: Callable[[], None] = quiet_worker):
        import multiprocessing as mp  # here: a one-process run (a small dump) does not pay for importing it

        ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context("spawn")
        self.procs: list[Any] = []
        self.conns: list[Any] = []
        try:
            with stop_signals_held():
                for _ in range(workers):
                    mine, theirs = ctx.Pipe()
                    proc = ctx.Process(target=_serve, args=(theirs, initializer), daemon=True)
                    proc.start()
                    theirs.close()  # the worker holds the only other end: its death is end-of-file here
                    self.procs.append(proc)
                    self.conns.append(mine)
        except BaseException:
            self.kill()
            raise

    def map(self, fn: Callable, items: Iterable, ordered: bool = True) -> Iterator:
        """fn(item) for each item, in input order (`ordered`) or as each finishes; one item per worker in flight
        and one read ahead (read while the workers work: reading a plain bz2 dump is this process's job), so
        the input is read only as fast as the workers keep up and memory stays flat."""
        from multiprocessing.connection import wait

        source, idle, busy = iter(items), list(range(len(self.conns))), {}  # busy: worker -> item index
        done: dict[int, Any] = {}
        sent = yielded = 0
        ahead = next(source, _END)
        while True:
            # in order, results wait behind a slow item: at most 2 per worker, so memory stays bounded anyway
            while idle and ahead is not _END and (not ordered or sent - yielded < 2 * len(self.conns)):
                worker = idle.pop()
                self._send(worker, (fn, ahead))
                busy[worker], sent = sent, sent + 1
                ahead = next(source, _END)
            while yielded in done:
                yield done.pop(yielded)
                yielded += 1
            if not busy:  # all that was sent is out: the end, or the window is open again
                if ahead is _END:
                    return
                continue
            for conn in wait([self.conns[w] for w in busy]):
                worker = self.conns.index(conn)
                index, result = busy.pop(worker), self._result(worker)
                idle.append(worker)
                if ordered:
                    done[index] = result
                else:
                    yield result

    def _send(self, worker: int, task: tuple) -> None:
        try:
            self.conns[worker].send(task)
        except OSError:  # nobody reads the pipe: the worker is gone
            self._died(worker)

    def _result(self, worker: int) -> Any:
        try:
            reply = self.conns[worker].recv()
        except (EOFError, OSError):  # the pipe ended, half-way through a result or before one
            self._died(worker)
        if reply[0]:
            return reply[1]
        error: BaseException = reply[1]
        error.__cause__ = RemoteTraceback(reply[2])
        raise error

    def _died(self, worker: int) -> NoReturn:
        self.procs[worker].join(timeout=5)
        raise UserError(
            f"a worker process died ({_death(self.procs[worker].exitcode)}); run the command again: finished "
            "outputs are kept, and fewer --workers need less memory"
        ) from None

    def kill(self) -> None:
        for proc in self.procs:
            proc.kill()
        self.close()

    def close(self) -> None:
        for conn in self.conns:
            conn.close()
        for proc in self.procs:
            proc.join()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc_type is not None:
            self.kill()
            return
        for conn in self.conns:
            with contextlib.suppress(OSError):  # one that died (a pipe without a reader) needs no goodbye
                conn.send(None)
        self.close()


def _death(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name
        return f"{name}: killed from outside{', or by the system when memory ran out' if name == 'SIGKILL' else ''}"
    return f"exit code {exitcode}"


def bounded_map(fn: Callable, items: Iterable, workers: int) -> Iterator:
    """fn(item) for each item, in order, in `workers` processes (this one when workers <= 1)."""
    if workers <= 1:
        yield from map(fn, items)
        return
    with WorkerPool(workers) as pool:
        yield from pool.map(fn, items)
