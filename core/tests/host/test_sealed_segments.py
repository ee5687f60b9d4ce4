"""Sealed memfd segments: a worker cannot shrink memory the controller has mapped.

Reading a mapped page past the end of a file that was shrunk kills the reader with
SIGBUS. With named POSIX segments a worker could do that to its controller; with sealed
segments (the default on Linux) the shrink is refused and the request ends in a typed
error while the controller lives on.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from edge_contracts.requests import Operation, StageRequest
from edge_contracts.sealed import SEALS_AVAILABLE
from edge_core.host.errors import RemoteError

from .conftest import WORKERS

pytestmark = pytest.mark.skipif(not SEALS_AVAILABLE, reason="memfd seals are Linux only")


def request(request_id: str, **params: object) -> StageRequest:
    return StageRequest(request_id, "s0", 0, 1, Operation.RUN, params=dict(params))


def test_a_worker_cannot_shrink_a_segment_the_controller_has_mapped(start):
    client = start("shrinker", shm_threshold=1024)
    assert client.hello["sealed_segments"] is True
    with client.submit(request("r1")).next(timeout=10) as first:  # the controller maps it
        assert int(first.arrays["y"][0]) == 7
    with pytest.raises(RemoteError, match="PermissionError"):
        client.submit(request("r2", shrink=True)).result(timeout=10)  # the same segment
    out = client.submit(request("r3")).result(timeout=10)  # the controller lives on
    np.testing.assert_array_equal(out["y"], np.full(1 << 20, 7, np.uint8))
    assert client.health().ready


# The same with named segments, in a throw-away controller: the shrink succeeds and the
# controller is killed by SIGBUS when it reads its (still mapped) view.
_NAMED = textwrap.dedent(
    """
    import sys
    from edge_contracts.requests import Operation, StageRequest
    from edge_core.host import Route, start_worker
    route = Route.default("s", "edge_test_workers:shrinker", python_path=(sys.argv[1],))
    client = start_worker(route, generation=1, shm_threshold=1024, sealed_segments=False)
    r = lambda i, **p: StageRequest(i, "s0", 0, 1, Operation.RUN, params=p)
    with client.submit(r("r1")).next(timeout=10):
        pass
    out = client.submit(r("r2", shrink=True)).result(timeout=10)
    print("survived", int(out["y"].sum()), flush=True)
    client.retire()
    """
)


def test_named_segments_let_a_worker_kill_its_controller_with_sigbus():
    proc = subprocess.run([sys.executable, "-c", _NAMED, str(WORKERS)], capture_output=True,
                          timeout=60, check=False)
    assert proc.returncode == -signal.SIGBUS, (proc.returncode, proc.stderr[-2000:])
    assert b"survived" not in proc.stdout
