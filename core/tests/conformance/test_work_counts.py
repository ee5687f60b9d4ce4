"""The test kit's work counters count what a step does, and only that."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from itertools import repeat

import pytest

from edge_core.testing.work_counts import bytecodes, python_calls


def _leaf() -> int:
    return 1


def _two_calls() -> None:
    _leaf()
    _leaf()


def test_python_calls_counts_what_the_step_calls_and_not_the_step() -> None:
    count = python_calls(repeat(_two_calls, 10))
    assert count.per_call == 2
    assert count.busiest[0][0].endswith(":_leaf") and count.busiest[0][1] == 20


def test_a_step_built_by_a_generator_is_counted_without_its_building() -> None:
    def steps() -> Iterator[Callable[[], object]]:
        for _ in range(4):
            _two_calls()  # building the step: not counted
            yield _leaf

    count = python_calls(steps())
    assert count.per_call == 0  # the step's own entry is left out of the figure
    assert [(name.rsplit(":", 1)[1], n) for name, n in count.busiest] == [("_leaf", 4)]


def test_bytecodes_leave_out_the_steps_own_and_count_its_callees() -> None:
    own = bytecodes(repeat(_leaf, 5))
    assert own.per_call == 0
    nested = bytecodes(repeat(_two_calls, 5))
    assert nested.per_call > 0
    assert {name.rsplit(":", 1)[1] for name, _ in nested.busiest} == {"_leaf"}


def test_no_steps_is_an_error() -> None:
    with pytest.raises(ValueError, match="python_calls"):
        python_calls([])
    with pytest.raises(ValueError, match="bytecodes"):
        bytecodes([])


def test_the_counters_leave_no_hook_behind() -> None:
    python_calls(repeat(_two_calls, 2))
    bytecodes(repeat(_two_calls, 2))
    assert sys.getprofile() is None and sys.gettrace() is None


def test_the_median_is_the_usual_steps_count_and_the_mean_counts_the_rare_ones() -> None:
    # One step in ten meets a rare event (its callee calls _leaf five times more): the
    # median is what the others cost, the mean carries the rare step's share
    def steps() -> Iterator[Callable[[], object]]:
        for i in range(10):
            yield (lambda: [_leaf() for _ in range(6)]) if i == 3 else _leaf_once

    calls = python_calls(steps())
    assert calls.median == 1  # _leaf
    assert calls.per_call == pytest.approx((9 * 1 + 1 * 7) / 10)  # (the comprehension too)
    usual = bytecodes(repeat(_leaf_once, 10))
    rare = bytecodes(steps())
    assert rare.median == usual.median == usual.per_call > 0
    assert rare.per_call > usual.per_call


def _leaf_once() -> int:
    return _leaf()
