"""Fixtures of the host tests: every test fails if it leaks a process, segment or fd."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from edge_contracts.requests import EventKind, Operation, StageRequest
from edge_core.host import Route, WorkerClient, start_worker
from edge_core.testing.leaks import no_leaks as _no_leaks

WORKERS = Path(__file__).parent / "workers"

no_leaks = pytest.fixture(autouse=True)(_no_leaks)


def test_route(factory: str, **kwargs: Any) -> Route:
    """A default route to a factory of ``workers/edge_test_workers.py``."""
    return Route.default(factory, f"edge_test_workers:{factory}", python_path=(str(WORKERS),))


test_route.__test__ = False  # type: ignore[attr-defined]


def request(rid: str, op: Operation = Operation.RUN, **params: object) -> StageRequest:
    """A request of stage ``s0``, epoch 0, generation 1 (the ``start`` fixture's)."""
    return StageRequest(rid, "s0", 0, 1, op, params=params)


def refused(client: WorkerClient, rid: str, op: Operation = Operation.RUN,
            inputs: dict[str, Any] | None = None, **params: object) -> list[Any]:
    """The deliveries of one request, which must end with an ERROR event."""
    call = client.submit(request(rid, op, **params), inputs or {})
    deliveries = []
    while not deliveries or not deliveries[-1].terminal:
        deliveries.append(call.next(timeout=10))
    assert deliveries[-1].kind is EventKind.ERROR, deliveries[-1]
    return deliveries


@pytest.fixture
def start() -> Iterator[Callable[..., WorkerClient]]:
    """Start workers of the test module; every one is retired (and verified) at teardown."""
    started: list[WorkerClient] = []

    def _start(factory: str = "echo", route: Route | None = None, **kwargs: Any) -> WorkerClient:
        kwargs.setdefault("generation", 1)
        client = start_worker(route or test_route(factory), **kwargs)
        started.append(client)
        return client

    yield _start
    for client in started:
        outcome = client.retire(deadline_s=5.0)
        assert outcome.verified, outcome
