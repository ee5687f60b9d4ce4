"""What a measurement times: one identical workload for every candidate.

In order of precedence: the sources the caller gives (``edge run --input``, ``edge plan
--input``), the pipeline's own ``workload``, and only without either the first stage's
bundled example inputs. A source goes through the pipeline's ``prepare`` when it has one
(an image path becomes the first stage's tensors), and is an ``.npz`` of first-stage
inputs otherwise (read with pickle disabled). Everything is read before any candidate is
timed, so every candidate sees the same arrays.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from edge_core.config.model import PipelineConfig
from edge_core.config.transforms import resolve_input_transform
from edge_core.errors import ConfigError

__all__ = ["Workload", "examples_workload", "load_workload"]


@attrs.frozen
class Workload:
    """The inputs every candidate is timed on, and where they came from."""

    inputs: tuple[Mapping[str, Any], ...]
    """The first stage's inputs, one mapping per request of a round."""
    sources: tuple[str, ...]
    """The files they were read from (empty for bundled examples)."""
    origin: str
    """``--input``, ``workload`` or ``examples``."""
    note: str
    """One line for the plan: what was timed."""
    params: Mapping[str, Any] | None = None
    """Request parameters for the final stage (``edge run --params``), if any."""

    def to_json(self) -> dict[str, Any]:
        """JSON-ready description (not the arrays)."""
        return {"origin": self.origin, "sources": list(self.sources), "note": self.note,
                "requests": len(self.inputs)}


def _read_npz(path: Path, field: str) -> dict[str, Any]:
    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as archive:
            return {name: archive[name] for name in archive.files}
    except (OSError, ValueError) as exc:
        raise ConfigError(field, f"not a readable .npz of first-stage inputs ({exc})",
                          str(path)) from None


def load_workload(config: PipelineConfig, sources: Sequence[str | os.PathLike[str]] = (),
                  *, field: str = "input") -> Workload | None:
    """The workload from ``sources``, else the pipeline's ``workload``; ``None`` without.

    Raises:
        ConfigError: a source cannot be read — naming ``field[i]`` for given sources,
            ``workload[i]`` for the pipeline's — or ``prepare`` cannot be imported.

    """
    if sources:
        paths, origin, where = [str(s) for s in sources], "--input", field
    elif config.workload:
        paths, origin, where = [str(p) for p in config.workload], "workload", "workload"
    else:
        return None
    prepare: Callable[..., object] | None = None
    if config.prepare is not None:
        prepare = resolve_input_transform(config.prepare, "prepare")
    inputs: list[Mapping[str, Any]] = []
    for index, source in enumerate(paths):
        name = f"{where}[{index}]"
        if prepare is None:
            inputs.append(_read_npz(Path(source), name))
            continue
        try:
            prepared = prepare(source)
        except (OSError, ValueError) as exc:
            raise ConfigError(name, f"{type(exc).__name__}: {exc}", source) from None
        if not isinstance(prepared, Mapping):
            raise ConfigError(name, f"prepare returned {type(prepared).__name__}, not a "
                              "mapping of inputs", source)
        inputs.append(dict(prepared))
    shown = ", ".join(Path(p).name for p in paths[:3]) + (" ..." if len(paths) > 3 else "")
    what = "--input" if origin == "--input" else "the pipeline's workload"
    return Workload(inputs=tuple(inputs), sources=tuple(paths), origin=origin,
                    note=f"{what}: {shown}")


def examples_workload(stage_id: str, inputs: Mapping[str, Any], member: str) -> Workload:
    """The first stage's bundled example inputs (``member`` of its bundle) as the workload."""
    return Workload(inputs=(dict(inputs),), sources=(), origin="examples",
                    note=f"the example inputs bundled with stage {stage_id!r} ({member})")
