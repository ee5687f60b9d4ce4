"""call_soon_once, call_later_once: a callback handed to an event loop runs exactly once,
however it ends; run_then_flush runs what its work hands the loop right after that work."""

from __future__ import annotations

import asyncio
import sys
import threading
from typing import Any

import pytest

from edge_core.host.loop_calls import call_later_once, call_soon_once, run_then_flush
from edge_core.testing.interrupts import Interrupter


def _recorder() -> tuple[list[int], Any]:
    """(the threads it ran in, the callback)."""
    ran: list[int] = []
    return ran, lambda: ran.append(threading.get_ident())


def test_a_running_loop_runs_it_once_on_its_own_thread() -> None:
    loop = asyncio.new_event_loop()
    ran, callback = _recorder()
    try:
        def on_the_loop() -> None:
            call_soon_once(loop, callback, threadsafe=False)
            threading.Thread(target=call_soon_once, args=(loop, callback)).start()
            loop.call_later(0.3, loop.stop)

        loop.call_soon(on_the_loop)
        loop.run_forever()
    finally:
        loop.close()
    assert ran == [threading.get_ident()] * 2  # each once, both on the loop's thread


def test_a_closed_loop_refuses_it_and_it_runs_here() -> None:
    loop = asyncio.new_event_loop()
    loop.close()
    ran, callback = _recorder()
    call_soon_once(loop, callback)
    assert ran == [threading.get_ident()]


@pytest.mark.parametrize("threadsafe", [True, False])
def test_a_loop_stopped_and_closed_with_it_queued_runs_it_where_it_is_closed(
    threadsafe: bool,
) -> None:
    loop = asyncio.new_event_loop()
    ran, callback = _recorder()

    def the_last_batch() -> None:
        if threadsafe:  # handed over from another thread while the loop runs this
            thread = threading.Thread(target=call_soon_once, args=(loop, callback))
            thread.start()
            thread.join()
        else:
            call_soon_once(loop, callback, threadsafe=False)
        loop.stop()  # what this batch queued never runs on the loop

    loop.call_soon(the_last_batch)
    loop.run_forever()
    assert ran == []  # queued, not run
    closer = threading.Thread(target=loop.close, name="closer")
    closer.start()
    closer.join()
    assert ran == [closer.ident]  # in the thread that dropped it
    assert not loop.is_running()


def test_a_loop_that_closes_while_it_is_handed_over_still_has_it_run_once() -> None:
    loop = asyncio.new_event_loop()
    ran, callback = _recorder()
    stranded: list[Any] = []

    def closes_then_queues(once: Any) -> None:
        # call_soon_threadsafe checked the loop open; another thread closes it before the
        # callback is queued: it lands in the closed loop's queue, kept there for good
        loop.close()
        stranded.append(once)

    loop.call_soon_threadsafe = closes_then_queues  # type: ignore[method-assign]
    call_soon_once(loop, callback)
    assert ran == [threading.get_ident()]
    stranded.clear()  # dropped at last: it does not run again
    assert ran == [threading.get_ident()]


def test_call_later_once_runs_it_once_when_its_time_comes() -> None:
    loop = asyncio.new_event_loop()
    ran, callback = _recorder()
    try:
        loop.call_soon(call_later_once, loop, 0.05, callback)
        loop.call_later(0.3, loop.stop)
        loop.run_forever()
        assert ran == [threading.get_ident()]
    finally:
        loop.close()
    assert ran == [threading.get_ident()]  # not again at the close


def test_call_later_once_runs_it_where_the_loop_is_closed_before_its_time() -> None:
    loop = asyncio.new_event_loop()
    ran, callback = _recorder()
    loop.call_soon(call_later_once, loop, 60.0, callback)
    loop.call_soon(loop.stop)
    loop.run_forever()
    assert ran == []
    closer = threading.Thread(target=loop.close)
    closer.start()
    closer.join()
    assert ran == [closer.ident]  # dropped with the loop's schedule: run by its closer


