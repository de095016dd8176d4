"""SIGTERM as Ctrl-C, for the commands without a step loop to stop at (`bertforge data`, `bertforge serve`): inside
`sigterm_interrupts()` a SIGTERM (`kill`, a scheduler stopping the job) raises `Terminated`, a KeyboardInterrupt,
where the main thread is, so the same unwinding runs (temporary files removed, worker pools and servers stopped,
finished outputs kept). The training loops stop at a step boundary instead (`runtime.preempt`). No torch here:
`bertforge data` does not import it."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C raises KeyboardInterrupt."""


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM raises `Terminated` in the main thread while inside; the old handler is back on exit."""

    def handle(signum: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: a second one must not break off the clean-up
        raise Terminated

    if threading.current_thread() is not threading.main_thread():  # handlers belong to the main thread
        yield
        return
    old = signal.signal(signal.SIGTERM, handle)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


_in_hook = False
_AGAIN_AFTER_S = 0.05
"""The interrupt is raised again this long after the hook: long enough for it to have returned (raised inside
it, or inside the destructor that called it, it would be dropped again)."""


def redeliver_interrupt(unraisable) -> bool:
    """`sys.unraisablehook` helper: Ctrl-C (or SIGTERM's `Terminated`) that lands in a destructor or a weakref
    callback (h5py frees its objects in them) is printed and dropped by Python, so the command ran on as if
    never stopped. It is raised again in the main thread a moment later; True when it was one."""
    global _in_hook
    exc = unraisable.exc_value
    if not isinstance(exc, KeyboardInterrupt) or threading.current_thread() is not threading.main_thread():
        return False
    kind, before = type(exc), signal.getsignal(signal.SIGINT)

    def again(signum: int, frame: FrameType | None) -> None:
        if _in_hook:  # inside another dropped destructor's hook: later again
            _send_sigint_later()
            return
        signal.signal(signal.SIGINT, before)
        raise kind

    _in_hook = True
    try:
        signal.signal(signal.SIGINT, again)
        _send_sigint_later()
    finally:
        _in_hook = False
    return True


def _send_sigint_later() -> None:
    main = threading.main_thread().ident
    assert main is not None
    timer = threading.Timer(_AGAIN_AFTER_S, signal.pthread_kill, (main, signal.SIGINT))
    timer.daemon = True
    timer.start()


@contextlib.contextmanager
def interrupts_kept() -> Iterator[None]:
    """Inside, a Ctrl-C or SIGTERM that Python would drop in a destructor is raised again (`redeliver_interrupt`)."""
    hook = sys.unraisablehook
    sys.unraisablehook = lambda u: None if redeliver_interrupt(u) else hook(u)
    try:
        yield
    finally:
        sys.unraisablehook = hook


STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


@contextlib.contextmanager
def stop_signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM held in this thread while worker processes fork (`data.workers.WorkerPool`, the
    DataLoader's): a child starts with this mask, so it gets neither before its own handlers are in place
    (`quiet_worker`, `worker_leaves_stopping_to`); this process gets them when the block ends."""
    if not hasattr(signal, "pthread_sigmask"):  # Windows: no signal masks
        yield
        return
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def worker_leaves_stopping_to(trainer: int, worker_id: int) -> None:
    """A DataLoader worker's init function. A stop signal sent to the whole job reaches the loader's workers too:
    torchrun stops its workers with killpg, SLURM signals every process of the job, a terminal's Ctrl-C its
    foreground group. Stopping is the training process's to do (`runtime.preempt`: end the step, save, exit);
    torch's worker handler died of SIGTERM, and the training process then failed inside its next step
    ("DataLoader worker ... is killed by signal: Terminated") with no checkpoint. So SIGINT is ignored here, and
    SIGTERM, blocked, is waited for in a thread: it ends the worker only when `trainer` (the training process:
    the DataLoader's own shutdown) sent it, as torch's handler does."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not hasattr(signal, "sigwaitinfo"):  # no sender to tell apart (macOS, Windows): the parent's shutdown
        # still ends the worker, which leaves its loop once the DataLoader says it is done
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if hasattr(signal, "pthread_sigmask"):
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        return
    signal.signal(signal.SIGTERM, lambda signum, frame: None)  # a thread that has it unblocked drops it
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # here and in the waiter, which inherits it

    def wait() -> None:
        while signal.sigwaitinfo({signal.SIGTERM}).si_pid != trainer:
            pass  # someone else's: the training process got its own copy and stops at a step boundary
        os._exit(0)

    threading.Thread(target=wait, name="bertforge-sigterm", daemon=True).start()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
