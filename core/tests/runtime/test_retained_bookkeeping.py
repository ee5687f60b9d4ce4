"""PendingCall's bookkeeping of outputs that are views of worker memory (no worker needed).

A stand-in stage accepts every event; the events are real StageEvents and the outputs
real RetainedOutputs whose release is recorded, so each rule is checked exactly.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import attrs
import numpy as np
import pytest

from edge_contracts.requests import EventKind, Operation, StageEvent, StageRequest
from edge_core.backend import CancelOutcome
from edge_core.runtime import OutputReleased
from edge_core.runtime.pending import PendingCall
from edge_core.runtime.results import AckOutcome, ResultKey
from edge_core.stage import RetainedOutputs


class AcceptingStage:
    """A CallStage standing in for StageRuntime: every event accepted, cancels recorded."""

    def __init__(self) -> None:
        self.cancelled: list[str] = []

    def accept(self, request_id: str, serial: int, event: StageEvent | None) -> bool:
        return True

    def ack(self, key: Any) -> AckOutcome:
        return AckOutcome.ACKNOWLEDGED

    def cancel(self, request_id: str | None = None) -> CancelOutcome:
        self.cancelled.append(str(request_id))
        return CancelOutcome.CANCELLED_IN_PLACE


def event(seq: int, kind: EventKind) -> StageEvent:
    return StageEvent("r", "s", 0, 1, seq, kind, kind.terminal)


def pending(items: list[tuple[StageEvent, Mapping[str, Any]]]) -> tuple[PendingCall, Any]:
    stage = AcceptingStage()
    request = StageRequest("r", "s", 0, 1, Operation.GENERATE)
    events: Iterator[tuple[StageEvent, Mapping[str, Any]]] = iter(items)
    return PendingCall(stage, request, 1, events), stage  # type: ignore[arg-type]


def test_a_private_output_replacing_a_shared_one_survives_the_ack() -> None:
    released: list[bool] = []
    shared = RetainedOutputs({"x": np.zeros(4)}, lambda: released.append(True) or False)
    call, _ = pending([(event(0, EventKind.OUTPUT), shared),
                       (event(1, EventKind.DONE), {"x": np.ones(2)})])
    result = call.result()
    del shared
    assert result.ack() is AckOutcome.ACKNOWLEDGED
    assert released == [True]  # the shared memory went back
    np.testing.assert_array_equal(result.outputs["x"], np.ones(2))  # the private one stays


def test_shared_outputs_are_released_by_the_ack_and_say_so_when_read() -> None:
    released: list[bool] = []
    shared = RetainedOutputs({"y": np.zeros(3)}, lambda: released.append(True) or False)
    call, _ = pending([(event(0, EventKind.DONE), shared)])
    del shared
    result = call.result()
    result.ack()
    result.ack()  # the second ack releases nothing more
    assert released == [True]
    with pytest.raises(OutputReleased, match=r"request\[r\]\.outputs\.y"):
        result.outputs["y"]
    with pytest.raises(KeyError):
        result.outputs["never-there"]


def test_cancelling_after_taking_events_gives_their_memory_back() -> None:
    released: list[bool] = []
    call, stage = pending([(event(0, EventKind.OUTPUT),
                            RetainedOutputs({"z": np.zeros(2)},
                                            lambda: released.append(True) or False)),
                           (event(1, EventKind.OUTPUT), {})])
    stream = call.events()
    next(stream)
    assert call.cancel() is CancelOutcome.CANCELLED_IN_PLACE
    assert stage.cancelled == ["r"] and released == [True]
    call.cancel()
    assert released == [True]  # once


def test_a_view_still_held_at_the_ack_is_reported() -> None:
    call, _ = pending([(event(0, EventKind.DONE),
                        RetainedOutputs({"w": np.zeros(2)}, lambda: True))])
    result = call.result()
    with pytest.warns(ResourceWarning, match=r"outputs \['w'\] were still referenced"):
        result.ack()


def test_a_results_key_is_the_one_its_constructor_makes() -> None:
    """Built on a draft (edge_contracts.drafts), the key is a plain frozen ResultKey."""
    call, _ = pending([(event(0, EventKind.DONE), {"x": np.ones(2)})])
    key = call.result().key
    assert type(key) is ResultKey and key == ResultKey("r", 0, 1, 1)
    assert hash(key) == hash(ResultKey("r", 0, 1, 1))
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        key.serial = 2  # type: ignore[misc]
