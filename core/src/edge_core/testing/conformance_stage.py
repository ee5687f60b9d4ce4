"""The stage a backend offers the conformance kit, validated from its hook's mapping.

:func:`edge_core.hookspecs.edge_conformance_stage` returns a plain mapping so that a
plugin needs nothing from this module; :meth:`ConformanceStage.parse` checks it and
names the first problem as ``field: reason: value``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from edge_core.errors import EdgeError

__all__ = ["DEFAULT_BOUND", "ConformanceStage", "ConformanceStageInvalid"]

#: Bound used when the stage states none: exact up to float32 rounding noise.
DEFAULT_BOUND: Mapping[str, float] = {"max_abs_error": 1e-5, "normalised_error": 1e-5}

_KNOWN_KEYS = frozenset({"stage", "inputs", "expected", "bound", "params", "slow_params",
                         "slow_inputs"})


class ConformanceStageInvalid(EdgeError):
    """A backend's ``edge_conformance_stage`` answer is malformed."""

    def __init__(self, field: str, reason: str, value: object) -> None:
        self.field = field
        self.reason = reason
        self.value = value
        super().__init__(f"{field}: {reason}: {value!r}")


def _arrays(value: object, field: str, *, optional: bool) -> dict[str, Any] | None:
    if value is None and optional:
        return None
    if not isinstance(value, Mapping):
        raise ConformanceStageInvalid(field, "expected a mapping of name to array", value)
    result: dict[str, Any] = {}
    for name, array in value.items():
        if not isinstance(name, str):
            raise ConformanceStageInvalid(f"{field}", "names must be strings", name)
        result[name] = array if not isinstance(array, list) else np.asarray(array)
    return result


def _mapping(value: object, field: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConformanceStageInvalid(field, "expected a mapping", value)
    return dict(value)


@attrs.frozen
class ConformanceStage:
    """A small self-contained stage and one request on it, with what it must produce.

    Attributes:
        backend: The backend exercised.
        stage: The stage table (as in a pipeline file, without ``id``).
        inputs: Input name to array for one request.
        expected: Output name to array (or JSON value) the request must produce, or None.
        bound: ``max_abs_error`` / ``normalised_error`` for comparing float outputs.
        params: Request parameters (generate stages: prompt and sampling).
        slow_inputs: Inputs of a request that runs long enough to be cancelled, or None.
        slow_params: That request's parameters.
        workdir: The directory the stage's files were built in.
    """

    backend: str
    stage: Mapping[str, Any]
    inputs: Mapping[str, Any]
    expected: Mapping[str, Any] | None
    bound: Mapping[str, float]
    params: Mapping[str, Any]
    slow_inputs: Mapping[str, Any] | None
    slow_params: Mapping[str, Any] | None
    workdir: Path

    @property
    def has_slow_request(self) -> bool:
        """True when the backend gave a request that can be cancelled while running."""
        return self.slow_inputs is not None or self.slow_params is not None

    @property
    def manifest_dir(self) -> Path | None:
        """The stage's bundle directory (resolved against ``workdir``), if it has one."""
        manifest = self.stage.get("manifest")
        if manifest is None:
            return None
        path = Path(str(manifest))
        path = path if path.is_absolute() else self.workdir / path
        return path if path.is_dir() else path.parent

    def pipeline(self, stage_ids: tuple[str, ...] = ("s",)) -> dict[str, Any]:
        """A pipeline mapping running this stage once per id, chained in order."""
        return {"name": f"conformance-{self.backend}",
                "stages": [{**dict(self.stage), "id": sid} for sid in stage_ids]}

    @classmethod
    def parse(cls, backend: str, answer: object, workdir: Path) -> ConformanceStage:
        """Validate the hook's mapping.

        Raises:
            ConformanceStageInvalid: naming the offending key and value.
        """
        where = f"edge_conformance_stage[{backend}]"
        if not isinstance(answer, Mapping):
            raise ConformanceStageInvalid(where, "expected a mapping or None", answer)
        unknown = sorted(set(answer) - _KNOWN_KEYS)
        if unknown:
            raise ConformanceStageInvalid(where, f"unknown keys (known: {sorted(_KNOWN_KEYS)})",
                                          unknown)
        stage = _mapping(answer.get("stage"), f"{where}.stage")
        if "id" in stage:
            raise ConformanceStageInvalid(f"{where}.stage.id", "the kit names the stage",
                                          stage["id"])
        backend_table = stage.get("backend")
        if not isinstance(backend_table, Mapping) or backend_table.get("name") != backend:
            raise ConformanceStageInvalid(f"{where}.stage.backend.name",
                                          f"must name the backend {backend!r}", backend_table)
        inputs = _arrays(answer.get("inputs", {}), f"{where}.inputs", optional=False)
        bound = {**DEFAULT_BOUND, **_mapping(answer.get("bound"), f"{where}.bound")}
        for key, value in bound.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ConformanceStageInvalid(f"{where}.bound.{key}",
                                              "must be a number >= 0", value)
        slow_params = answer.get("slow_params")
        return cls(
            backend=backend, stage=stage, inputs=inputs or {},
            expected=_arrays(answer.get("expected"), f"{where}.expected", optional=True),
            bound={k: float(v) for k, v in bound.items()},
            params=_mapping(answer.get("params"), f"{where}.params"),
            slow_inputs=_arrays(answer.get("slow_inputs"), f"{where}.slow_inputs",
                                optional=True),
            slow_params=(None if slow_params is None
                         else _mapping(slow_params, f"{where}.slow_params")),
            workdir=workdir,
        )
