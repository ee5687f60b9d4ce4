"""Timing helpers of the transport benchmarks: medians, CPU time, interleaved blocks."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path


def p50(samples: list[float]) -> float:
    return statistics.median(samples)


def process_cpu_s(pid: int) -> float:
    """User plus system CPU seconds of process ``pid`` so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU time of this process plus one other (the worker), summed over measured blocks.

    ``measure(run, n)`` runs ``run(n)`` (which returns samples) and adds the CPU seconds
    both processes used meanwhile; ``per_call_us`` divides by the calls measured. The
    other process's time comes from /proc in clock ticks (10 ms), so blocks of a few
    thousand calls are needed for a useful figure.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.seconds = 0.0
        self.calls = 0

    def measure(self, run: Callable[[int], list[float]], n: int) -> list[float]:
        """Run ``run(n)``, adding the CPU time of both processes; return its samples."""
        before = time.process_time() + process_cpu_s(self.pid)
        samples = run(n)
        self.seconds += time.process_time() + process_cpu_s(self.pid) - before
        self.calls += len(samples)
        return samples

    @property
    def per_call_us(self) -> float:
        """Controller plus worker CPU microseconds per measured round trip."""
        return self.seconds / max(1, self.calls) * 1e6


def interleaved(
    first: Callable[[int], list[float]], second: Callable[[int], list[float]], n: int,
    blocks: int,
) -> tuple[list[float], list[float]]:
    """``n`` samples of each, taken in alternating blocks (order swapped every block).

    The host's load changes during a run; alternating blocks lets both measurements
    see the same conditions, so their ratio is not a comparison of two moments.
    """
    a, b = interleaved_all([first, second], n, blocks)
    return a, b


def interleaved_all(
    runs: list[Callable[[int], list[float]]], n: int, blocks: int
) -> list[list[float]]:
    """``n`` samples of each of ``runs``, in blocks whose order rotates every block."""
    out: list[list[float]] = [[] for _ in runs]
    size = max(1, n // blocks)
    for block in range(blocks):
        order = list(range(len(runs)))
        order = order[block % len(runs):] + order[: block % len(runs)]
        if block % 2:
            order.reverse()
        for index in order:
            out[index].extend(runs[index](size))
    return out
