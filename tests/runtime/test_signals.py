"""Ctrl-C or SIGTERM landing in a destructor is not lost: Python prints such an exception and drops it (h5py frees
its objects in weakref callbacks, so `data shards` and `pack` ran on after Ctrl-C 2 times in 3)."""

from __future__ import annotations

import time
import weakref

import pytest

from bertforge.data.shards import _quiet_h5py_dealloc
from bertforge.runtime.signals import Terminated, interrupts_kept


def _interrupt_in_a_callback(kind: type[KeyboardInterrupt]) -> int:
    """Free an object whose weakref callback raises `kind`, then run on; returns how far the loop got."""

    class Thing:
        pass

    thing = Thing()

    def callback(_ref) -> None:
        raise kind

    ref = weakref.ref(thing, callback)
    del thing  # the callback runs here, and its exception goes to sys.unraisablehook
    done = 0
    for _ in range(200):  # 2 s of work, in which the interrupt comes back
        time.sleep(0.01)
        done += 1
    assert ref() is None
    return done


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_python_alone_drops_it():
    assert _interrupt_in_a_callback(KeyboardInterrupt) == 200


@pytest.mark.parametrize("kind", [KeyboardInterrupt, Terminated])
@pytest.mark.parametrize("scope", [interrupts_kept, _quiet_h5py_dealloc])
def test_an_interrupt_in_a_destructor_is_raised_again(kind, scope):
    with pytest.raises(kind) as caught, scope():
        _interrupt_in_a_callback(kind)
    assert type(caught.value) is kind
    # and Ctrl-C's handler is Python's again afterwards
    import signal

    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
