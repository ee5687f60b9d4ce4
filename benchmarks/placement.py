"""Placement by measurement: is the measured choice the best one, and is start-up hidden?

Pipelines:

* ``ocr-auto``: ``build/ocr/pipeline-auto.toml`` (``make demo`` builds it), whose
  classifier lists ``qnn`` (the real HTP simulator) before ``ort-cpu``; timed on
  ``build/ocr/page.png``. Skipped, and said so, when ``--ocr DIR`` holds no such file.
* the synthetic pipelines of :mod:`edge_echo.synthetic`: ``preferred-slower`` (the
  preferred candidate passes every gate and is 4 times slower per call),
  ``faster-slow-to-open`` (the faster candidate takes seconds to open) and
  ``split-does-not-pay``.

For every pipeline a measured open (in a fresh decision cache) picks a placement, and an
**exhaustive** run opens each combination of candidates on its own (``first-passing``,
one candidate per stage) and times it on the same workload, in rounds that rotate
through the combinations, so that the best combination is known independently of the
race. Then:

* ``chosen_within_margin_of_best``: in every measured case the chosen placement's
  exhaustive p50 is within the pipeline's margin of the best one's (plus
  ``--tolerance``, the spread two identical placements show on this noisy machine);
* ``open_s_reused`` over ``open_s_first_passing``: opening with the stored decision
  reused against a ``first-passing`` open of the same chosen candidates, in alternating
  blocks (``preferred-slower``; goal <= 1.1);
* ``first_result_s_first_ready`` over ``first_result_s_single_backend``:
  ``faster-slow-to-open`` with ``start = "first-ready"`` against the same pipeline with
  only its fastest-to-open candidate, from the call to open to the first result, in
  alternating blocks (goal <= 1.2);
* ``switches`` (goal >= 1) and ``outputs_over_bound`` (goal 0): a first-ready run of
  ``faster-slow-to-open`` served without pause until its background work is done,
  every output compared with the reference (the echo's is exact: bound 0).

The last line is one JSON object with those keys. Decisions are stored in a temporary
directory (``EDGE_PLACEMENT_CACHE``), never the user's cache.

Run: ``.venv/bin/python benchmarks/placement.py [--ocr build/ocr] [--rounds R]
[--samples N] [--placement-budget-s S] [--blocks B]``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from edge_core.config import load_pipeline
from edge_core.config.model import PipelineConfig
from edge_core.ledger import ResourceLedger
from edge_core.plugins import PluginSet, load_plugins
from edge_core.runtime import Pipeline
from edge_core.runtime.pipeline_files import default_ledger
from edge_core.selection import DecisionStore
from edge_core.selection.workload import Workload, load_workload

os.environ["EDGE_TEST_BACKENDS"] = "1"  # the synthetic pipelines run on the echo backend


def combinations(config: PipelineConfig) -> list[tuple[int, ...]]:
    """Every placement of ``config``: one candidate index per stage, in preference order."""
    return list(itertools.product(*(range(len(stage.choices())) for stage in config.stages)))


def pinned(config: PipelineConfig, placement: Sequence[int], name: str) -> PipelineConfig:
    """``config`` with each stage on the one candidate ``placement`` names, first-passing."""
    stages = []
    for stage, index in zip(config.stages, placement, strict=True):
        if stage.candidates:
            chosen = stage.candidates[index]
            stage = attrs.evolve(stage, candidates=(chosen,), backend=chosen.backend)
        stages.append(stage)
    return attrs.evolve(config, name=name, stages=tuple(stages), selection="first-passing",
                        start="all-ready")


def time_requests(pipeline: Pipeline, inputs: Sequence[Mapping[str, Any]], count: int,
                  budget_s: float = float("inf")) -> list[float]:
    """Up to ``count`` requests one at a time (fewer once ``budget_s`` is spent)."""
    samples: list[float] = []
    began = time.perf_counter()
    for number in range(count):
        if samples and time.perf_counter() - began >= budget_s:
            break
        started = time.perf_counter()
        with pipeline.run(inputs[number % len(inputs)], deadline_s=600.0):
            pass
        samples.append(time.perf_counter() - started)
    return samples


def exhaustive(config: PipelineConfig, plugins: PluginSet, ledger: ResourceLedger,
               inputs: Sequence[Mapping[str, Any]], rounds: int, samples: int,
               budget_s: float) -> dict[tuple[int, ...], float]:
    """p50 seconds of every placement, timed in rotating blocks over ``rounds`` rounds.

    Each placement is opened on its own (first-passing, one candidate per stage) and
    warmed with one request; a block is ``samples`` requests or ``budget_s`` seconds,
    whichever ends first. A placement refused at open is left out (the race never saw it).
    """
    timings: dict[tuple[int, ...], list[float]] = {}
    opened: dict[tuple[int, ...], Pipeline] = {}
    try:
        for number, placement in enumerate(combinations(config)):
            try:
                pipeline = Pipeline.open(pinned(config, placement, f"{config.name}-x{number}"),
                                         plugins, ledger)
            except Exception as error:  # a refused candidate is no placement
                print(f"{config.name} {placement}: refused: {error}", file=sys.stderr)
                continue
            opened[placement] = pipeline
            time_requests(pipeline, inputs, 1)  # warm-up, as the race's
            timings[placement] = []
        order = list(opened)
        for round_index in range(rounds):
            shift = round_index % max(1, len(order))
            for placement in order[shift:] + order[:shift]:
                timings[placement] += time_requests(opened[placement], inputs, samples,
                                                    budget_s)
    finally:
        for pipeline in opened.values():
            pipeline.close()
    return {placement: statistics.median(values) for placement, values in timings.items()}


def measured(config: PipelineConfig, plugins: PluginSet, ledger: ResourceLedger,
             store: DecisionStore, workload: Workload | None) -> dict[str, Any]:
    """Open measured (fresh), read the choice and the figures, close."""
    started = time.perf_counter()
    with Pipeline.open(attrs.evolve(config, start="all-ready"), plugins, ledger, store=store,
                       workload=workload, remeasure=True) as pipeline:
        open_s = time.perf_counter() - started
        plan = pipeline.execution_plan()
    chosen = tuple(next(c["candidate"] for c in stage["candidates"]
                        if c["outcome"] == "chosen") if stage["candidates"]
                   and "candidate" in stage["candidates"][0] else 0
                   for stage in plan["stages"] if not stage["replica"])
    return {"chosen": chosen, "open_s": open_s, "selection": plan["selection"]}


def alternate(first: Callable[[], float], second: Callable[[], float],
              rounds: int) -> tuple[float, float]:
    """Medians of ``first`` and ``second``, taken in alternating blocks of one run each."""
    a: list[float] = []
    b: list[float] = []
    for round_index in range(rounds):
        for run, into in ((first, a), (second, b))[:: 1 if round_index % 2 == 0 else -1]:
            into.append(run())
    return statistics.median(a), statistics.median(b)


def open_time(config: PipelineConfig, plugins: PluginSet, ledger: ResourceLedger,
              store: DecisionStore) -> float:
    """Seconds to open ``config`` (then closed)."""
    started = time.perf_counter()
    pipeline = Pipeline.open(config, plugins, ledger, store=store)
    took = time.perf_counter() - started
    pipeline.close()
    return took


def first_result(config: PipelineConfig, plugins: PluginSet, ledger: ResourceLedger,
                 store: DecisionStore, inputs: Mapping[str, Any]) -> float:
    """Seconds from the call to open to the first result acknowledged (then closed)."""
    started = time.perf_counter()
    pipeline = Pipeline.open(config, plugins, ledger, store=store)
    try:
        with pipeline.run(inputs, deadline_s=600.0):
            pass
        return time.perf_counter() - started
    finally:
        pipeline.close()


def first_ready_run(config: PipelineConfig, plugins: PluginSet, ledger: ResourceLedger,
                    store: DecisionStore, inputs: Mapping[str, Any],
                    reference: np.ndarray, timeout_s: float = 300.0) -> dict[str, Any]:
    """Serve without pause until the background work is done; count switches and misses."""
    over = 0
    served = 0
    placements: set[int] = set()
    with Pipeline.open(config, plugins, ledger, store=store, remeasure=True) as pipeline:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            with pipeline.run(inputs, deadline_s=60.0) as result:
                served += 1
                over += int(not np.array_equal(result.outputs["x"], reference))
                placements.add(result.placement[-1]["placement"])
            state = (pipeline.execution_plan()["selection"]["background"] or {}).get("state")
            if state in ("done", "failed", "stopped"):
                break
        selection = pipeline.execution_plan()["selection"]
    return {"switches": len(selection["switches"]), "outputs_over_bound": over,
            "requests": served, "placements_seen": sorted(placements),
            "background": (selection["background"] or {}).get("state")}


def main(argv: Sequence[str] | None = None) -> int:
    """Run every comparison; print one JSON line per pipeline, then the summary line."""
    from edge_echo.synthetic import NAMES, SCALE, pipeline, workload_inputs, write_workload

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ocr", type=Path, default=Path("build/ocr"),
                        help="the demo's folder (pipeline-auto.toml, page.png)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of the exhaustive run and of each alternating block")
    parser.add_argument("--samples", type=int, default=5,
                        help="requests per placement and round of the exhaustive run")
    parser.add_argument("--placement-budget-s", type=float, default=60.0,
                        help="seconds one placement's block of the exhaustive run may take")
    parser.add_argument("--blocks", type=int, default=8,
                        help="alternating blocks of the open and first-result comparisons")
    parser.add_argument("--tolerance", type=float, default=0.05,
                        help="relative noise allowed on top of the margin")
    args = parser.parse_args(argv)
    temp = tempfile.mkdtemp(prefix="edge-bench-placement-")
    os.environ["EDGE_PLACEMENT_CACHE"] = str(Path(temp) / "decisions")
    store = DecisionStore(Path(temp) / "decisions")
    plugins = load_plugins()
    work = write_workload(temp)
    inputs = workload_inputs()
    reference = inputs["x"] * np.float32(SCALE)
    cases: dict[str, PipelineConfig] = {
        name: load_pipeline(pipeline(name, workload=[str(work)])) for name in NAMES}
    auto = args.ocr / "pipeline-auto.toml"
    page = args.ocr / "page.png"
    if auto.is_file() and page.is_file():
        cases["ocr-auto"] = load_pipeline(auto)
    else:
        print(f"ocr-auto skipped: no {auto} (run make demo first)", file=sys.stderr)
    within: dict[str, bool] = {}
    for name, config in cases.items():
        ledger = default_ledger(config, plugins)
        workload = load_workload(config, [str(page)]) if name == "ocr-auto" else None
        timed = ([dict(i) for i in workload.inputs] if workload is not None else [inputs])
        choice = measured(config, plugins, ledger, store, workload)
        best = exhaustive(config, plugins, ledger, timed, args.rounds, args.samples,
                          args.placement_budget_s)
        fastest = min(best.values())
        margin = config.measurement.margin
        ok = best.get(choice["chosen"], float("inf")) <= fastest * (1 + margin
                                                                    + args.tolerance)
        within[name] = ok
        print(json.dumps({"pipeline": name, "chosen": choice["chosen"],
                          "measured_open_s": round(choice["open_s"], 3),
                          "decision": choice["selection"]["decision"],
                          "exhaustive_p50_s": {",".join(map(str, k)): round(v, 4)
                                               for k, v in best.items()},
                          "chosen_within_margin_of_best": ok}), flush=True)
    ledger = default_ledger(cases["preferred-slower"], plugins)
    slower = cases["preferred-slower"]
    chosen = measured(slower, plugins, ledger, store, None)["chosen"]  # stored now
    open_reused, open_first_passing = alternate(
        lambda: open_time(slower, plugins, ledger, store),
        lambda: open_time(pinned(slower, chosen, "pinned"), plugins, ledger, store),
        args.blocks)
    slow_open = cases["faster-slow-to-open"]
    fastest_to_open = pinned(slow_open, (0, 0), "fastest-to-open")
    first_ready, single = alternate(
        lambda: first_result(slow_open, plugins, ledger, store, inputs),
        lambda: first_result(fastest_to_open, plugins, ledger, store, inputs), args.blocks)
    served = first_ready_run(slow_open, plugins, ledger, store, inputs, reference)
    summary = {
        "rounds": args.rounds,
        "blocks": args.blocks,
        "open_s_reused": round(open_reused, 4),
        "open_s_first_passing": round(open_first_passing, 4),
        "open_reused_over_first_passing": round(open_reused / open_first_passing, 3),
        "first_result_s_first_ready": round(first_ready, 4),
        "first_result_s_single_backend": round(single, 4),
        "first_result_first_ready_over_single_backend": round(first_ready / single, 3),
        "switches": served["switches"],
        "outputs_over_bound": served["outputs_over_bound"],
        "first_ready_requests": served["requests"],
        "chosen_within_margin_of_best": all(within.values()),
        "measured_cases": sorted(within),
    }
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
