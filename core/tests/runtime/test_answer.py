"""Answer: a request's outcome set once, handed to callbacks and to waiting threads.

What a submission's caller gets (``edge_core.runtime.answer``): set by whichever thread
ends the request, awaited by callbacks (an event loop) or by threads in ``result()``.
Real threads throughout; SIGINT is a real signal sent to the main thread.
"""

from __future__ import annotations

import inspect
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import pytest

from edge_core.errors import DeadlineExceeded
from edge_core.runtime.answer import Answer
from edge_core.runtime.request_tracker import RequestTracker
from edge_core.runtime.submission import RequestAnswer, Submission

JOIN_S = 10.0  # a bound on what must not hang, not a timing


def started(target: Callable[[], object]) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def joined(*threads: threading.Thread) -> None:
    for thread in threads:
        thread.join(JOIN_S)
        assert not thread.is_alive(), "a thread still waits on a set answer"


def test_a_result_is_set_once_and_a_second_set_is_refused() -> None:
    answer: Answer[str] = Answer()
    assert not answer.done()
    answer.set_result("first")
    assert answer.done() and answer.result() == "first" and answer.result(0) == "first"
    with pytest.raises(RuntimeError, match="set already"):
        answer.set_result("second")
    with pytest.raises(RuntimeError, match="set already"):
        answer.set_exception(ValueError("late"))
    assert answer.settle("third", None) is False
    assert answer.result() == "first"


def test_an_error_is_raised_by_every_result_and_settle_says_who_set_it() -> None:
    answer: Answer[str] = Answer()
    error = KeyError("failed")
    assert answer.settle(None, error) is True
    for _ in range(2):
        with pytest.raises(KeyError) as raised:
            answer.result(0)
        assert raised.value is error
    assert answer.settle("late", None) is False


@pytest.mark.parametrize("timeout", [0, -1.0, 0.05])
def test_a_result_not_set_in_time_raises_timeout_error(timeout: float) -> None:
    answer: Answer[str] = Answer()
    with pytest.raises(TimeoutError):
        answer.result(timeout)
    assert not answer.done()
    answer.set_result("late")  # the waits left nothing that stops it being set
    assert answer.result(timeout) == "late"


def test_a_wait_longer_than_a_lock_takes_is_capped_not_refused() -> None:
    answer: Answer[str] = Answer()

    def set_it() -> None:
        time.sleep(0.05)
        answer.set_result("in")

    setter = started(set_it)
    assert answer.result(threading.TIMEOUT_MAX * 10) == "in"  # no OverflowError
    joined(setter)


def test_callbacks_run_once_in_the_setting_thread_in_order_and_at_once_when_set() -> None:
    answer: Answer[int] = Answer()
    seen: list[tuple[str, int]] = []
    answer.add_done_callback(lambda: seen.append(("a", threading.get_ident())))
    answer.add_done_callback(lambda: seen.append(("b", threading.get_ident())))
    assert seen == []
    setter_ident: list[int] = []

    def set_it() -> None:
        setter_ident.append(threading.get_ident())
        answer.set_result(1)

    joined(started(set_it))
    assert seen == [("a", setter_ident[0]), ("b", setter_ident[0])]
    answer.add_done_callback(lambda: seen.append(("late", threading.get_ident())))
    assert seen[-1] == ("late", threading.get_ident())  # at once, here
    answer.settle(2, None)  # refused: no callback runs again
    assert len(seen) == 3


def test_a_callbacks_error_is_logged_and_the_others_still_run(
        caplog: pytest.LogCaptureFixture) -> None:
    answer: Answer[int] = Answer()
    seen: list[str] = []

    def failing() -> None:
        raise ValueError("callback failed")

    answer.add_done_callback(failing)
    answer.add_done_callback(lambda: seen.append("after"))
    with caplog.at_level(logging.ERROR, logger="edge_core.runtime.answer"):
        assert answer.settle(1, None) is True  # not raised to the setting thread
        answer.add_done_callback(failing)  # at once: logged too, not raised
    assert seen == ["after"]
    assert [r.exc_info[0] for r in caplog.records if r.exc_info] == [ValueError, ValueError]


def test_threads_waiting_are_woken_by_a_set_from_another_thread() -> None:
    answer: Answer[str] = Answer()
    got: list[str] = []
    waiters = [started(lambda: got.append(answer.result())),
               started(lambda: got.append(answer.result(JOIN_S * 3)))]
    time.sleep(0.1)  # (most likely waiting by now; the test holds either way)
    joined(started(lambda: answer.set_result("in")))
    joined(*waiters)
    assert got == ["in", "in"]


def test_an_error_set_from_another_thread_is_raised_to_the_waiting_thread() -> None:
    answer: Answer[str] = Answer()

    def fail_it() -> None:
        time.sleep(0.05)
        answer.set_exception(LookupError("gone"))

    setter = started(fail_it)
    with pytest.raises(LookupError, match="gone"):
        answer.result(JOIN_S)
    joined(setter)


def test_a_callback_added_as_another_thread_sets_the_answer_runs_exactly_once() -> None:
    # The adding thread is held where it found the answer unset, before it takes the
    # answer's lock; the answer is set meanwhile, with nothing to call yet
    answer: Answer[int] = Answer()
    code = Answer.add_done_callback.__code__
    lines, first = inspect.getsourcelines(Answer.add_done_callback)
    held_at = first + next(i for i, text in enumerate(lines) if "with self._lock" in text)
    there, go = threading.Event(), threading.Event()

    def tracer(frame: FrameType, event: str, arg: object) -> Any:
        if frame.f_code is not code:
            return None
        if event == "line" and frame.f_lineno == held_at and not there.is_set():
            there.set()
            go.wait(JOIN_S)
        return tracer

    runs: list[int] = []

    def add() -> None:
        sys.settrace(tracer)
        try:
            answer.add_done_callback(lambda: runs.append(threading.get_ident()))
        finally:
            sys.settrace(None)

    adder = started(add)
    assert there.wait(JOIN_S)
    answer.set_result(1)
    go.set()
    joined(adder)
    assert runs == [adder.ident]  # once, at once in the adding thread


