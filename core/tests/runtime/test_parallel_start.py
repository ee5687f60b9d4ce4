"""Stages admitted together start in parallel; the reservation stays one step, first.

Real echo workers. The order of the opener's progress lines shows the overlap without
timing anything: with a load delay on every stage, every stage is loading before any is
warmed up (a serial start would alternate). The ledger is checked at the first load:
everything is already reserved. A stage that fails while the others start unwinds all of
them: nothing charged, no worker, no shared-memory segment left (the leak fixture).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from edge_core.config import load_pipeline
from edge_core.errors import ResourceUnavailable
from edge_core.host.errors import RemoteError
from edge_core.ledger import ResourceLedger
from edge_core.plugins import PluginSet
from edge_core.runtime import NumericsRefused, Pipeline

from .conftest import GiB, MiB, echo_stage

DELAY_S = 1.5  # long enough that a serial start could not interleave the lines


class Recorder:
    """The progress lines, with the ledger's charge when each stage starts loading."""

    def __init__(self, ledger: ResourceLedger) -> None:
        self.ledger = ledger
        self.lines: list[str] = []
        self.reserved_at_load: list[int] = []

    def __call__(self, line: str) -> None:
        if line.startswith("loading stage"):
            self.reserved_at_load.append(self.ledger.reserved("machine:ram"))
        self.lines.append(line)

    def first(self, prefix: str) -> int:
        return next(i for i, line in enumerate(self.lines) if line.startswith(prefix))

    def last(self, prefix: str) -> int:
        return max(i for i, line in enumerate(self.lines) if line.startswith(prefix))


def _chain(*stages: dict[str, Any]) -> Any:
    return load_pipeline({"name": "par", "stages": list(stages)})


def test_stages_start_in_parallel_after_the_whole_plan_is_reserved(
        plugins: PluginSet, ledger: ResourceLedger) -> None:
    config = _chain(echo_stage("a", load_delay_s=DELAY_S),
                    echo_stage("b", load_delay_s=DELAY_S,
                               transform="edge_echo.transforms:passthrough"),
                    echo_stage("c", load_delay_s=DELAY_S, scale=3.0,
                               transform="edge_echo.transforms:passthrough"))
    say = Recorder(ledger)
    with Pipeline.open(config, plugins, ledger, progress=say) as pipeline:
        assert say.last("loading stage") < say.first("warming up stage"), say.lines
        # admission before load: every stage's demand was charged before any loaded
        assert say.reserved_at_load == [3 * 256 * MiB] * 3
        x = np.ones((2, 2), np.float32)
        with pipeline.run({"x": x}) as result:
            np.testing.assert_array_equal(result.outputs["x"], x * 2 * 2 * 3)
        assert [s["id"] for s in pipeline.execution_plan()["stages"]] == ["a", "b", "c"]
    assert ledger.is_empty()


def test_replicas_of_a_stage_start_in_parallel(
        plugins: PluginSet, ledger: ResourceLedger) -> None:
    stage = {**echo_stage("a", load_delay_s=DELAY_S), "replicas": 2}
    say = Recorder(ledger)
    with Pipeline.open(_chain(stage), plugins, ledger, progress=say) as pipeline:
        assert say.last("loading stage") < say.first("warming up stage"), say.lines
        assert len(pipeline.execution_plan()["stages"]) == 2
    assert ledger.is_empty()


@pytest.mark.parametrize("fail_at", ["load", "warmup"])
def test_a_stage_failing_while_the_others_start_unwinds_every_one(
        plugins: PluginSet, ledger: ResourceLedger, fail_at: str) -> None:
    config = _chain(echo_stage("a", load_delay_s=DELAY_S),
                    echo_stage("b", fail_at=fail_at,
                               transform="edge_echo.transforms:passthrough"),
                    echo_stage("c", load_delay_s=DELAY_S,
                               transform="edge_echo.transforms:passthrough"))
    say = Recorder(ledger)
    with pytest.raises(RemoteError):
        Pipeline.open(config, plugins, ledger, progress=say)
    # the slow ones were loading when b failed; they finished and were retired too
    assert sum(line.startswith("loading stage") for line in say.lines) == 3
    assert ledger.is_empty()


def test_the_first_failure_in_data_flow_order_is_raised_with_the_others_as_notes(
        plugins: PluginSet, ledger: ResourceLedger) -> None:
    config = _chain(echo_stage("a", load_delay_s=DELAY_S),
                    echo_stage("b", wrong_numerics=True, load_delay_s=DELAY_S,
                               transform="edge_echo.transforms:passthrough"),
                    echo_stage("c", fail_at="load",
                               transform="edge_echo.transforms:passthrough"))
    with pytest.raises(NumericsRefused) as info:
        Pipeline.open(config, plugins, ledger)
    assert "stages[b]" in str(info.value)
    notes = getattr(info.value, "__notes__", [])
    assert any(note.startswith("stage c also failed while starting: RemoteError")
               for note in notes), notes
    assert ledger.is_empty()


def test_a_plan_that_does_not_fit_starts_nothing(
        plugins: PluginSet, ledger: ResourceLedger) -> None:
    config = _chain(echo_stage("a", demand=3 * GiB, load_delay_s=DELAY_S),
                    echo_stage("b", demand=2 * GiB,
                               transform="edge_echo.transforms:passthrough"))
    say = Recorder(ledger)
    with pytest.raises(ResourceUnavailable):
        Pipeline.open(config, plugins, ledger, progress=say)
    assert not any(line.startswith("loading stage") for line in say.lines)
    assert ledger.is_empty()
