"""Measured requests: input groups, warm-up requests, concurrency levels, raw samples.

Boundary of one sample: ``time.perf_counter`` in the controller just before
``Pipeline.run`` (so waiting for an admission or in-flight slot is included) to just
after its result was delivered, before it is acknowledged. ``stages_s`` are the runtime's
per-stage latencies (submission to the terminal event of each stage).

A request that fails is recorded with its error's class chain (most specific first) and
its failing layer, and its client thread goes on with the next request: one error does
not hide the others, and the level counts as failed.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import attrs

from edge_core.evidence.stats import summarise
from edge_core.evidence.workload_file import RequestClass
from edge_core.runtime import Pipeline

__all__ = ["InputGroup", "LevelHooks", "error_entry", "graph_level", "measure_group",
           "resolve_groups", "timed_run"]


@attrs.frozen
class InputGroup:
    """One kind of request: a name, where its inputs came from, the first-stage arrays.

    ``requests``: the final stage's params of each distinct request, sent in turn
    (``(None,)``: no params).
    """

    name: str
    source: str
    arrays: Mapping[str, Any] = attrs.field(repr=False)
    requests: tuple[Mapping[str, Any] | None, ...] = (None,)

    def params(self, index: int) -> Mapping[str, Any] | None:
        """The params of request ``index`` (round robin over :attr:`requests`)."""
        return self.requests[index % len(self.requests)]


def error_entry(exc: BaseException, request: int | None = None) -> dict[str, Any]:
    """A request's error: type, class chain (most specific first), failing layer, message."""
    from edge_core.evidence.status import classify_error

    classes = [c.__name__ for c in type(exc).__mro__]
    entry: dict[str, Any] = {"type": type(exc).__name__, "classes": classes,
                             "layer": classify_error(classes).layer, "message": str(exc)}
    if request is not None:
        entry["request"] = request
    return entry


def resolve_groups(pipeline: Pipeline, sources: Sequence[str], npz_files: Sequence[str],
                   classes: Sequence[RequestClass] = ()) -> list[InputGroup]:
    """Input groups: ``--input`` sources, ``--inputs`` files, else the example inputs.

    A source goes through the pipeline's prepare function; an .npz file is read with
    pickle disabled; with neither, the first stage's bundle example inputs are used.
    With request ``classes`` (``--workload``, ``--params``) each class is a group of its
    own over the input arrays (one class per input group when several were given, named
    ``class/group``), or over no tensors for a prompt-only generate stage.

    Raises:
        RecordInvalid: no inputs were given and the first stage has no example inputs
            (and no request classes), or a source needs a prepare function the pipeline
            does not name.
    """
    arrays = _array_groups(pipeline, sources, npz_files, required=not classes)
    if not classes:
        return arrays
    if not arrays:
        return [InputGroup(c.name, c.source, {}, tuple(c.requests)) for c in classes]
    return [InputGroup(c.name if len(arrays) == 1 else f"{c.name}/{group.name}",
                       f"{c.source} over {group.source}", group.arrays, tuple(c.requests))
            for c in classes for group in arrays]


def _array_groups(pipeline: Pipeline, sources: Sequence[str], npz_files: Sequence[str],
                  required: bool) -> list[InputGroup]:
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
    found = pipeline.example_inputs()  # as the stage loaded them, else BundleChanged
    if found is not None:
        return [InputGroup("example", f"example_inputs({PurePosixPath(found.member).name})",
                           dict(found.arrays))]
    if not required:
        return []
    options = "--input or --inputs" if pipeline.config.prepare is not None else "--inputs"
    raise RecordInvalid("inputs", f"give {options}: the first stage has no example inputs",
                        pipeline.stages[0].stage_id)


def timed_run(pipeline: Pipeline, arrays: Mapping[str, Any], deadline_s: float | None = None,
              params: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One request: total seconds (run → result delivered) and per-stage seconds."""
    started = time.perf_counter()
    with pipeline.run(arrays, params=params, deadline_s=deadline_s) as result:
        total = time.perf_counter() - started
        stages = dict(result.latencies)
    return {"total_s": total, "stages_s": stages}


def graph_level(pipeline: Pipeline, group: InputGroup, concurrency: int, count: int,
                deadline_s: float, tick: Callable[[], None]) -> dict[str, Any]:
    """``count`` requests of ``group`` by ``concurrency`` client threads (``Pipeline.run``)."""
    counter = itertools.count()
    samples: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    lock = threading.Lock()

    def client(thread: int) -> None:
        while True:
            index = next(counter)
            if index >= count:
                return
            try:
                sample = timed_run(pipeline, group.arrays, deadline_s, group.params(index))
            except Exception as exc:  # recorded; the level counts as failed, others go on
                with lock:
                    errors.append(error_entry(exc, index))
                tick()
                continue
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


class LevelHooks:
    """What runs around each measured level (the profile's memory segments)."""

    def before(self, label: str) -> None:
        """A level named ``label`` (``group@cN``) starts."""

    def after(self) -> dict[str, Any] | None:
        """The level ended; what to record about it (``memory``), if anything."""
        return None


def measure_group(pipeline: Pipeline, group: InputGroup, *, requests: int, warmup: int,
                  concurrency: Sequence[int], deadline_s: float,
                  tick: Callable[[], None],
                  level: Callable[[InputGroup, int], dict[str, Any]] | None = None,
                  hooks: LevelHooks | None = None) -> dict[str, Any]:
    """Warm-up requests (kept apart), then ``requests`` measured ones per allowed level.

    ``level(group, concurrency)`` measures one level (default :func:`graph_level`);
    ``hooks`` run around each. A level above the pipeline's admission is not run and
    says so.
    """
    def graph(group: InputGroup, level: int) -> dict[str, Any]:
        return graph_level(pipeline, group, level, requests, deadline_s, tick)

    measure = level or graph
    warm = [timed_run(pipeline, group.arrays, deadline_s, group.params(i))
            for i in range(warmup)]
    for _ in warm:
        tick()
    admission = pipeline.admission.limit
    levels = []
    for concurrency_level in concurrency:
        if concurrency_level > admission:
            levels.append({"concurrency": concurrency_level, "status": "skipped",
                           "reason": f"pipeline admission is {admission}"})
            continue
        if hooks is not None:
            hooks.before(f"{group.name}@c{concurrency_level}")
        row = measure(group, concurrency_level)
        extra = hooks.after() if hooks is not None else None
        if extra:
            row.update(extra)
        levels.append(row)
    return {"name": group.name, "source": group.source,
            "inputs": {name: {"dtype": str(getattr(a, "dtype", type(a).__name__)),
                              "shape": list(getattr(a, "shape", ()))}
                       for name, a in group.arrays.items()},
            "requests": len(group.requests) if group.requests != (None,) else 0,
            "warmup_samples": warm, "levels": levels}
