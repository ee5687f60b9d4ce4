"""``edge_config_defaults`` end to end: a plugin's defaults apply under the user's options."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from edge_core import hookimpl
from edge_core.backend import BackendInfo, ProbeReport
from edge_core.config import load_pipeline
from edge_core.ledger import ResourceLedger
from edge_core.plugins import load_plugins
from edge_core.pools import Pool
from edge_core.runtime import Pipeline
from edge_echo import plugin as echo


class DefaultingEcho:
    """The echo worker behind a backend whose plugin contributes ``scale = 5``."""

    EDGE_CONTRACT = "1.0"

    @hookimpl
    def edge_backends(self) -> list[BackendInfo]:
        return [BackendInfo(name="echo-defaults", kinds=["graph"], providers=["numpy"])]

    @hookimpl
    def edge_probe(self) -> list[ProbeReport]:
        return [ProbeReport(backend="echo-defaults", available=True)]

    @hookimpl
    def edge_config_defaults(self, backend: str) -> Mapping[str, Any]:
        return {"scale": 5.0, "example_shape": [3]}

    @hookimpl
    def edge_validate_stage(self, backend: str, section: Mapping[str, Any], path: str) -> Any:
        return echo.edge_validate_stage(backend, section, path)

    @hookimpl
    def edge_reserve(self, stage: Any) -> Mapping[str, int]:
        return echo.edge_reserve(stage)

    @hookimpl
    def edge_load(self, stage: Any) -> Any:
        return echo.edge_load(stage)

    @hookimpl
    def edge_warmup_placement(self, loaded: Any) -> Any:
        return echo.edge_warmup_placement(loaded)

    @hookimpl
    def edge_call(self, loaded: Any, request: Any, inputs: Mapping[str, Any]) -> Iterator[Any]:
        return echo.edge_call(loaded, request, inputs)

    @hookimpl
    def edge_retire(self, loaded: Any, deadline_s: float) -> Any:
        return echo.edge_retire(loaded, deadline_s)


def run_with(options: Mapping[str, Any]) -> list[float]:
    plugins = load_plugins(objects={"defaults": DefaultingEcho()}, env={"EDGE_PLUGINS": ""})
    config = load_pipeline({"name": "d", "stages": [
        {"id": "s", "backend": {"name": "echo-defaults", "options": dict(options)}}]})
    ledger = ResourceLedger([Pool(name="machine:ram", total=2**32)])
    with Pipeline.open(config, plugins, ledger) as pipeline, \
            pipeline.run({"x": np.ones(3, np.float32)}) as result:
        values: list[float] = result.outputs["x"].tolist()
    assert ledger.is_empty()
    return values


def test_plugin_defaults_apply_under_the_users_options() -> None:
    assert run_with({}) == [5.0, 5.0, 5.0]
    assert run_with({"scale": 7.0}) == [7.0, 7.0, 7.0]
