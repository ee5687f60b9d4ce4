"""Timing helpers of the transport benchmarks: medians, CPU time, interleaved blocks."""

from __future__ import annotations

import os
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from edge_core.host import WorkerClient
from edge_core.host.spinning import SpinDecision, governor


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
    return [[x for block in per_run for x in block]
            for per_run in interleaved_blocks(runs, n, blocks)]


def interleaved_blocks(
    runs: list[Callable[[int], list[float]]], n: int, blocks: int
) -> list[list[list[float]]]:
    """Like :func:`interleaved_all`, but each run's samples kept per block.

    ``result[run][block]`` are the samples of ``run`` taken in ``block``; the runs of one
    block saw the same moment of the host, so per-block ratios pair them.
    """
    out: list[list[list[float]]] = [[] for _ in runs]
    size = max(1, n // blocks)
    for block in range(blocks):
        order = list(range(len(runs)))
        order = order[block % len(runs):] + order[: block % len(runs)]
        if block % 2:
            order.reverse()
        for index in order:
            out[index].append(runs[index](size))
    return out


def paired_ratio(
    numerator: list[list[float]], denominator: list[list[float]],
    minus: list[list[float]] | None = None, resamples: int = 2000,
) -> dict[str, float]:
    """Per-block ratio of medians, ``(num - minus) / den``: median and bootstrap 95 % interval.

    Each block's medians are paired (taken at the same moment of the host); the median of
    the per-block ratios is the figure, and resampling the blocks (seeded, so the same
    samples always give the same interval) gives its interval.
    """
    ratios = []
    for index, (num, den) in enumerate(zip(numerator, denominator, strict=True)):
        less = statistics.median(minus[index]) if minus is not None else 0.0
        ratios.append((statistics.median(num) - less) / statistics.median(den))
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios)))
                     for _ in range(resamples))
    return {"median": statistics.median(ratios),
            "ci95_low": medians[int(0.025 * resamples)],
            "ci95_high": medians[int(0.975 * resamples) - 1],
            "blocks": len(ratios)}



def spin_report(decision: SpinDecision | None = None,
                worker: WorkerClient | None = None) -> dict[str, object]:
    """The controller's spin decision as the benchmarks print it (``spin``).

    ``decision`` (default: the one the governor made last, which with one governed
    channel open is that channel's), the saving the latest window measured (``wake_us``:
    median blocking wait less median spinning wait, µs) and how many windows of measured
    waits were decided in all: the budget is re-made from the channel's own traffic
    (``edge_core.host.spinning``). With ``worker``, also that worker's own account of its
    spin for its next request (``worker``: its ``ping`` answer's ``spin``, see
    ``edge_contracts.worker_spin``).
    """
    spins = governor()
    decision = spins.decision if decision is None else decision
    report: dict[str, object] = {"spin_us": decision.spin_us, "reason": decision.reason,
                                 "wake_us": spins.wake_us, "windows": spins.windows}
    if worker is not None:
        report["worker"] = worker.ping(timeout_s=10)["spin"]
    return report
