"""A retired worker tree leaves no multiprocessing names behind in ``/dev/shm``.

A worker whose own processes use :mod:`multiprocessing` of the spawn kind (vLLM's engine
does) has a resource tracker: a process of its tree that ignores ``SIGTERM`` and unlinks
every named semaphore or shared-memory block still registered once the processes using
them are gone. Killed together with them, it unlinks nothing, and each name stays on the
machine. Both ways a tree ends are checked: the worker leaves on ``SIGTERM`` (its
supervisor kills the rest) and the worker ignores it (the controller kills the tree).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from edge_core.host import WorkerClient

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
