"""Transport benchmark: bare socketpair vs. edge worker round trips, and 64 MiB copies.

Run: ``.venv/bin/python benchmarks/transport.py [--quick]``. Everything is measured in
this one run (never compare against numbers from another run). The last line printed is
one JSON object; ``rtt_ratio`` = edge echo p50 / bare socketpair p50 and
``copy_ratio_64mib`` = 64 MiB edge echo p50 / ``np.copyto`` 64 MiB p50.

For context it also measures what those ratios are made of: the bare round trip with both
ends polling instead of sleeping (the transport's spin does that), the edge echo with the
spin off (``spin_us=0``), and one 64 MiB copy into shared memory (two of them are the
floor of the 64 MiB echo).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from precompile import ensure_bytecode

from edge_contracts.requests import Operation, StageRequest
from edge_contracts.shm import SegmentProducer, new_prefix
from edge_core.host import Route, WorkerClient, start_worker

HERE = Path(__file__).resolve().parent
MIB = 1024 * 1024

ECHO_CHILD = r"""
import socket, sys
s = socket.socket(fileno=int(sys.argv[1]))
buf = bytearray(65536)
while True:
    n = s.recv_into(buf)
    if not n:
        break
    s.sendall(memoryview(buf)[:n])
"""

TCP_CHILD = r"""
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
buf = bytearray(65536)
while True:
    n = s.recv_into(buf)
    if not n:
        break
    s.sendall(memoryview(buf)[:n])
"""


def p50(samples: list[float]) -> float:
    return statistics.median(samples)


def _ping_pong(sock: socket.socket, n: int, size: int = 64) -> list[float]:
    message = b"x" * size
    buf = bytearray(size)
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        sock.sendall(message)
        got = 0
        while got < size:
            got += sock.recv_into(memoryview(buf)[got:])
        samples.append(time.perf_counter() - t0)
    return samples


SPIN_CHILD = r"""
import select, socket, sys
s = socket.socket(fileno=int(sys.argv[1]))
poll = select.poll()
poll.register(s, select.POLLIN)
buf = bytearray(65536)
while True:
    while not poll.poll(0):
        pass
    n = s.recv_into(buf)
    if not n:
        break
    s.sendall(memoryview(buf)[:n])
