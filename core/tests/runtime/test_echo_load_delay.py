"""The echo backend's ``load_delay_s``: a backend that is slow to open, for first-ready tests."""

from __future__ import annotations

import time

import numpy as np
import pytest

from edge_core.errors import ConfigError
from edge_core.ledger import ResourceLedger
from edge_core.plugins import PluginSet

from .conftest import OpenPipeline, echo_stage


def test_a_load_delay_holds_the_open_back_and_not_the_calls(
        open_pipeline: OpenPipeline, ledger: ResourceLedger) -> None:
    started = time.monotonic()
    pipeline = open_pipeline(echo_stage("a", load_delay_s=0.4, scale=3.0))
    assert time.monotonic() - started >= 0.4  # a sleep is never shorter than asked
    with pipeline.run({"x": np.ones((2, 2), np.float32)}) as result:
        np.testing.assert_array_equal(result.outputs["x"], np.full((2, 2), 3.0, np.float32))
    pipeline.close()
    assert ledger.is_empty()


def test_a_negative_load_delay_is_refused_with_its_path(
        plugins: PluginSet, ledger: ResourceLedger) -> None:
    from edge_core.config import load_pipeline
    from edge_core.runtime import Pipeline

    config = load_pipeline({"name": "p", "stages": [echo_stage("a", load_delay_s=-0.5)]})
    with pytest.raises(ConfigError, match=r"stages\[0\]\.backend\.options.*load_delay_s"):
        Pipeline.open(config, plugins, ledger)
    assert ledger.is_empty()
