"""Measured requests: input groups, warm-up requests, concurrency levels, raw samples.

Boundary of one sample: ``time.perf_counter`` in the controller just before
``Pipeline.run`` (so waiting for an admission or in-flight slot is included) to just
after its result was delivered, before it is acknowledged. ``stages_s`` are the runtime's
per-stage latencies (submission to the terminal event of each stage).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from edge_core.evidence.stats import summarise
from edge_core.runtime.pipeline import Pipeline

__all__ = ["InputGroup", "measure_group", "resolve_groups", "timed_run"]


@attrs.frozen
class InputGroup:
    """One kind of request: a name, where its inputs came from, the first-stage arrays."""

    name: str
    source: str
    arrays: Mapping[str, Any] = attrs.field(repr=False)


def resolve_groups(pipeline: Pipeline, sources: Sequence[str],
                   npz_files: Sequence[str]) -> list[InputGroup]:
    """Input groups: ``--input`` sources, ``--inputs`` files, else the example inputs.

    A source goes through the pipeline's prepare function; an .npz file is read with
    pickle disabled; with neither, the first stage's bundle example inputs are used.

    Raises:
        RecordInvalid: no inputs were given and the first stage has no example inputs, or
            a source needs a prepare function the pipeline does not name.
    """
    import numpy as np

    from edge_core.config.transforms import call_prepare, resolve_input_transform
    from edge_core.evidence.errors import RecordInvalid

    groups: list[InputGroup] = []
    for source in sources:
        if pipeline.config.prepare is None:
            raise RecordInvalid("--input", "the pipeline names no 'prepare' function", source)
        prepare = resolve_input_transform(pipeline.config.prepare, "prepare")
        prepared: Any = call_prepare(prepare, source, pipeline)
        groups.append(InputGroup(Path(source).name, f"prepare({source})", dict(prepared)))
    for file in npz_files:
        with np.load(file, allow_pickle=False) as data:
            arrays = {name: np.array(data[name]) for name in data.files}
        groups.append(InputGroup(Path(file).name, f"npz({file})", arrays))
    if groups:
        return groups
    first = pipeline.stages[0].loaded
    bundle = getattr(first, "bundle", None)
    if bundle is not None and bundle.example_inputs is not None:
        return [InputGroup("example", f"example_inputs({bundle.example_inputs.name})",
                           dict(bundle.load_example_inputs()))]
    raise RecordInvalid("inputs", "give --input or --inputs: the first stage has no "
                        "example inputs", pipeline.stages[0].stage_id)


def timed_run(pipeline: Pipeline, arrays: Mapping[str, Any],
              deadline_s: float | None = None) -> dict[str, Any]:
    """One request: total seconds (run → result delivered) and per-stage seconds."""
    started = time.perf_counter()
    with pipeline.run(arrays, deadline_s=deadline_s) as result:
        total = time.perf_counter() - started
        stages = dict(result.latencies)
    return {"total_s": total, "stages_s": stages}


def _level(pipeline: Pipeline, group: InputGroup, concurrency: int, count: int,
           deadline_s: float, tick: Callable[[], None]) -> dict[str, Any]:
    counter = itertools.count()
    samples: list[dict[str, Any]] = []
    errors: list[dict[str, str]] = []
    lock = threading.Lock()

    def client(thread: int) -> None:
        while True:
            index = next(counter)
            if index >= count:
                return
            try:
                sample = timed_run(pipeline, group.arrays, deadline_s)
            except Exception as exc:  # recorded; the level then counts as failed
                with lock:
                    errors.append({"request": str(index), "type": type(exc).__name__,
                                   "message": str(exc)})
                return
            with lock:
                samples.append({"request": index, "thread": thread, **sample})
            tick()

    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(t,), name=f"edge-profile-{t}")
               for t in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    samples.sort(key=lambda s: int(s["request"]))
    stage_ids = [r.stage_id for r in pipeline.stages]
    return {
        "concurrency": concurrency,
        "status": "failed" if errors else "measured",
        "errors": errors,
        "wall_s": wall,
        "throughput_rps": len(samples) / wall if wall > 0 else None,
        "summary": {
            "total": summarise([s["total_s"] for s in samples]),
            "stages": {sid: summarise([s["stages_s"][sid] for s in samples
                                       if sid in s["stages_s"]]) for sid in stage_ids},
        },
        "samples": samples,
    }


def measure_group(pipeline: Pipeline, group: InputGroup, *, requests: int, warmup: int,
                  concurrency: Sequence[int], deadline_s: float,
                  tick: Callable[[], None]) -> dict[str, Any]:
    """Warm-up requests (kept apart), then ``requests`` measured ones per allowed level.

    A level above the pipeline's admission is not run and says so.
    """
    warm = [timed_run(pipeline, group.arrays, deadline_s) for _ in range(warmup)]
    for _ in warm:
        tick()
    admission = pipeline.admission.limit
    levels = []
    for level in concurrency:
        if level > admission:
            levels.append({"concurrency": level, "status": "skipped",
                           "reason": f"pipeline admission is {admission}"})
            continue
        levels.append(_level(pipeline, group, level, requests, deadline_s, tick))
    return {"name": group.name, "source": group.source,
            "inputs": {name: {"dtype": str(getattr(a, "dtype", type(a).__name__)),
                              "shape": list(getattr(a, "shape", ()))}
                       for name, a in group.arrays.items()},
            "warmup_samples": warm, "levels": levels}
