"""Fixtures of the host tests: every test fails if it leaks a process, segment or fd."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from edge_core.host import Route, WorkerClient, start_worker
from edge_core.testing.leaks import no_leaks as _no_leaks

WORKERS = Path(__file__).parent / "workers"

no_leaks = pytest.fixture(autouse=True)(_no_leaks)


def test_route(factory: str, **kwargs: Any) -> Route:
    """A default route to a factory of ``workers/edge_test_workers.py``."""
    return Route.default(factory, f"edge_test_workers:{factory}", python_path=(str(WORKERS),))


test_route.__test__ = False  # type: ignore[attr-defined]


@pytest.fixture
def start() -> Iterator[Callable[..., WorkerClient]]:
    """Start workers of the test module; every one is retired (and verified) at teardown."""
    started: list[WorkerClient] = []

    def _start(factory: str = "echo", **kwargs: Any) -> WorkerClient:
        kwargs.setdefault("generation", 1)
        client = start_worker(test_route(factory), **kwargs)
        started.append(client)
        return client

    yield _start
    for client in started:
        outcome = client.retire(deadline_s=5.0)
        assert outcome.verified, outcome
