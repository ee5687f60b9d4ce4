"""A Ctrl-C at each point CPython acts on a signal, in the main thread, in Answer's code.

The points are those of core/tests/host/test_interrupted_waits.py (a function's entry, the
instruction after each CALL / CALL_FUNCTION_EX / backward jump). Setting the answer, waiting
for it and adding a callback, each interrupted at every point: every waiting thread is
woken and every callback runs once, in the thread that set the answer, and none raises
there; a losing ``settle`` (the answer set by another thread already) cut short tells
nobody (it ran the winner's callbacks in the interrupted thread, beside the winner).
"""

from __future__ import annotations

import inspect
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

import pytest

from edge_core.runtime.answer import Answer
from edge_core.testing.interrupts import Interrupter, run_interrupted, until

JOIN_S = 5.0


SETTING = frozenset({"Answer.settle", "Answer._tell", "Answer.set_result"})


def _set_with_interrupt(k: int) -> tuple[bool, str, int]:
    answer: Answer[str] = Answer()
    got: list[str] = []
    waiters = [threading.Thread(target=lambda: got.append(answer.result()), daemon=True),
               threading.Thread(target=lambda: got.append(answer.result(JOIN_S * 4)),
                                daemon=True)]
    for thread in waiters:
        thread.start()
    assert until(lambda: answer._waiters is not None and len(answer._waiters) == 2, JOIN_S)
    runs = {"a": 0, "b": 0, "c": 0}

    def bump(name: str) -> Callable[[], None]:
        def run() -> None:
            runs[name] += 1
        return run

    for name in runs:
        answer.add_done_callback(bump(name))
    tracer = Interrupter(k, SETTING)
    interrupted = run_interrupted(tracer, lambda: answer.set_result("in"))
    if not answer.done():  # cut short before it was set: set it now, untraced
        answer.set_result("in")
    for thread in waiters:
        thread.join(JOIN_S)
    assert not any(t.is_alive() for t in waiters), f"a waiter never woken: {tracer.where}"
    assert got == ["in", "in"], tracer.where
    assert runs == {"a": 1, "b": 1, "c": 1}, (tracer.where, runs)
    return interrupted, tracer.where, tracer.points


def test_ctrl_c_at_each_point_of_a_setting_thread_tells_everyone_once() -> None:
    k, swept = 1, []
    while True:
        interrupted, where, _ = _set_with_interrupt(k)
        if not interrupted:
            break
        swept.append(where)
        k += 1
    assert len(swept) > 5, swept


WAITING = frozenset({"Answer.result", "Answer._wait"})


def _wait_with_interrupt(k: int, timeout: float | None) -> bool:
    answer: Answer[str] = Answer()
    other: list[str] = []
    waiter = threading.Thread(target=lambda: other.append(answer.result()), daemon=True)
    waiter.start()
    assert until(lambda: answer._waiters is not None and len(answer._waiters) == 1, JOIN_S)
    setter = threading.Timer(0.02, lambda: answer.set_result("in"))
    setter.start()
    tracer = Interrupter(k, WAITING)
    interrupted = run_interrupted(tracer, lambda: answer.result(timeout))
    setter.join(JOIN_S)
    waiter.join(JOIN_S)
    assert not waiter.is_alive() and other == ["in"], tracer.where
    assert answer.result(0) == "in"
    assert not answer._waiters, (tracer.where, answer._waiters)
    return interrupted


@pytest.mark.parametrize("timeout", [None, JOIN_S * 4])
def test_ctrl_c_at_each_point_of_a_waiting_thread_leaves_it_whole(timeout: float | None) -> None:
    k = 1
    while _wait_with_interrupt(k, timeout):
        k += 1
    assert k > 3


ADDING = frozenset({"Answer.add_done_callback", "_call"})


def _add_with_interrupt(k: int, set_first: bool) -> bool:
    answer: Answer[str] = Answer()
    if set_first:
        answer.set_result("in")
    runs: list[int] = []
    tracer = Interrupter(k, ADDING)
    interrupted = run_interrupted(tracer, lambda: answer.add_done_callback(lambda: runs.append(1)))
    if not answer.done():
        answer.set_result("in")
    assert len(runs) <= 1, tracer.where
    if not interrupted:
        assert runs == [1]
    return interrupted


@pytest.mark.parametrize("set_first", [False, True])
def test_ctrl_c_at_each_point_of_add_done_callback_runs_it_at_most_once(set_first: bool) -> None:
    k = 1
    while _add_with_interrupt(k, set_first):
        k += 1
    assert k > 1


LONG_S = 10.0


def _losing_settle_interrupted(answer: Answer[str]) -> str:
    """settle() on a set answer, in this (the main) thread, cut at its lock's exit."""
    tracer = Interrupter(2, frozenset({"Answer.settle"}))  # 1: entry, 2: after __exit__
    assert run_interrupted(tracer, lambda: answer.settle("second", None))
    return tracer.where


def test_a_losing_settle_cut_short_runs_no_callback_of_the_winners() -> None:
    answer: Answer[str] = Answer()
    inside, go = threading.Event(), threading.Event()
    ran: list[tuple[str, int]] = []

    def first() -> None:  # the winner is in its first callback as the loser is cut short
        ran.append(("first", threading.get_ident()))
        inside.set()
        go.wait(LONG_S)

    answer.add_done_callback(first)
    answer.add_done_callback(lambda: ran.append(("second", threading.get_ident())))
    answer.add_done_callback(lambda: ran.append(("third", threading.get_ident())))
    winner = threading.Thread(target=lambda: answer.set_result("first"), daemon=True)
    winner.start()
    assert inside.wait(LONG_S)
    where = _losing_settle_interrupted(answer)
    go.set()
    winner.join(LONG_S)
    assert not winner.is_alive()
    # Every callback once, each in the thread that set the answer
    assert [name for name, _ in ran] == ["first", "second", "third"], ran
    assert {ident for _, ident in ran} == {winner.ident}, (where, ran, winner.ident,
                                                          threading.get_ident())


def test_a_losing_settle_cut_short_raises_nothing_in_the_setting_thread() -> None:
    # The setting thread is held where a thread switch can come (the loop's backward jump,
    # at its next callback's line) as the interrupted losing settle empties the list
    answer: Answer[str] = Answer()
    code = Answer._tell.__code__
    lines, first = inspect.getsourcelines(Answer._tell)
    held_at = first + next(i for i, text in enumerate(lines) if "callback = callbacks[0]" in text)
    seen = [0]
    there, go = threading.Event(), threading.Event()

    def tracer(frame: FrameType, event: str, arg: object) -> Any:
        if frame.f_code is not code:
            return None
        if event == "line" and frame.f_lineno == held_at:
            seen[0] += 1
            if seen[0] == 2:  # the second turn of the loop (after its backward jump)
                there.set()
                go.wait(LONG_S)
        return tracer

    for _ in range(2):
        answer.add_done_callback(lambda: None)
    raised: list[BaseException] = []

    def set_it() -> None:
        sys.settrace(tracer)
        try:
            answer.set_result("first")
        except BaseException as exc:
            raised.append(exc)
        finally:
            sys.settrace(None)

    winner = threading.Thread(target=set_it, daemon=True)
    winner.start()
    assert there.wait(LONG_S)
    _losing_settle_interrupted(answer)
    go.set()
    winner.join(LONG_S)
    assert raised == [], raised
