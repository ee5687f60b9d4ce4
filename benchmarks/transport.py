"""Transport benchmark: bare socketpair vs. edge worker round trips, and 64 MiB copies.

Run: ``.venv/bin/python benchmarks/transport.py [--quick]``. Everything is measured in
this one run (never compare against numbers from another run). The last line printed is
one JSON object. Its goal keys compare against ``multiprocessing.Pipe`` echoing the same
float32[4] in a child interpreter — what a Python user writes instead, and an anchor that
does the same work as the edge echo (two processes, two wake-ups, serialisation), unlike
the bare socketpair, which moves 10x between runs on a VM depending on whether both ends
share a core:

* ``echo_over_mp_pipe`` = edge echo p50 / Pipe echo p50 with spinning as shipped (the
  controller's budget decided by :mod:`edge_core.host.spinning`; the decision is printed
  as ``spin``), goal ≤ 1.0;
* ``echo_over_mp_pipe_no_spin`` = the same with spinning off on both ends (``spin_us=0``,
  what ``EDGE_SPIN_US=0`` sets), goal ≤ 1.0;
* ``cpu_us_per_call`` = controller plus worker CPU time per round trip of each, and
  ``cpu_per_call_over_mp_pipe`` = edge (as shipped) / Pipe.

Beside them, ``echo_over_mp_pipe_fixed_spin`` is the echo with a fixed 200 µs spin on
both ends (``EDGE_SPIN_US=200``, the default before spinning was decided by measurement),
so that one run shows what the decision saves or costs on this host.

The bare socketpair, both edge echoes, the Pipe echo and the pure-Python binary-header
floor are taken in alternating blocks (their order rotating); each ratio is also given per
block (medians paired within a block) with a bootstrap 95 % interval over the blocks
(``*_ci``). Also: ``echo_over_binary_floor`` = edge echo p50 / the pure-Python
binary-header floor p50, ``rtt_ratio`` = edge echo p50 / bare socketpair p50 (history) and
``copy_ratio_64mib`` = 64 MiB edge echo p50 / ``np.copyto`` 64 MiB p50.

For context it also measures what those ratios are made of: the bare round trip with both
ends polling instead of sleeping, and one 64 MiB copy into shared memory (two of them are
the floor of the 64 MiB echo).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from precompile import ensure_bytecode
from transport_anchors import (
    BareEcho,
    FloorEcho,
    PipeEcho,
    bare_spinning_rtt,
    bare_tcp_rtt,
    python_floor_rtt,
)
from transport_timing import (
    CpuMeter,
    interleaved,
    interleaved_blocks,
    p50,
    paired_ratio,
    spin_report,
)

from edge_contracts.requests import Operation, StageRequest
from edge_contracts.shm import SegmentProducer, new_prefix
from edge_contracts.waiting import DEFAULT_SPIN_US
from edge_core.host import Route, WorkerClient, start_worker
from edge_core.identity import host_identity

HERE = Path(__file__).resolve().parent
MIB = 1024 * 1024


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


def edge_block(
    client: WorkerClient, meter: CpuMeter, n: int, inputs: dict[str, np.ndarray], first: int
) -> list[float]:
    """30 unmeasured echoes, then ``n`` timed ones whose CPU time ``meter`` counts."""
    edge_echo(client, 30, inputs, warm=0, first=first)
    return meter.measure(lambda m: edge_echo(client, m, inputs, warm=0, first=first + 30), n)


def pipe_block(
    echo: PipeEcho, meter: CpuMeter, n: int, inputs: dict[str, np.ndarray]
) -> list[float]:
    """The same for the ``multiprocessing.Pipe`` echo."""
    echo.rtt(30, inputs)
    return meter.measure(lambda m: echo.rtt(m, inputs), n)


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
    floor = python_floor_rtt(n_rtt)
    tcp = bare_tcp_rtt(n_rtt)
    tiny = {"x": np.arange(4, dtype=np.float32)}

    # The measurements the goals compare are taken in alternating blocks: the bare
    # socketpair, the edge echo as shipped, the edge echo with no spin on either end, the
    # multiprocessing.Pipe echo of the same arrays and the pure-Python binary-header
    # floor; CPU time is counted over the same blocks.
    bare_echo = BareEcho()
    pipe_echo = PipeEcho()
    floor_echo = FloorEcho("struct")
    client = _start(threshold=256 * 1024)  # spinning as shipped
    blocking = _start(threshold=256 * 1024, spin_us=0)  # what EDGE_SPIN_US=0 gives
    fixed = _start(threshold=256 * 1024, spin_us=DEFAULT_SPIN_US)  # what EDGE_SPIN_US=200 gives
    edge_cpu = CpuMeter(client.identity.pid)
    blocking_cpu = CpuMeter(blocking.identity.pid)
    fixed_cpu = CpuMeter(fixed.identity.pid)
    pipe_cpu = CpuMeter(pipe_echo.pid)
    counter = iter(range(1 << 30))
    try:
        edge_echo(client, 200, tiny, warm=0)
        edge_echo(blocking, 200, tiny, warm=0)
        edge_echo(fixed, 200, tiny, warm=0)
        per_block = interleaved_blocks(
            [
                bare_echo.rtt,
                lambda n: edge_block(client, edge_cpu, n, tiny, next(counter) * 10_000),
                lambda n: edge_block(blocking, blocking_cpu, n, tiny, next(counter) * 10_000),
                lambda n: pipe_block(pipe_echo, pipe_cpu, n, tiny),
                floor_echo.rtt,
                lambda n: edge_block(fixed, fixed_cpu, n, tiny, next(counter) * 10_000),
            ],
            n_rtt,
            blocks,
        )
        bare, edge, edge_blocking, pipe, floor_struct, edge_fixed = (
            [x for block in run for x in block] for run in per_block)
        # the decision in effect at the end of the blocks (re-made from the echo's own
        # measured waits all along; the windows say how many times)
        spin = spin_report(client.spin_decision, client)
        echo_ci = paired_ratio(per_block[1], per_block[3])
        echo_no_spin_ci = paired_ratio(per_block[2], per_block[3])
        echo_fixed_ci = paired_ratio(per_block[5], per_block[3])
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
        blocking.retire()
        fixed.retire()
        bare_echo.close()
        pipe_echo.close()
        floor_echo.close()
    print(f"bare socketpair round trip p50: {p50(bare) * 1e6:8.1f} us  (n={len(bare)})")
    print(f"bare socketpair, both ends polling p50: {p50(spinning) * 1e6:8.1f} us")
    print(f"bare loopback TCP round trip p50: {p50(tcp) * 1e6:8.1f} us  (n={len(tcp)})")
    print(f"minimal pure-Python framing, polling p50: {p50(floor) * 1e6:8.1f} us"
          f"  (binary header: {p50(floor_struct) * 1e6:.1f} us)")
    print(f"spin as shipped: {spin['spin_us']} us ({spin['reason']};"
          f" {spin['windows']} windows decided)")
    print(f"worker spin for its next request: {spin.get('worker')}")
    print(f"edge worker echo, no spin (float32[4]) p50: {p50(edge_blocking) * 1e6:8.1f} us")
    print(f"edge worker echo, as shipped (float32[4]) p50: {p50(edge) * 1e6:8.1f} us"
          f"  (n={len(edge)})")
    print(f"multiprocessing.Pipe echo (float32[4]) p50: {p50(pipe) * 1e6:8.1f} us"
          f"  (n={len(pipe)}; per block: "
          + ", ".join(f"{p50(b) * 1e6:.1f}" for b in per_block[3]) + ")")
    print(f"edge worker echo, fixed {DEFAULT_SPIN_US} us spin p50: {p50(edge_fixed) * 1e6:8.1f} us")
    print(f"CPU per round trip, both processes: edge {edge_cpu.per_call_us:.1f} us,"
          f" edge no spin {blocking_cpu.per_call_us:.1f} us, fixed spin"
          f" {fixed_cpu.per_call_us:.1f} us, Pipe {pipe_cpu.per_call_us:.1f} us")
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
        python_floor_p50_us=p50(floor) * 1e6,
        # What the least Python framing of this wire scores against the same bare round
        # trip: the part of rtt_ratio no implementation in Python can remove here.
        rtt_ratio_python_floor=p50(floor) / p50(bare),
        python_floor_binary_p50_us=p50(floor_struct) * 1e6,
        rtt_ratio_python_floor_binary=p50(floor_struct) / p50(bare),
        copy_ratio_64mib=p50(echo64) / p50(mem),
        # Two copies through shared memory: the floor of copy_ratio_64mib on this host
        # (shared mappings get no transparent huge pages; private numpy arrays do).
        copy_floor_ratio_64mib=2 * p50(shm_mem) / p50(mem),
        threshold_sweep=sweep,
        mp_pipe_p50_us=p50(pipe) * 1e6,
        mp_pipe_block_p50_us=[p50(b) * 1e6 for b in per_block[3]],
        echo_over_mp_pipe=p50(edge) / p50(pipe),
        echo_over_mp_pipe_ci=echo_ci,
        echo_over_mp_pipe_no_spin=p50(edge_blocking) / p50(pipe),
        echo_over_mp_pipe_no_spin_ci=echo_no_spin_ci,
        echo_over_mp_pipe_fixed_spin=p50(edge_fixed) / p50(pipe),
        echo_over_mp_pipe_fixed_spin_ci=echo_fixed_ci,
        echo_over_binary_floor=p50(edge) / p50(floor_struct),
        cpu_us_per_call={"edge": edge_cpu.per_call_us, "edge_no_spin": blocking_cpu.per_call_us,
                         "edge_fixed_spin": fixed_cpu.per_call_us,
                         "mp_pipe": pipe_cpu.per_call_us},
        cpu_per_call_over_mp_pipe=edge_cpu.per_call_us / pipe_cpu.per_call_us,
        spin=spin,
        anchor="multiprocessing.Pipe echo, alternating blocks",
        goals={"echo_over_mp_pipe": 1.0, "echo_over_mp_pipe_no_spin": 1.0,
               "cpu_per_call_over_mp_pipe": 1.5, "rtt_ratio": 1.3, "copy_ratio_64mib": 2.5,
               "echo_over_binary_floor": 5.0},
    )
    results["machine"] = host_identity()
    print(json.dumps(results, separators=(",", ":")))


if __name__ == "__main__":
    main()
