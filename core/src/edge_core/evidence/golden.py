"""The golden set a pipeline declares, and its task-level quality check run on it.

A pipeline names its quality check the way it names ``prepare`` and ``finish``
(``quality = "package.module:function"``) and a golden set (``golden = "FILE"``, relative
to the pipeline file): inputs with their known answers. ``edge profile`` runs every
item through the opened pipeline — ``prepare`` (an ``input`` source), first-stage arrays
(an ``npz`` file, read with pickle disabled) and/or the request ``params`` (a prompt),
``Pipeline.run``, then ``finish`` when the pipeline names one (else a generate stage's
text and token ids, else the outputs as lists) — and calls::

    quality(pairs) -> {"metric": value, ..., "items": [...]}   # pairs: [(answer, truth)]

The golden file (JSON)::

    {"schema": "edge.golden/1", "description": "...",
     "passes": ["cer <= 0.02"],
     "items": [{"name": "demo", "input": "page.png", "truth": ["line", ...]},
               {"name": "p1", "params": {"prompt": "...", "temperature": 0}, "truth": {...}}]}

``passes`` are the pass criteria, ``METRIC OP NUMBER`` over the metrics the function
returns (:mod:`.targets`). An ``input`` is relative to the golden file. The quality
verdict is met when every criterion is; a pipeline with no ``quality`` or no ``golden``
is ``unjudged``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import attrs

from edge_core.evidence.errors import RecordInvalid
from edge_core.evidence.targets import parse_target
from edge_core.runtime import Pipeline

__all__ = ["GOLDEN_SCHEMA", "GoldenItem", "GoldenSet", "answer_of", "load_golden",
           "run_golden"]

GOLDEN_SCHEMA = "edge.golden/1"
"""The ``schema`` of a golden set file."""


@attrs.frozen
class GoldenItem:
    """One input with its known answer: a source for ``prepare`` or request params."""

    name: str
    truth: Any
    source: Path | None = None
    params: Mapping[str, Any] | None = None
    npz: Path | None = None


@attrs.frozen
class GoldenSet:
    """A golden set file: its items and pass criteria."""

    path: Path
    items: tuple[GoldenItem, ...]
    passes: tuple[str, ...]
    description: str = ""


def load_golden(path: str | os.PathLike[str]) -> GoldenSet:
    """Read and check a golden set file.

    Raises:
        RecordInvalid: unreadable, not UTF-8, not JSON, another schema, no items, an item
            without a name or truth, with none of ``input``, ``npz`` and ``params``, a file
            that does not exist, an unknown key, or no pass criteria (``field: reason:
            value``).
    """
    file = Path(path)
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise RecordInvalid(f"golden {file}", f"cannot read ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise RecordInvalid(f"golden {file}",
                            f"not valid UTF-8 (byte {exc.start}: {exc.reason})") from None
    except json.JSONDecodeError as exc:
        raise RecordInvalid(f"golden {file}", f"not valid JSON ({exc})") from None
    where = f"golden {file}"
    if not isinstance(data, dict) or data.get("schema") != GOLDEN_SCHEMA:
        raise RecordInvalid(f"{where}: schema", f"must be {GOLDEN_SCHEMA!r}",
                            data.get("schema") if isinstance(data, dict) else data)
    items = data.get("items")
    if not isinstance(items, list) or not items:
        raise RecordInvalid(f"{where}: items", "must be a non-empty list", items)
    passes = data.get("passes")
    if not isinstance(passes, list) or not passes or not all(isinstance(p, str) for p in passes):
        raise RecordInvalid(f"{where}: passes", "must list the pass criteria "
                            "('METRIC OP NUMBER' over the quality function's metrics)", passes)
    found = []
    for index, item in enumerate(items):
        field = f"{where}: items[{index}]"
        if not isinstance(item, dict):
            raise RecordInvalid(field, "must be an object", item)
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise RecordInvalid(f"{field}.name", "must be a non-empty string", name)
        if "truth" not in item:
            raise RecordInvalid(f"{field}.truth", "required: the known answer")
        params = item.get("params")
        if params is not None and not isinstance(params, dict):
            raise RecordInvalid(f"{field}.params", "must be an object", params)
        paths: dict[str, Path | None] = {}
        for key in ("input", "npz"):
            value = item.get(key)
            if value is None:
                paths[key] = None
                continue
            if not isinstance(value, str) or not value:
                raise RecordInvalid(f"{field}.{key}", "must be a path", value)
            resolved = (file.parent / value).resolve()
            if not resolved.exists():
                raise RecordInvalid(f"{field}.{key}", "no such file", str(resolved))
            paths[key] = resolved
        if paths["input"] is not None and paths["npz"] is not None:
            raise RecordInvalid(field, "give 'input' or 'npz', not both", name)
        if paths["input"] is None and paths["npz"] is None and params is None:
            raise RecordInvalid(field, "needs an 'input' (for prepare), an 'npz' or 'params'",
                                name)
        unknown = sorted(set(item) - {"name", "truth", "input", "npz", "params"})
        if unknown:
            raise RecordInvalid(f"{field}.{unknown[0]}", "unknown key", item[unknown[0]])
        found.append(GoldenItem(name, item["truth"], paths["input"], params, paths["npz"]))
    return GoldenSet(file, tuple(found), tuple(passes), str(data.get("description") or ""))


def answer_of(pipeline: Pipeline, result: Any, inputs: Mapping[str, Any]) -> Any:
    """What the quality function gets for one request.

    ``finish(outputs, inputs, bundles)`` when the pipeline names one; else, for a stage
    that reports generated text, ``{"text", "token_ids", "finish_reason"}``; else the
    outputs as lists.
    """
    from edge_core.config.transforms import resolve_input_transform

    if pipeline.config.finish is not None:
        finish = resolve_input_transform(pipeline.config.finish, "finish")
        return finish(result.outputs, inputs, pipeline.bundle_directories())
    data = dict(getattr(result.final, "data", None) or {})
    ids = result.outputs.get("token_ids")
    if "text" in data:
        return {"text": data.get("text"),
                "token_ids": [int(i) for i in ids] if ids is not None else None,
                "finish_reason": data.get("finish_reason")}
    return {name: value.tolist() if hasattr(value, "tolist") else value
            for name, value in result.outputs.items()}


def _metrics(answer: object, reference: str) -> dict[str, float]:
    if not isinstance(answer, Mapping):
        raise RecordInvalid("quality", f"{reference} must return a mapping of metric to "
                            "number", type(answer).__name__)
    metrics = {}
    for name, value in answer.items():
        if name == "items":
            continue
        if (not isinstance(value, int | float) or isinstance(value, bool)
                or not math.isfinite(value)):
            raise RecordInvalid(f"quality[{name!r}]", f"{reference} returned a metric that "
                                "is not a finite number", value)
        metrics[str(name)] = float(value)
    return metrics


def run_golden(pipeline: Pipeline, golden: GoldenSet, reference: str,
               quality: Callable[[Sequence[tuple[Any, Any]]], object],
               deadline_s: float | None = None) -> dict[str, Any]:
    """Run every golden item through ``pipeline``, score the answers, judge the criteria.

    Returns ``{"function", "golden", "items", "metrics", "passes", "met"}``; a request
    that fails, or a quality function that raises or returns no number, gives
    ``"met": false`` with ``"error"`` (the run's record names it), never a guess.
    """
    from edge_core.config.transforms import call_prepare, resolve_input_transform

    report: dict[str, Any] = {
        "function": reference,
        "golden": {"file": golden.path.name, "description": golden.description,
                   "items": [item.name for item in golden.items]},
    }
    prepare = None
    pairs: list[tuple[Any, Any]] = []
    try:
        for item in golden.items:
            inputs: Mapping[str, Any] = {}
            if item.npz is not None:
                import numpy as np

                with np.load(item.npz, allow_pickle=False) as data:
                    inputs = {name: np.array(data[name]) for name in data.files}
            if item.source is not None:
                if pipeline.config.prepare is None:
                    raise RecordInvalid(f"golden: {item.name}.input", "the pipeline names no "
                                        "'prepare' function", str(item.source))
                if prepare is None:
                    prepare = resolve_input_transform(pipeline.config.prepare, "prepare")
                inputs = dict(cast("Mapping[str, Any]",
                                   call_prepare(prepare, str(item.source), pipeline)))
            with pipeline.run(inputs, params=item.params, deadline_s=deadline_s) as result:
                pairs.append((answer_of(pipeline, result, inputs), item.truth))
        scored = quality(pairs)
        metrics = _metrics(scored, reference)
    except Exception as exc:  # recorded: the verdict is failed with this error
        report.update({"met": False, "error": {
            "type": type(exc).__name__, "classes": [c.__name__ for c in type(exc).__mro__],
            "message": str(exc)}})
        return report
    rows = []
    try:
        for index, text in enumerate(golden.passes):
            criterion = parse_target(text, f"golden: passes[{index}]", known=metrics)
            value = metrics[criterion.metric]
            rows.append({"criterion": text, "value": value, "met": criterion.met_by(value)})
    except RecordInvalid as exc:  # a criterion over a metric the check does not return
        report.update({"met": False, "metrics": metrics, "error": {
            "type": type(exc).__name__, "classes": [c.__name__ for c in type(exc).__mro__],
            "message": str(exc)}})
        return report
    items = scored.get("items") if isinstance(scored, Mapping) else None
    report.update({"metrics": metrics, "passes": rows, "met": all(r["met"] for r in rows),
                   "items": list(items) if isinstance(items, list) else None})
    return report
