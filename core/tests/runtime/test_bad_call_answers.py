"""An ``edge_call`` that breaks the hook contract fails its request, naming the plugin.

Real echo workers; each stage's bound ``edge_call`` is replaced by one answering what a
third-party plugin might by mistake: a value that is not an iterator, or a stream whose
items are not ``(StageEvent, outputs)`` pairs. The request fails typed, its slot is
freed, and the next request with the real hook is served.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import numpy as np
import pytest

from edge_core.errors import PluginError
from edge_core.runtime import Pipeline
from edge_core.runtime.errors import RequestFailed

from .conftest import OpenPipeline, echo_stage

X = {"x": np.arange(4, dtype=np.float32)}


def _answering(pipeline: Pipeline, answer: Callable[..., Any]) -> Callable[[], None]:
    """Make the stage's edge_call answer ``answer(...)``; return the undo."""
    (runtime,) = pipeline.stages
    real = runtime.binding

    def call(loaded: Any, request: Any, inputs: Any) -> Any:
        real.call(loaded, request, inputs)  # sent for real: the worker's answer is unread
        return answer()

    runtime.binding = attrs.evolve(real, call=call)

    def undo() -> None:
        runtime.binding = real

    return undo


def _serves_again(pipeline: Pipeline, undo: Callable[[], None]) -> None:
    (runtime,) = pipeline.stages
    assert pipeline.admission.used == 0
    assert runtime.slots.used == 0 and runtime.outstanding == 0
    undo()
    with pipeline.run(X, deadline_s=10.0) as result:
        np.testing.assert_array_equal(result.outputs["x"], X["x"])


def test_an_answer_that_is_not_an_iterator_is_a_plugin_error(
        open_pipeline: OpenPipeline) -> None:
    pipeline = open_pipeline(echo_stage("s", backend="echo-preemptible", scale=1.0))
    undo = _answering(pipeline, lambda: 5)
    with pytest.raises(PluginError, match=r"stages\[s\]: plugin 'echo': edge_call did not "
                       r"return an iterator of \(StageEvent, outputs\) pairs "
                       r"\('int' object is not iterable\)"):
        pipeline.run(X, deadline_s=10.0)
    _serves_again(pipeline, undo)


def test_a_stream_item_that_is_not_an_event_pair_fails_the_request(
        open_pipeline: OpenPipeline) -> None:
    pipeline = open_pipeline(echo_stage("s", backend="echo-preemptible", scale=1.0))
    undo = _answering(pipeline, lambda: iter([1]))
    with pytest.raises(RequestFailed, match=r"stages\[s\]: plugin 'echo': edge_call's stream "
                       r"yielded an item that is not a \(StageEvent, outputs\) pair "
                       r"\(cannot unpack non-iterable int object\)") as raised:
        pipeline.run(X, deadline_s=10.0)
    assert raised.value.error_type == "PluginError"
    _serves_again(pipeline, undo)


def _raising(error: Exception) -> Any:
    """A stream that raises ``error`` at its first item (a plugin's own failure)."""
    raise error
    yield  # pragma: no cover - a generator function


@pytest.mark.parametrize("error", [ValueError("the plugin's stream broke"),
                                   TypeError("the plugin's stream broke"),
                                   RuntimeError("the plugin's stream broke")])
def test_a_stream_raising_its_own_error_fails_the_request_and_frees_its_slot(
        open_pipeline: OpenPipeline, error: Exception) -> None:
    """The plugin's own error is raised as it is (it is not the hook's contract broken),
    and the request ends on its stage: its slot was kept taken, so the next request to
    the stage waited for it for ever (``DeadlineExceeded`` waiting for a slot)."""
    pipeline = open_pipeline(echo_stage("s", backend="echo-preemptible", scale=1.0))
    undo = _answering(pipeline, lambda: _raising(error))
    with pytest.raises(type(error)) as raised:
        pipeline.run(X, deadline_s=10.0)
    assert raised.value is error
    _serves_again(pipeline, undo)