"""


class BareEcho:
    """A blocking echo child on a bare socketpair, kept for interleaved measurements."""

    def __init__(self) -> None:
        self._parent, child = socket.socketpair()
        self._proc = subprocess.Popen(
            [sys.executable, "-c", ECHO_CHILD, str(child.fileno())], pass_fds=(child.fileno(),)
        )
        child.close()
        _ping_pong(self._parent, 200)

    def rtt(self, n: int) -> list[float]:
        """``n`` round trips of 64 bytes (after 20 unrecorded ones)."""
        _ping_pong(self._parent, 20)
        return _ping_pong(self._parent, n)

    def close(self) -> None:
        """End the child."""
        self._parent.close()
        self._proc.wait()


def bare_socketpair_rtt(n: int) -> list[float]:
    """Round trips through a bare socketpair to a blocking echo child."""
    echo = BareEcho()
    try:
        return echo.rtt(n)
    finally:
        echo.close()


def interleaved(
    first: Callable[[int], list[float]], second: Callable[[int], list[float]], n: int,
    blocks: int,
) -> tuple[list[float], list[float]]:
    """``n`` samples of each, taken in alternating blocks (order swapped every block).

    The host's load changes during a run; alternating blocks lets both measurements
    see the same conditions, so their ratio is not a comparison of two moments.
    """
    a: list[float] = []
    b: list[float] = []
    size = max(1, n // blocks)
    for block in range(blocks):
        if block % 2:
            b.extend(second(size))
            a.extend(first(size))
        else:
            a.extend(first(size))
            b.extend(second(size))
    return a, b


def bare_spinning_rtt(n: int) -> list[float]:
    """The same with both ends polling without sleeping: the floor without wake-ups."""
    parent, child = socket.socketpair()
    proc = subprocess.Popen(
        [sys.executable, "-c", SPIN_CHILD, str(child.fileno())], pass_fds=(child.fileno(),)
    )
    child.close()
    poll = select.poll()
    poll.register(parent, select.POLLIN)
    message = b"x" * 64
    buf = bytearray(64)
    samples = []
    try:
        for index in range(n + 200):
            t0 = time.perf_counter()
            parent.sendall(message)
            got = 0
            while got < 64:
                while not poll.poll(0):
                    pass
                got += parent.recv_into(memoryview(buf)[got:])
            if index >= 200:
                samples.append(time.perf_counter() - t0)
        return samples
    finally:
        parent.close()
        proc.wait()


def shm_copyto(nbytes: int, n: int) -> list[float]:
    """``np.copyto`` into a warm shared-memory segment (what each transport copy is)."""
    producer = SegmentProducer(new_prefix(), max_bytes=2 * nbytes)
    try:
        lease = producer.lease(nbytes)
        dst = np.frombuffer(lease.view, dtype=np.uint8)
        src = np.ones(nbytes, dtype=np.uint8)
        np.copyto(dst, src)
        samples = []
        for _ in range(n):
            t0 = time.perf_counter()
            np.copyto(dst, src)
            samples.append(time.perf_counter() - t0)
        del dst
        return samples
    finally:
        producer.close()


def bare_tcp_rtt(n: int) -> list[float]:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-c", TCP_CHILD, str(port)])
    conn, _ = listener.accept()
    listener.close()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        _ping_pong(conn, 200)
        return _ping_pong(conn, n)
    finally:
        conn.close()
        proc.wait()


def _echo(client: WorkerClient, index: int, inputs: dict[str, np.ndarray]) -> float:
    request = StageRequest(f"r{index}", "bench", 0, client.generation, Operation.RUN)
    t0 = time.perf_counter()
    delivery = client.submit(request, inputs).next()
    delivery.release()
    elapsed = time.perf_counter() - t0
    assert delivery.terminal and delivery.error is None, delivery.error
    return elapsed


def edge_echo(
    client: WorkerClient, n: int, inputs: dict[str, np.ndarray], warm: int, first: int = 0
) -> list[float]:
    """``n`` timed echo round trips after ``warm`` untimed ones (ids from ``first``)."""
    for i in range(warm):
        _echo(client, first + i, inputs)
    return [_echo(client, first + warm + i, inputs) for i in range(n)]


def _copy_samples(dst: np.ndarray, src: np.ndarray, n: int) -> list[float]:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        samples.append(time.perf_counter() - t0)
    return samples


def _start(threshold: int, spin_us: int | None = None) -> WorkerClient:
    route = Route.default("bench", "transport_worker:echo", python_path=(str(HERE),))
    return start_worker(route, generation=1, shm_threshold=threshold, spin_us=spin_us)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer samples (smoke run)")
    args = parser.parse_args()
    ensure_bytecode()
    n_rtt = 300 if args.quick else 3000
    n_big = 5 if args.quick else 15
    results: dict[str, object] = {"cpus": os.cpu_count(), "python": sys.version.split()[0]}

    blocks = 4 if args.quick else 10
    spinning = bare_spinning_rtt(n_rtt)
    tcp = bare_tcp_rtt(n_rtt)
    tiny = {"x": np.arange(4, dtype=np.float32)}
    blocking = _start(threshold=256 * 1024, spin_us=0)
    try:
        edge_blocking = edge_echo(blocking, n_rtt, tiny, warm=200)
    finally:
        blocking.retire()

    # The two measurements the goals compare are taken in alternating blocks.
    bare_echo = BareEcho()
    client = _start(threshold=256 * 1024)
    counter = iter(range(1 << 30))
    try:
        edge_echo(client, 200, tiny, warm=0)
        bare, edge = interleaved(
            bare_echo.rtt,
            lambda n: edge_echo(client, n, tiny, warm=30, first=next(counter) * 10_000),
            n_rtt,
            blocks,
        )
        big = {"x": np.ones(64 * MIB, dtype=np.uint8)}
        edge_echo(client, 3, big, warm=0)
        src = np.ones(64 * MIB, dtype=np.uint8)
        dst = np.empty_like(src)
        np.copyto(dst, src)
        echo64, mem = interleaved(
            lambda n: edge_echo(client, n, big, warm=1, first=next(counter) * 10_000),
            lambda n: _copy_samples(dst, src, n + 1)[1:],  # one unrecorded, like the echo
            n_big * blocks // 2,
            blocks,
        )
        owned64 = []
        for i in range(n_big):
            request = StageRequest(f"c{i}", "bench", 0, client.generation, Operation.RUN)
            t0 = time.perf_counter()
            client.submit(request, big).result()
            owned64.append(time.perf_counter() - t0)
    finally:
        client.retire()
        bare_echo.close()
    print(f"bare socketpair round trip p50: {p50(bare) * 1e6:8.1f} us  (n={len(bare)})")
    print(f"bare socketpair, both ends polling p50: {p50(spinning) * 1e6:8.1f} us")
    print(f"bare loopback TCP round trip p50: {p50(tcp) * 1e6:8.1f} us  (n={len(tcp)})")
    print(f"edge worker echo, no spin (float32[4]) p50: {p50(edge_blocking) * 1e6:8.1f} us")
    print(f"edge worker echo (float32[4]) p50: {p50(edge) * 1e6:8.1f} us  (n={len(edge)})")
    shm_mem = shm_copyto(64 * MIB, n_big * 2)
    print(f"edge echo 64 MiB (shm) p50: {p50(echo64) * 1e3:8.2f} ms  (n={len(echo64)})")
    print(f"np.copyto 64 MiB p50:       {p50(mem) * 1e3:8.2f} ms  (n={len(mem)})")
    print(f"np.copyto 64 MiB into shared memory p50: {p50(shm_mem) * 1e3:8.2f} ms")
    print(f"edge echo 64 MiB, owned copy out p50: {p50(owned64) * 1e3:8.2f} ms")

    sweep: dict[str, dict[str, float]] = {}
    inline_client = _start(threshold=1 << 62)
    shm_client = _start(threshold=1)
    try:
        for size in (4096, 16384, 65536, 262144, 1 * MIB, 4 * MIB, 16 * MIB):
            data = {"x": np.ones(size, dtype=np.uint8)}
            reps = 200 if size <= 262144 else 30
            reps = max(5, reps // (10 if args.quick else 1))
            inline = p50(edge_echo(inline_client, reps, data, warm=5))
            shared = p50(edge_echo(shm_client, reps, data, warm=5))
            sweep[str(size)] = {"inline_us": inline * 1e6, "shm_us": shared * 1e6}
            print(f"echo {size:>9} B: inline {inline * 1e6:9.1f} us   shm {shared * 1e6:9.1f} us")
    finally:
        inline_client.retire()
        shm_client.retire()

    results.update(
        bare_socketpair_p50_us=p50(bare) * 1e6,
        bare_tcp_p50_us=p50(tcp) * 1e6,
        edge_echo_p50_us=p50(edge) * 1e6,
        edge_echo_64mib_p50_ms=p50(echo64) * 1e3,
        copyto_64mib_p50_ms=p50(mem) * 1e3,
        edge_echo_64mib_copy_out_p50_ms=p50(owned64) * 1e3,
        bare_spinning_p50_us=p50(spinning) * 1e6,
        edge_echo_no_spin_p50_us=p50(edge_blocking) * 1e6,
        copyto_shm_64mib_p50_ms=p50(shm_mem) * 1e3,
        rtt_ratio=p50(edge) / p50(bare),
        rtt_ratio_no_spin=p50(edge_blocking) / p50(bare),
        rtt_ratio_both_spinning=p50(edge) / p50(spinning),
        copy_ratio_64mib=p50(echo64) / p50(mem),
        # Two copies through shared memory: the floor of copy_ratio_64mib on this host
        # (shared mappings get no transparent huge pages; private numpy arrays do).
        copy_floor_ratio_64mib=2 * p50(shm_mem) / p50(mem),
        threshold_sweep=sweep,
        goals={"rtt_ratio": 1.3, "copy_ratio_64mib": 2.5},
    )
    print(json.dumps(results, separators=(",", ":")))


if __name__ == "__main__":
    main()
