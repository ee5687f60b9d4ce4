"""Wake-ups per small call: a blocking worker sleeps once a call, not twice.

On Linux a thread asleep in a unix stream socket's receive is woken each time the peer
reads what that socket sent (the freed send space wakes every sleeper of the socket),
to find nothing and sleep again; a poll for readable data sleeps through it. A worker
that waited for its next request in the receive itself so slept twice per call: once
for the request, once more when the controller read its reply (a context switch more
each call, and where the two ends share one CPU, as the kernel often puts a blocking
pair, two). Counted with the worker's voluntary context switches, the two ends held on
two CPUs (so that the worker is asleep when its reply is read): counts, not timings.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .conftest import WORKERS

CALLS = 400

CHILD = r"""
import json, os, sys
import numpy as np
from edge_contracts.requests import Operation, StageRequest
from edge_core.host import Route, start_worker

mine, theirs = sorted(os.sched_getaffinity(0))[:2]
route = Route.default("echo", "edge_test_workers:echo", python_path=(sys.argv[1],))
client = start_worker(route, generation=1, spin_us=0)
tiny = {"x": np.arange(4, dtype=np.float32)}
pid = client.identity.pid
os.sched_setaffinity(0, {mine})  # the calling thread on one CPU, the worker on another
for tid in os.listdir(f"/proc/{pid}/task"):
    os.sched_setaffinity(int(tid), {theirs})

def switches():
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/status") as status:
            for line in status:
                if line.startswith("voluntary_ctxt_switches:"):
                    total += int(line.split()[1])
    return total

def call(i):
    delivery = client.submit(StageRequest(f"r{i}", "s0", 0, 1, Operation.RUN), tiny).next()
    delivery.release()
    assert delivery.terminal and delivery.error is None, delivery.error

try:
    for i in range(50):
        call(i)
    before = switches()
    for i in range(int(sys.argv[2])):
        call(1000 + i)
    print(json.dumps({"switches": switches() - before}))
finally:
    assert client.retire(deadline_s=10.0).verified
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts Linux's /proc")
@pytest.mark.skipif(sys.platform.startswith("linux") and len(os.sched_getaffinity(0)) < 2,
                    reason="holds the two ends on two CPUs")
def test_a_blocking_worker_sleeps_once_per_small_call() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(WORKERS), str(CALLS)],
        check=True, env={**os.environ, "EDGE_SPIN_US": "0"}, capture_output=True,
        text=True, timeout=300,
    )
    per_call = json.loads(done.stdout.strip().splitlines()[-1])["switches"] / CALLS
    # one sleep a call: waiting for the request (was 2: the reply read woke it again)
    assert 0.9 <= per_call <= 1.3, per_call
