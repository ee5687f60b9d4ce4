"""A retired worker tree leaves no multiprocessing names behind in ``/dev/shm``.

A worker whose own processes use :mod:`multiprocessing` of the spawn kind (vLLM's engine
does) has a resource tracker: a process of its tree that ignores ``SIGTERM`` and unlinks
every named semaphore or shared-memory block still registered once the processes using
them are gone. Killed together with them, it unlinks nothing, and each name stays on the
machine. Both ways a tree ends are checked: the worker leaves on ``SIGTERM`` (its
supervisor kills the rest) and the worker ignores it (the controller kills the tree); and
a worker killed outright, its tracker slow to clean up (its supervisor waits for it).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from edge_core.host import WorkerClient
from edge_core.host.supervisor import TRACKER_GRACE_S, is_tracker

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not Path("/dev/shm").is_dir(),
    reason="named semaphores are files in /dev/shm on Linux only",
)


@pytest.mark.parametrize("ignore_term", [False, True], ids=["terminated", "killed"])
def test_a_retired_tree_leaves_no_semaphore_of_its_processes(
    start: Callable[..., WorkerClient], ignore_term: bool
) -> None:
    client = start("semaphore_holder")
    answer = client.load({"ignore_term": ignore_term})
    name = Path("/dev/shm") / ("sem." + str(answer["semaphore"]).lstrip("/"))
    assert name.exists(), name  # the child holds it: only its tracker would unlink it
    outcome = client.retire(deadline_s=5.0)
    assert outcome.verified, outcome
    if ignore_term:
        assert outcome.escalation == "kill", outcome  # the controller's SIGKILL phase
    assert not name.exists(), f"{name} left behind"


def test_a_tracker_slow_to_clean_up_after_its_worker_was_killed_is_waited_for(
    start: Callable[..., WorkerClient],
) -> None:
    # The worker is killed (SIGKILL: no shutdown of its own); its supervisor kills the rest
    # of the tree. The tracker is held stopped for 1 s across that, as a loaded host can
    # leave it without CPU, or as it waits for a killed process that takes long to go
    # (vLLM's EngineCore: 0.57 s in one run). Spared only 0.5 s from the drain's start,
    # it was killed before it could unlink the name; it is spared until the rest of the
    # tree is gone, then TRACKER_GRACE_S more.
    client = start("semaphore_holder")
    answer = client.load({})
    name = Path("/dev/shm") / ("sem." + str(answer["semaphore"]).lstrip("/"))
    worker = psutil.Process(client.identity.pid)
    (tracker,) = [child for child in worker.children(recursive=True) if is_tracker(child.pid)]
    assert name.exists(), name
    assert TRACKER_GRACE_S > 1.0 + 0.5  # the stop below, with room to clean up
    tracker.suspend()
    try:
        worker.kill()
        time.sleep(1.0)
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):  # killed, where it was not spared
            tracker.resume()
    outcome = client.retire(deadline_s=5.0)
    assert outcome.verified, outcome
    assert not name.exists(), f"{name} left behind"
