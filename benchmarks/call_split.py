"""Where a tiny ort-cpu stage call's time and CPU go: both ends blocking or both spinning,
the controller and its worker pinned to one CPU or to two, beside a
``multiprocessing.Pipe`` echo pinned alike.

``ort_call.py`` gives the goal ratios with the stage as shipped, wherever the kernel puts
its processes; this one holds the placement and the waiting fixed, to say what each costs.
Two one-stage pipelines on the same tiny graph: one opened with ``EDGE_SPIN_US=0`` (both
ends block), one with ``EDGE_SPIN_US=200`` (both ends spin up to 200 µs, a fixed budget).
Configurations, each a block of calls after a warm-up, in alternating rounds:

* ``blocking_one_cpu``, ``blocking_two_cpus``: the blocking stage, its controller's
  threads and its worker's pinned to CPU 0, or to CPU 0 and CPU 1;
* ``spinning_two_cpus``: the spinning stage on two CPUs (on one, a spinning end holds
  the CPU its peer needs: not measured);
* ``pipe_one_cpu``, ``pipe_two_cpus``: the Pipe echo of the same float32[4].

Per configuration: the round trip's median (``rtt_p50_us``); the controller's and the
worker's CPU per call (``controller_cpu_us``, ``worker_cpu_us``: ``/proc`` times, all
threads); and for the stage, the controller's time per call in its wait for the reply
(``in_wait_us``), in its send (``in_write_us``) and everything else
(``controller_work_us``: the Python of the call before the send and after the reply).
The wait is timed where the reading caller polls the socket: ``ReadableWait.wait`` (a
spin budget, or a measured wait) and the channel reader's own plain blocking poll (the
usual blocking wait, which calls no ``ReadableWait.wait``); the send is timed in the
socket's ``sendmsg`` (each write of the client: the usual request's from its kept
template, which calls no ``WorkerClient._write``, and the general path's). These are
wrapped for this run (the method on its class, the poll and the socket on the stage's
client); the wrappers' own cost is in ``controller_work_us``.
``controller_work_blocking_over_spinning`` divides the blocking stage's
``controller_work_us`` on two CPUs by the spinning one's: the same Python, run after a
blocking wait or without one.

Run: ``.venv/bin/python benchmarks/call_split.py [--calls 2000] [--rounds 3]``. Needs two
usable CPUs (else it prints ``{"skipped": ...}``). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from edge_contracts.waiting import SPIN_ENV, ReadableWait
from edge_core.host.client import WorkerClient
from edge_core.identity import host_identity
from edge_core.runtime import Pipeline

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ort_call import make_bundle, open_stage, worker_pid
from transport_anchors import PipeEcho
from transport_timing import process_cpu_s

X = np.zeros(4, np.float32)


class TimedSocket:
    """A client's socket whose ``sendmsg`` adds its time to ``timed`` (all else passes)."""

    def __init__(self, sock: socket.socket, timed: Timed) -> None:
        self.sock = sock
        self._sendmsg = sock.sendmsg
        self._timed = timed

    def sendmsg(self, buffers: Any, *args: Any) -> int:
        """The socket's ``sendmsg``, timed."""
        clock = time.perf_counter_ns
        start = clock()
        try:
            return self._sendmsg(buffers, *args)
        finally:
            self._timed.write_ns += clock() - start

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


class Timed:
    """Nanoseconds the stage's controller spent polling for the reply and in ``sendmsg``."""

    def __init__(self) -> None:
        self.wait_ns = 0
        self.write_ns = 0

    @contextlib.contextmanager
    def installed(self, pipeline: Pipeline) -> Iterator[None]:
        """Wrap the waits and the writes of ``pipeline``'s one stage while the block runs.

        ``ReadableWait.wait`` on its class (the waits with a spin budget or measured), the
        channel reader's plain poll and the client's socket on the stage's client.
        """
        client: WorkerClient = pipeline.stages[0].loaded.client  # type: ignore[attr-defined]
        reader = client._reader
        wait, poll, sock = ReadableWait.wait, reader._poll, client._sock
        clock = time.perf_counter_ns

        def timed_wait(wait_self: ReadableWait, timeout_s: float | None) -> Any:
            start = clock()
            try:
                return wait(wait_self, timeout_s)
            finally:
                self.wait_ns += clock() - start

        def timed_poll(timeout_ms: float | None = None) -> list[tuple[int, int]]:
            start = clock()
            try:
                return poll(timeout_ms)
            finally:
                self.wait_ns += clock() - start

        ReadableWait.wait = timed_wait  # type: ignore[method-assign,assignment]
        reader._poll = timed_poll
        client._sock = TimedSocket(sock, self)  # type: ignore[assignment]
        try:
            yield
        finally:
            ReadableWait.wait = wait  # type: ignore[method-assign]
            reader._poll = poll
            client._sock = sock


def pin(pid: int, cpus: set[int]) -> None:
    """Set the affinity of every thread of process ``pid``."""
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(task), cpus)


