"""Retirement follows the tree as it evolves: escaped orphans, short deadlines, the supervisor."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from edge_core.host.bootstrap import SUPERVISED
from edge_core.host.identity import ProcessIdentity
from edge_core.host.retire import ProcessTree
from edge_core.host.supervisor import supervisor_argv

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux subreaper")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_dead(pid: int, timeout_s: float = 5.0) -> None:
    end = time.monotonic() + timeout_s
    while _alive(pid) and time.monotonic() < end:
        time.sleep(0.01)


def test_workers_run_under_a_subreaping_supervisor(start):
    assert SUPERVISED
    client = start()
    worker = psutil.Process(client.identity.pid)
    supervisor = worker.parent()
    assert supervisor is not None and supervisor.pid == client._tree.root.pid
    assert os.getsid(supervisor.pid) == supervisor.pid  # the session leader
    assert client.hello["pid"] == worker.pid
    assert client.identity == ProcessIdentity.of(worker.pid)


def test_an_escaped_grandchild_is_found_and_killed_after_the_worker_dies(start):
    client = start("escaper")
    escaped = client.load({})["escaped"]
    root = client._tree.root
    assert os.getsid(escaped) not in (root.pid, client.identity.pid)  # left the session
    assert psutil.Process(escaped).ppid() == root.pid  # adopted by the subreaper
    client.health()  # a capture
    assert escaped in {i.pid for i in client._tree.known}
    os.kill(client.identity.pid, signal.SIGKILL)
    outcome = client.retire(deadline_s=5.0)
    assert outcome.verified, outcome
    assert not _alive(escaped)
    assert escaped in {i.pid for i in outcome.tree}


def test_a_sigterm_ignoring_tree_with_a_short_deadline_ends_verified_by_sigkill(start):
    client = start("escaper")
    escaped = client.load({"ignore_term": True})["escaped"]
    outcome = client.retire(deadline_s=0.3)
    assert outcome.verified, outcome
    assert outcome.escalation == "kill"
    assert not _alive(escaped)
    assert not _alive(client.identity.pid)


# A plain program (no edge worker): forks the escaping process, prints its PID, waits.
_MAIN = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', sys.argv[1]], stdout=subprocess.PIPE)\n"
    "print(child.stdout.readline().decode().strip(), flush=True)\n"
    "child.wait()\n"
    "time.sleep(120)\n"
)


def _supervised_escaper() -> tuple[subprocess.Popen[bytes], ProcessTree, int]:
    sys.path.insert(0, str(os.path.join(os.path.dirname(__file__), "workers")))
    try:
        from edge_test_workers import ESCAPE
    finally:
        sys.path.pop(0)
    argv = supervisor_argv([sys.executable, "-c", _MAIN, ESCAPE], controller=os.getpid(),
                           prefixes=[], remove=[])
    popen = subprocess.Popen(argv, stdout=subprocess.PIPE, start_new_session=True)
    tree = ProcessTree(ProcessIdentity.of(popen.pid), popen)
    assert popen.stdout is not None
    escaped = int(popen.stdout.readline())
    popen.stdout.close()
    return popen, tree, escaped


def test_verified_is_never_reported_while_an_escaped_process_lives():
    popen, tree, escaped = _supervised_escaper()
    main = next(p for p in psutil.Process(popen.pid).children() if p.pid != escaped)
    os.kill(popen.pid, signal.SIGSTOP)  # the supervisor cannot clean up by itself
    try:
        os.kill(main.pid, signal.SIGKILL)
        _wait_dead(main.pid)
        assert _alive(escaped)
        found = tree.capture()
        assert escaped in {i.pid for i in found}  # a child of the stopped subreaper
        assert escaped in {i.pid for i in tree.alive()}
    finally:
        outcome = tree.retire(deadline_s=3.0)
    assert outcome.verified, outcome
    assert not _alive(escaped)
    assert popen.returncode is not None


def test_the_supervisor_kills_the_tree_and_cleans_up_when_its_controller_dies(tmp_path):
    # The controller here is a throw-away Python process that starts the supervisor and
    # is then SIGKILLed; the supervisor must take the worker tree and the leftovers down.
    leftover = tmp_path / "edge-stage-test"
    leftover.mkdir()
    prefix = os.urandom(4).hex()
    segment = f"/dev/shm/edge_{prefix}_{os.urandom(8).hex()}"
    with open(segment, "wb") as handle:
        handle.write(b"x")
    code = (
        "import subprocess, sys, time\n"
        "from edge_core.host.supervisor import supervisor_argv\n"
        "argv = supervisor_argv([sys.executable, '-c', 'import time; time.sleep(120)'],\n"
        f"    controller=__import__('os').getpid(), prefixes=[{prefix!r}],\n"
        f"    remove=[{str(leftover)!r}])\n"
        "p = subprocess.Popen(argv, start_new_session=True)\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    controller = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert controller.stdout is not None
    supervisor = int(controller.stdout.readline())
    controller.stdout.close()
    deadline = time.monotonic() + 10
    while not psutil.Process(supervisor).children() and time.monotonic() < deadline:
        time.sleep(0.01)
    worker = psutil.Process(supervisor).children()[0].pid
    controller.kill()
    controller.wait()
    _wait_dead(supervisor, 10.0)
    assert not _alive(supervisor)
    assert not _alive(worker)
    assert not os.path.exists(segment)
    assert not leftover.exists()


def test_the_supervisor_cleans_up_when_the_worker_leaves_because_its_controller_died(
    tmp_path,
):
    # Like a real worker, this one exits by itself when its channel (here a pipe from
    # the controller) ends; the supervisor must still remove what the controller left.
    leftover = tmp_path / "edge-stage-test"
    leftover.mkdir()
    code = (
        "import os, subprocess, sys, time\n"
        "from edge_core.host.supervisor import supervisor_argv\n"
        "r, w = os.pipe()\n"
        "worker = [sys.executable, '-c', 'import os, sys; os.read(int(sys.argv[1]), 1)', str(r)]\n"
        f"argv = supervisor_argv(worker, controller=os.getpid(), prefixes=[],\n"
        f"    remove=[{str(leftover)!r}])\n"
        "p = subprocess.Popen(argv, pass_fds=(r,), start_new_session=True)\n"
        "os.close(r)\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    controller = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert controller.stdout is not None
    supervisor = int(controller.stdout.readline())
    controller.stdout.close()
    deadline = time.monotonic() + 10
    while not psutil.Process(supervisor).children() and time.monotonic() < deadline:
        time.sleep(0.01)
    worker = psutil.Process(supervisor).children()[0]
    os.kill(supervisor, signal.SIGSTOP)  # so that the worker has left before it looks
    try:
        controller.kill()
        controller.wait()
        _wait_dead(worker.pid, 10.0)  # a zombie until the supervisor reaps it
    finally:
        os.kill(supervisor, signal.SIGCONT)
    _wait_dead(supervisor, 10.0)
    assert not _alive(supervisor)
    assert not leftover.exists()
