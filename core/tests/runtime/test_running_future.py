"""RunningFuture: a request's outcome set once and handed to its one callback, as the
submission of a request sent from an event loop takes it."""

from __future__ import annotations

from typing import Any

import pytest

from edge_core.runtime.submission import RunningFuture, running_future


def test_the_outcome_goes_to_the_callback_once_set() -> None:
    future = running_future()
    seen: list[Any] = []
    future.add_done_callback(seen.append)
    assert not future.cancel() and not future.cancelled() and not future.done()
    with pytest.raises(RuntimeError, match="not set"):
        future.result()
    marker: Any = object()
    future.set_result(marker)
    assert seen == [future] and future.done()
    assert future.result() is marker and future.exception() is None
    with pytest.raises(RuntimeError, match="set already"):
        future.set_exception(ValueError("again"))
    assert seen == [future] and future.result() is marker


def test_an_error_is_raised_by_result_and_a_late_callback_is_called_at_once() -> None:
    future = RunningFuture()
    error = KeyError("failed")
    future.set_exception(error)
    assert future.exception() is error
    with pytest.raises(KeyError):
        future.result()
    seen: list[Any] = []
    future.add_done_callback(seen.append)
    assert seen == [future]
    with pytest.raises(RuntimeError, match="one done callback"):
        future.add_done_callback(seen.append)