def test_a_wait_that_times_out_as_the_answer_is_set_leaves_the_other_waiters_woken() -> None:
    # Two threads wait, the later one briefly; the setting thread is held where it has
    # taken the later one's lock to release, until that wait has timed out and returned
    answer: Answer[str] = Answer()
    code = Answer._tell.__code__  # (held inside it: where it tells the waiters)
    lines, first = inspect.getsourcelines(Answer._tell)
    held_at = first + next(i for i, text in enumerate(lines) if "del waiters[-1]" in text)
    there, go = threading.Event(), threading.Event()

    def tracer(frame: FrameType, event: str, arg: object) -> Any:
        if frame.f_code is not code:
            return None
        if event == "line" and frame.f_lineno == held_at and not there.is_set():
            there.set()
            go.wait(JOIN_S)
        return tracer

    got: list[str] = []
    patient = started(lambda: got.append(answer.result()))
    time.sleep(0.1)  # (waiting first, most likely)
    brief = started(lambda: got.append(answer.result(0.2)))
    time.sleep(0.05)

    def set_it() -> None:
        sys.settrace(tracer)
        try:
            answer.set_result("in")
        finally:
            sys.settrace(None)

    setter = started(set_it)
    assert there.wait(JOIN_S)
    joined(brief)  # its wait timed out; the answer was set by then: it has the result
    go.set()
    joined(setter, patient)
    assert got == ["in", "in"]


@pytest.fixture
def sigint_raises() -> Iterator[Callable[[float], threading.Thread]]:
    """A thread that sends SIGINT to the main thread after a delay (default handler)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    threads: list[threading.Thread] = []

    def after(delay_s: float) -> threading.Thread:
        main = threading.main_thread().ident
        assert main is not None and threading.get_ident() == main

        def send() -> None:
            time.sleep(delay_s)
            signal.pthread_kill(main, signal.SIGINT)

        thread = started(send)
        threads.append(thread)
        return thread

    try:
        yield after
    finally:
        joined(*threads)
        signal.signal(signal.SIGINT, previous)


def test_a_ctrl_c_while_waiting_leaves_the_answer_to_be_set_and_waited_for(
        sigint_raises: Callable[[float], threading.Thread]) -> None:
    answer: Answer[str] = Answer()
    other: list[str] = []
    waiting = started(lambda: other.append(answer.result(JOIN_S * 3)))
    for timeout in (None, JOIN_S * 3):  # interrupted waiting without a timeout, and with
        sender = sigint_raises(0.1)
        with pytest.raises(KeyboardInterrupt):
            answer.result(timeout)
        joined(sender)
    assert not answer.done()
    answer.set_result("in")
    joined(waiting)
    assert other == ["in"] and answer.result() == "in"


def test_a_ctrl_c_in_a_callback_still_runs_the_others_and_wakes_the_waiters() -> None:
    answer: Answer[str] = Answer()
    seen: list[str] = []

    def interrupted() -> None:
        seen.append("interrupted")
        raise KeyboardInterrupt

    answer.add_done_callback(lambda: seen.append("first"))
    answer.add_done_callback(interrupted)
    answer.add_done_callback(lambda: seen.append("last"))
    got: list[Any] = []
    waiter = started(lambda: got.append(answer.result(JOIN_S * 3)))
    time.sleep(0.05)
    with pytest.raises(KeyboardInterrupt):  # raised to the setting thread, once told
        answer.set_result("in")
    joined(waiter)
    assert seen == ["first", "interrupted", "last"] and got == ["in"]
    assert answer.result(0) == "in"


RACE_JOIN_S = 10.0


def test_a_wait_timing_out_as_the_result_arrives_gives_the_result_or_deadline_exceeded(
) -> None:
    """``Submission.result``'s wait times out as the answer is set: the result (it is in)
    or ``DeadlineExceeded``, never a bare ``TimeoutError`` (docs/runtime.md)."""
    answer = RequestAnswer("r1")
    submission = Submission("r1", None, RequestTracker("p"), None, lambda: None, answer)
    code = Submission.result.__code__
    lines, first = inspect.getsourcelines(Submission.result)
    held_at = first + next(i for i, text in enumerate(lines)
                           if "if self._answer.done()" in text)
    there, go = threading.Event(), threading.Event()

    def tracer(frame: FrameType, event: str, arg: object) -> Any:
        if frame.f_code is not code:
            return None
        if event == "line" and frame.f_lineno == held_at and not there.is_set():
            there.set()
            go.wait(RACE_JOIN_S)
        return tracer

    outcome: list[object] = []

    def wait() -> None:
        sys.settrace(tracer)
        try:
            outcome.append(submission.result(0.01))
        except BaseException as exc:
            outcome.append(exc)
        finally:
            sys.settrace(None)

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    assert there.wait(RACE_JOIN_S)  # its wait timed out: not set then
    result = object()
    answer.settle(result, None)  # type: ignore[arg-type]  # (the result comes in now)
    go.set()
    waiter.join(RACE_JOIN_S)
    assert not waiter.is_alive()
    got = outcome[0]
    # Either is right: the result (it is in), or DeadlineExceeded (the wait was over).
    # Never a bare TimeoutError with no result and no DeadlineExceeded.
    assert got is result or isinstance(got, DeadlineExceeded), repr(got)
