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


def _points(call: Callable[[], object]) -> int:
    tracer = Interrupter(0)
    assert run_interrupted(tracer, call) is False
    return tracer.points


def test_a_frame_at_a_returned_frames_address_starts_afresh() -> None:
    # _inner's frame leaves on the exception raised by the call it made; the next frames
    # may take its address, and none of them may inherit "after CALL" as its first point
    caught, plain = _points(_caught), _points(_plain)
    both = _points(lambda: (_caught(), _plain()))
    # (the lambda's own: its entry and the points after its two calls)
    assert both == caught + plain + 3


class _Garbage:
    """A cycle with a finalizer: collected only by the cyclic collector, running Python."""

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        self.me = None


@contextmanager
def _collections_meanwhile() -> Iterator[None]:
    # Another thread makes cyclic garbage, and the collector runs often: collections
    # (and the finalizers they run) land inside the traced code at unpredictable points
    threshold = gc.get_threshold()
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            _Garbage()

    thread = threading.Thread(target=churn, daemon=True)
    gc.set_threshold(20)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        gc.set_threshold(*threshold)
        gc.collect()


def test_the_collectors_finalizers_are_no_points() -> None:
    def work() -> None:
        for _ in range(30):
            _caught()
            [_plain() for _ in range(3)]

    quiet = _points(work)
    with _collections_meanwhile():
        counts = {_points(work) for _ in range(10)}
        # and every point counted is one an interrupted run reaches
        reached = [run_interrupted(Interrupter(k), work) for k in (1, quiet // 2, quiet)]
        assert run_interrupted(Interrupter(quiet + 1), work) is False
    assert counts == {quiet}
    assert reached == [True, True, True]
