"""Preemption: SIGTERM (what SLURM and Kubernetes send before killing a job) and SIGINT (Ctrl-C) become a flag
that the training loops read at each step boundary, so they finish the step, save, say so and exit.

    with Preemption() as pre:
        for step in ...:
            ...one step...
            if pre.agreed(device):           # every rank takes the same decision
                save(); raise pre.stopped("saved checkpoint step_N in DIR; continue with --resume")

A second signal of the same kind while the first is being handled gets the old behaviour (KeyboardInterrupt
for SIGINT, termination for SIGTERM): a user who presses Ctrl-C twice is not kept waiting. Under a launcher
(torchrun, mpirun, srun) a repeat of the same signal is the same stop again, not a second one: SLURM signals
every process of a step and torchrun forwards its own copy (after a save of any length, once the worker's
handler runs), which would otherwise kill a worker in the middle of saving. There the other signal stops at
once: torchrun turns a second Ctrl-C into SIGTERM for its workers. Handlers can only be installed from the main
thread; elsewhere (a loop run from a worker thread) the flag is never set.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from types import FrameType
from typing import Any

import torch

from bertforge.runtime import distributed as ddp

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preempted(Exception):
    """The run stopped on a signal after saving; `exit_code` is 128 + the signal number (143, 130)."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_code = 128 + signum


class Preemption:
    """Installs flag-setting handlers for SIGTERM and SIGINT on enter; restores the old ones on exit."""

    def __init__(self) -> None:
        self.signum = 0
        self._launched = False  # started by torchrun, mpirun or srun (read on enter, not inside a handler)
        self._old: dict[int, Any] = {}

    def __enter__(self) -> Preemption:
        self._launched = ddp.env_info().launcher != "none"
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()
        if exc_type is None and self.signum:  # it came after the last step's check (the final evaluation, the
            # summary): the run is complete, and the signal still stops the process, not the next run of a suite
            raise self.stopped("it came after the last step; this run finished and is written, and nothing follows")

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._launched and self.signum == signum:
            return  # the same signal again: the launcher's forwarded copy of the one every process got
        if self.signum and (self._launched or self.signum == signum):  # the second one: the old behaviour, now
            signal.signal(signum, self._old.get(signum, signal.SIG_DFL))
            signal.raise_signal(signum)
            return
        self.signum = signum
        # os.write, not print: the signal may arrive while the loop is inside a print to the same stream, and a
        # buffered stream refuses a reentrant write
        hint = "Ctrl-C again or another signal" if self._launched else "again"
        note = f"received {signal.Signals(signum).name}: stopping at the next step boundary ({hint}: at once)\n"
        with contextlib.suppress(OSError):
            os.write(2, note.encode())

    def agreed(self, device: torch.device) -> bool:
        """Whether any rank received a signal (an all-reduce under torchrun: every rank stops at the same
        step, or the ones that go on would wait forever in the next all-reduce of gradients)."""
        if not torch.distributed.is_initialized():
            return self.signum != 0
        # ranks that received (SIGTERM, SIGINT); a rank that got none takes the others' signal for its message.
        # The decision is the reduced flags' alone: a signal landing after the all-reduce waits for the next
        # step on this rank too, or it would stop while the others went on into the next all-reduce
        flags = torch.tensor([float(self.signum == s) for s in SIGNALS], device=device)
        got = ddp.all_reduce_sum(flags).tolist()
        agreed = next((int(s) for s, n in zip(SIGNALS, got) if n > 0), 0)
        if agreed and not self.signum:
            self.signum = agreed
        return agreed != 0

    def stopped(self, what: str) -> Preempted:
        """The exception to raise after saving: "received SIGTERM: <what>"."""
        return Preempted(f"received {signal.Signals(self.signum).name}: {what}", self.signum)
