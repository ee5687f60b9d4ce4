"""Runtime tests run the real edge-echo backend in real worker processes.

Every test fails if it leaks a process, a shared-memory segment or a descriptor, and
every ledger is checked empty (or exactly as quarantined as the test expects).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from edge_core.config import load_pipeline
from edge_core.ledger import ResourceLedger
from edge_core.plugins import PluginSet, load_plugins
from edge_core.pools import Pool
from edge_core.runtime import Pipeline
from edge_core.testing.leaks import no_leaks as _no_leaks

no_leaks = pytest.fixture(autouse=True)(_no_leaks)

GiB = 1024**3
MiB = 1024**2


@pytest.fixture(scope="session")
def plugins() -> PluginSet:
    return load_plugins(env={"EDGE_PLUGINS": "echo,ort-directml"})


@pytest.fixture
def ledger() -> ResourceLedger:
    """Host RAM as a 4 GiB pool (a real ledger over a declared pool)."""
    return ResourceLedger([Pool(name="machine:ram", total=4 * GiB)])


def echo_stage(stage_id: str, *, backend: str = "echo", transform: str | None = None,
               demand: int | None = None, **options: Any) -> dict[str, Any]:
    stage: dict[str, Any] = {"id": stage_id, "backend": {"name": backend, "options": options}}
    if transform:
        stage["input_transform"] = transform
    if demand is not None:
        stage["resources"] = {"demands": {"machine:ram": demand}}
    return stage


OpenPipeline = Callable[..., Pipeline]


@pytest.fixture
def open_pipeline(plugins: PluginSet, ledger: ResourceLedger) -> Iterator[OpenPipeline]:
    """Open pipelines from stage dicts; closes whatever is still open after the test."""
    opened: list[Pipeline] = []

    def make(*stages: dict[str, Any], admission: int = 1, name: str = "t") -> Pipeline:
        config = load_pipeline({"name": name, "admission": admission, "stages": list(stages)})
        pipeline = Pipeline.open(config, plugins, ledger, retire_deadline_s=3.0)
        opened.append(pipeline)
        return pipeline

    yield make
    for pipeline in opened:
        pipeline.close()
