"""Pipeline inputs named ``carry:*`` skip the first stage and reach every transform."""

from __future__ import annotations

import numpy as np

from .conftest import OpenPipeline, echo_stage


def test_carried_pipeline_inputs_reach_the_transforms_not_the_first_stage(
    open_pipeline: OpenPipeline,
) -> None:
    pipeline = open_pipeline(
        echo_stage("first", scale=2.0),
        echo_stage("second", transform="edge_echo.ends:add_carried_offset", scale=1.0),
    )
    x = np.array([1.0, 2.0], np.float32)
    offset = np.array([10.0, 20.0], np.float32)
    with pipeline.run({"x": x, "carry:offset": offset}) as result:
        np.testing.assert_array_equal(result.outputs["x"], x * 2 + offset)