def test_call_later_once_on_a_closed_loop_runs_it_here() -> None:
    loop = asyncio.new_event_loop()
    loop.close()
    ran, callback = _recorder()
    call_later_once(loop, 1.0, callback)
    assert ran == [threading.get_ident()]


def test_run_then_flush_runs_what_its_work_hands_the_loop_after_the_work_in_the_same_turn(
) -> None:
    loop = asyncio.new_event_loop()
    order: list[str] = []
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: errors.append(context))
    other = asyncio.new_event_loop()
    other_ran, other_callback = _recorder()

    def failing() -> None:
        order.append("failing")
        raise ValueError("callback")

    def work() -> str:
        call_soon_once(loop, lambda: order.append("first"), threadsafe=False)
        call_soon_once(loop, failing, threadsafe=False)
        call_soon_once(loop, lambda: call_soon_once(  # a flushed callback's: queued on the loop
            loop, lambda: order.append("nested"), threadsafe=False), threadsafe=False)
        call_soon_once(other, other_callback, threadsafe=False)  # another loop's: queued there
        order.append("work")
        return "done"

    def in_a_turn() -> None:
        loop.call_soon(lambda: order.append("next turn"))  # queued before the flush
        assert run_then_flush(loop, work) == "done"
        order.append("after")
        loop.stop()

    try:
        loop.call_soon(in_a_turn)
        loop.run_forever()
        assert order == ["work", "first", "failing", "after"]  # none in a later turn
        assert [type(context["exception"]) for context in errors] == [ValueError]
        loop.run_until_complete(asyncio.sleep(0))
        assert order[4:] == ["next turn", "nested"]
        assert other_ran == []
        other.run_until_complete(asyncio.sleep(0))
        assert other_ran == [threading.get_ident()]
    finally:
        loop.close()
        other.close()


def test_run_then_flush_runs_them_when_its_work_raises() -> None:
    loop = asyncio.new_event_loop()
    ran, callback = _recorder()

    def work() -> None:
        call_soon_once(loop, callback, threadsafe=False)
        raise KeyError("work")

    try:
        with pytest.raises(KeyError):
            run_then_flush(loop, work)
        assert ran == [threading.get_ident()]
        loop.run_until_complete(asyncio.sleep(0))
        assert ran == [threading.get_ident()]  # once: nothing was queued on the loop
    finally:
        loop.close()


class _Settle:
    """A callback that tolerates being called again: its second call does nothing."""

    def __init__(self) -> None:
        self.begun = False
        self.ended = 0

    def __call__(self) -> None:
        if self.begun:
            return
        self.begun = True
        self.ended += 1


@pytest.mark.parametrize("batched", [False, True], ids=["on-the-loop", "flushed"])
def test_a_callback_a_ctrl_c_cuts_short_as_it_begins_is_called_again_then_it_is_raised(
        batched: bool) -> None:
    # A KeyboardInterrupt acted on as the callback begins (before any of its code ran)
    # comes out of the loop's run, after the callback was called again to its end: on
    # the loop (call_soon_once's own) and after a run_then_flush's work. Before, the
    # callback was dropped unrun.
    loop = asyncio.new_event_loop()
    settle = _Settle()

    def hand_over() -> None:
        call_soon_once(loop, settle, threadsafe=False)

    def on_the_loop() -> None:
        if batched:
            run_then_flush(loop, hand_over)
        else:
            hand_over()

    tracer = Interrupter(1, frozenset({"_Settle.__call__"}))
    try:
        loop.call_soon(on_the_loop)
        loop.call_later(0.05, loop.stop)
        sys.settrace(tracer)
        try:
            with pytest.raises(KeyboardInterrupt):
                loop.run_forever()
        finally:
            sys.settrace(None)
        assert tracer.where, "not interrupted"
    finally:
        loop.close()
    assert settle.ended == 1