@contextlib.contextmanager
def stage_with_spin(bundle: Path, spin_us: int) -> Iterator[Pipeline]:
    """A one-stage pipeline on ``bundle``, open while ``EDGE_SPIN_US=spin_us`` is set.

    The controller's spin governor reads the variable whenever its channels change, so it
    stays set until the stage is closed, and only one stage is open at a time.
    """
    before = os.environ.get(SPIN_ENV)
    os.environ[SPIN_ENV] = str(spin_us)
    try:
        pipeline = open_stage(bundle)[0]
        try:
            yield pipeline
        finally:
            pipeline.close()
    finally:
        if before is None:
            del os.environ[SPIN_ENV]
        else:
            os.environ[SPIN_ENV] = before


def stage_block(pipeline: Pipeline, timed: Timed, calls: int) -> dict[str, float]:
    """``calls`` timed tiny calls: round trips, the controller's split, both sides' CPU."""
    pid = worker_pid(pipeline)
    for _ in range(300):
        pipeline.run({"x": X}).ack()
    samples = []
    clock = time.perf_counter_ns
    with timed.installed(pipeline):
        timed.wait_ns = timed.write_ns = 0
        cpu0, worker0 = time.process_time(), process_cpu_s(pid)
        for _ in range(calls):
            start = clock()
            pipeline.run({"x": X}).ack()
            samples.append(clock() - start)
        cpu1, worker1 = time.process_time(), process_cpu_s(pid)
    total_us = sum(samples) / calls / 1e3
    wait_us, write_us = timed.wait_ns / calls / 1e3, timed.write_ns / calls / 1e3
    return {"rtt_p50_us": statistics.median(samples) / 1e3, "in_wait_us": wait_us,
            "in_write_us": write_us, "controller_work_us": total_us - wait_us - write_us,
            "controller_cpu_us": (cpu1 - cpu0) / calls * 1e6,
            "worker_cpu_us": (worker1 - worker0) / calls * 1e6}


def pipe_block(pipe: PipeEcho, calls: int) -> dict[str, float]:
    """``calls`` Pipe echoes: round trips and both sides' CPU."""
    pipe.rtt(300, {"x": X})
    cpu0, worker0 = time.process_time(), process_cpu_s(pipe.pid)
    samples = pipe.rtt(calls, {"x": X})
    cpu1, worker1 = time.process_time(), process_cpu_s(pipe.pid)
    return {"rtt_p50_us": statistics.median(samples) * 1e6,
            "controller_cpu_us": (cpu1 - cpu0) / calls * 1e6,
            "worker_cpu_us": (worker1 - worker0) / calls * 1e6}


def merged(blocks: list[dict[str, float]]) -> dict[str, float]:
    """The median of each figure over a configuration's blocks, rounded."""
    return {key: round(statistics.median(b[key] for b in blocks), 1) for key in blocks[0]}


def run(calls: int, rounds: int) -> dict[str, Any]:
    """Every configuration once a round, in the same order, ``rounds`` times.

    A round opens the blocking stage, measures it on one CPU and on two, closes it; opens
    the spinning one, measures it on two, closes it; then measures the Pipe on one and two.
    """
    usable = sorted(os.sched_getaffinity(0))
    if len(usable) < 2:
        return {"skipped": f"needs two usable CPUs, has {len(usable)}"}
    one, other = {usable[0]}, {usable[1]}
    own = os.getpid()
    timed = Timed()
    modes = {0: [("blocking_one_cpu", one), ("blocking_two_cpus", other)],
             200: [("spinning_two_cpus", other)]}
    found: dict[str, list[dict[str, float]]] = {
        name: [] for name in ("blocking_one_cpu", "blocking_two_cpus", "spinning_two_cpus",
                              "pipe_one_cpu", "pipe_two_cpus")}

    def measured(name: str, block: Callable[[], dict[str, float]]) -> None:
        found[name].append(block())
        print(f"{name}: {merged(found[name][-1:])}", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        bundle = make_bundle(Path(tmp), "tiny", [4])
        pipe = PipeEcho()
        try:
            for _ in range(rounds):
                for spin_us, placements in modes.items():
                    with stage_with_spin(bundle, spin_us) as pipeline:
                        for name, peer_cpus in placements:
                            pin(own, one)
                            pin(worker_pid(pipeline), peer_cpus)
                            measured(name, functools.partial(stage_block, pipeline, timed,
                                                             calls))
                        pin(own, set(usable))
                for name, peer_cpus in (("pipe_one_cpu", one), ("pipe_two_cpus", other)):
                    pin(own, one)
                    pin(pipe.pid, peer_cpus)
                    measured(name, functools.partial(pipe_block, pipe, calls))
        finally:
            pin(own, set(usable))
            pipe.close()
    result: dict[str, Any] = {name: merged(blocks) for name, blocks in found.items()}
    result["controller_work_blocking_over_spinning"] = round(
        result["blocking_two_cpus"]["controller_work_us"]
        / result["spinning_two_cpus"]["controller_work_us"], 2)
    result.update(calls=calls, rounds=rounds)
    return result


def main() -> None:
    """Parse the arguments, run, print the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls a block")
    parser.add_argument("--rounds", type=int, default=3, help="blocks a configuration")
    args = parser.parse_args()
    print(json.dumps({"benchmark": "call_split", **run(args.calls, args.rounds),
                      "machine": host_identity()}))


if __name__ == "__main__":
    main()
