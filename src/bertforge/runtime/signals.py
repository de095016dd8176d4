"""SIGTERM as Ctrl-C, for the commands without a step loop to stop at (`bertforge data`, `bertforge serve`): inside
`sigterm_interrupts()` a SIGTERM (`kill`, a scheduler stopping the job) raises `Terminated`, a KeyboardInterrupt,
where the main thread is, so the same unwinding runs (temporary files removed, worker pools and servers stopped,
finished outputs kept). The training loops stop at a step boundary instead (`runtime.preempt`). No torch here:
`bertforge data` does not import it."""

from __future__ import annotations

import contextlib
import signal
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
