"""Process-tree retirement with real processes: orphans, SIGTERM-proof children, PID reuse."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from edge_core.host.identity import ProcessIdentity, session_members
from edge_core.host.retire import ProcessTree

# A session leader that forks a grandchild ignoring SIGTERM, prints its pid, then
# exits so that the grandchild is re-parented away from the tree.
ORPHANING = r"""
import os, signal, sys, time
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.close(r)
    os.write(w, b"ready")
    os.close(w)
    while True:
        time.sleep(1)
os.close(w)
os.read(r, 5)
print(pid, flush=True)
if sys.argv[1] == "exit":
    os._exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
while True:
    time.sleep(1)
"""


def _start(mode: str) -> tuple[subprocess.Popen[bytes], ProcessIdentity, int]:
    proc = subprocess.Popen(
        [sys.executable, "-c", ORPHANING, mode], stdout=subprocess.PIPE, start_new_session=True
    )
    root = ProcessIdentity.of(proc.pid)
    assert proc.stdout is not None
    grandchild = int(proc.stdout.readline())
    proc.stdout.close()
    return proc, root, grandchild


def test_retire_kills_sigterm_ignoring_tree_and_verifies():
    proc, root, grandchild = _start("stay")
    tree = ProcessTree(root, proc)
    outcome = tree.retire(deadline_s=3.0)
    assert outcome.verified, outcome
    assert outcome.escalation == "kill"
    assert grandchild in {i.pid for i in outcome.tree}
    assert not psutil.pid_exists(grandchild) or psutil.Process(grandchild).status() == "zombie"
    assert outcome.elapsed_s < 3.0
    assert proc.returncode is not None


def test_retire_finds_reparented_grandchild_through_the_session():
    proc, root, grandchild = _start("exit")
    proc.wait(timeout=5)
    orphan = ProcessIdentity.of(grandchild)
    assert psutil.Process(grandchild).ppid() != proc.pid
    assert orphan in session_members(root)
    outcome = ProcessTree(root, proc).retire(deadline_s=3.0)
    assert outcome.verified, outcome
    assert orphan in outcome.tree
    assert not orphan.is_alive()


def test_retire_is_idempotent():
    proc, root, _ = _start("stay")
    tree = ProcessTree(root, proc)
    first = tree.retire(deadline_s=3.0)
    second = tree.retire(deadline_s=3.0)
    assert first is second
    assert first.verified


def test_reused_pid_is_never_signalled():
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        real = ProcessIdentity.of(bystander.pid)
        stale = ProcessIdentity(bystander.pid, real.start_time - 100.0)
        assert not stale.is_alive()
        outcome = ProcessTree(stale).retire(deadline_s=0.5)
        assert outcome.verified
        time.sleep(0.1)
        assert bystander.poll() is None, "an unrelated process holding a reused pid was killed"
    finally:
        bystander.kill()
        bystander.wait()
