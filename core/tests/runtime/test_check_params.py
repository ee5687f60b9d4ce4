"""A lone stage's ``check_params`` refuses a request's parameters before admission.

Real echo workers. The loaded stage (a real ``WorkerStage``) is given the optional
``check_params(params)`` of :class:`edge_core.stage.LoadedStage` as an attribute, as a
generate backend's stage has it as a method. Where the caller's parameters reach the
final stage as they are (one stage of one replica), ``run``, ``stream``, ``submit`` and
``check_params`` call it with the parameters as a dict (empty when none were given), and
what it raises is raised before any admission slot, stage slot or worker is touched.
Anywhere else (two stages, two replicas) it is not asked.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from edge_contracts.errors import InvalidValue
from edge_core.runtime import Pipeline

from .conftest import OpenPipeline, echo_stage

X = {"x": np.arange(4, dtype=np.float32)}


def _checking(pipeline: Pipeline, stage: int = 0) -> list[dict[str, Any]]:
    """Give a stage's loaded handle a ``check_params`` refusing ``bad``; the params it saw."""
    seen: list[dict[str, Any]] = []

    def check_params(params: dict[str, Any]) -> None:
        seen.append(params)
        if "bad" in params:
            raise InvalidValue("params.bad", params["bad"], "refused by the stage")

    pipeline.stages[stage].loaded.check_params = check_params  # type: ignore[attr-defined]
    return seen


def _untouched(pipeline: Pipeline) -> None:
    assert pipeline.admission.used == 0
    for runtime in pipeline.stages:
        assert runtime.slots.used == 0 and runtime.outstanding == 0
        assert runtime.loaded.client.outstanding() == 0  # type: ignore[attr-defined]


def test_a_lone_stage_refuses_bad_params_before_admission(open_pipeline: OpenPipeline) -> None:
    pipeline = open_pipeline(echo_stage("s", scale=1.0))
    seen = _checking(pipeline)
    with pipeline.run(X) as result:  # no params: asked with an empty dict
        np.testing.assert_array_equal(result.outputs["x"], X["x"])
    assert seen == [{}]
    for refused in (lambda: pipeline.run(X, params={"bad": 1}),
                    lambda: pipeline.submit(X, params={"bad": 2}),
                    lambda: list(pipeline.stream(X, params={"bad": 3})),
                    lambda: pipeline.check_params({"bad": 4})):
        with pytest.raises(InvalidValue, match=r"params\.bad.*refused by the stage"):
            refused()
        _untouched(pipeline)
    assert [params.get("bad") for params in seen[1:]] == [1, 2, 3, 4]
    assert all(type(params) is dict for params in seen)
    with pipeline.run(X, params={"delay_s": 0.0}) as result:  # the stage serves on
        np.testing.assert_array_equal(result.outputs["x"], X["x"])
    assert seen[-1] == {"delay_s": 0.0}


def test_params_that_do_not_reach_a_lone_stage_are_not_checked(
    open_pipeline: OpenPipeline,
) -> None:
    chain = open_pipeline(echo_stage("a", scale=1.0), echo_stage(
        "b", scale=1.0, transform="edge_echo.transforms:passthrough"), name="chain")
    seen = _checking(chain, 1)
    with chain.run(X, params={"bad": 1}) as result:  # a later stage of a chain: not asked
        np.testing.assert_array_equal(result.outputs["x"], X["x"])
    assert seen == []
    stage = echo_stage("r", backend="echo-preemptible", scale=1.0)
    stage["replicas"] = 2
    replicas = open_pipeline(stage, name="replicas")
    seen = _checking(replicas)
    with replicas.run(X, params={"bad": 1}) as result:  # two replicas: not asked
        np.testing.assert_array_equal(result.outputs["x"], X["x"])
    assert seen == []
