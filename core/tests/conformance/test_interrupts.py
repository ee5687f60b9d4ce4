"""The test kit's interrupter counts the same points on every run of the same code.

A sweep counts a piece of code's points once, then interrupts it at each: a point that
comes and goes between runs (the cyclic collector's finalizers of earlier garbage, a
frame reusing a returned frame's address) makes a sweep fail by chance, as CI's run of
stop 61 did.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from edge_core.testing.interrupts import Interrupter, run_interrupted


def _fails() -> None:
    raise ValueError("from a call: the frame's last instruction is a CALL")


def _inner() -> None:
    _fails()


def _caught() -> None:
    try:
        _inner()
    except ValueError:
        return


def _plain() -> int:
    total = 0
    for step in range(3):
        total += step
    return total


def _no_call() -> int:
    one = 1
    return one + 1


def _points(call: Callable[[], object]) -> int:
    tracer = Interrupter(0)
    assert run_interrupted(tracer, call) is False
    return tracer.points


def test_a_frame_at_a_returned_frames_address_starts_afresh() -> None:
    # _inner's frame leaves on the exception raised by the call it made (its last
    # instruction a CALL); the next frame made takes its address, and its first
    # instruction must not count as a point after a call (_no_call has its entry alone)
    caught, lone = _points(_caught), _points(_no_call)
    assert lone == 1
    both = _points(lambda: (_caught(), _no_call()))
    # (the lambda's own: its entry and the points after its two calls)
    assert both == caught + lone + 3


class _Garbage:
    """A cycle with a finalizer: collected only by the cyclic collector, running Python."""

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        self.me = None


@contextmanager
def _collections_meanwhile(collected_by: list[int]) -> Iterator[None]:
    # The collector runs often (in the thread of whichever allocation passes its
    # threshold): in the traced code's thread at points that move with what was
    # allocated before, and in another thread that makes cyclic garbage meanwhile (while
    # its finalizers run, the traced thread may run too and its points count). Python
    # callbacks first and last in gc.callbacks, made after the interrupter's import (as
    # Hypothesis makes its own), run in each collection
    threshold = gc.get_threshold()
    stop = threading.Event()

    def churn() -> None:
        while not stop.wait(0.0002):
            for _ in range(50):
                _Garbage()

    def timed(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collected_by.append(threading.get_ident())

    thread = threading.Thread(target=churn, daemon=True)
    gc.set_threshold(20)
    gc.callbacks.insert(0, timed)
    gc.callbacks.append(timed)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        while timed in gc.callbacks:
            gc.callbacks.remove(timed)
        gc.set_threshold(*threshold)
        gc.collect()


def test_the_collectors_finalizers_and_callbacks_are_no_points() -> None:
    def work() -> None:
        for _ in range(30):
            _caught()
            _Garbage()
            [_plain() for _ in range(3)]

    gc.collect()
    quiet = _points(work)
    collected_by: list[int] = []
    counts = set()
    with _collections_meanwhile(collected_by):
        for before in range(16):  # (the collections land elsewhere in each run)
            gc.collect()
            ballast = [[] for _ in range(before)]
            counts.add(_points(work))
            del ballast
        # and every point counted is one an interrupted run reaches
        reached = [run_interrupted(Interrupter(k), work) for k in (1, quiet // 2, quiet)]
        assert run_interrupted(Interrupter(quiet + 1), work) is False
    assert counts == {quiet}
    assert reached == [True, True, True]
    main = threading.get_ident()
    assert main in collected_by and set(collected_by) - {main}  # (both ran collections)
