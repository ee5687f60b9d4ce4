"""The three-stage chain as data plus one driver that any stage runner can plug into.

:data:`STAGES` names each stage, its graph inside the rapidocr wheel and its input
transform (``None`` for the first stage, which takes the pipeline's inputs). :func:`run_chain`
threads the pipeline's inputs through the stages with a caller-supplied ``run_stage``
(direct onnxruntime in the reference and the bundle builder; the edge runtime elsewhere),
applying the carry convention of :mod:`edge_ocr_example.transforms`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from edge_core.fanout import Fanout
from edge_ocr_example.transforms import classify_to_recognize, detect_to_classify, split_carry

__all__ = ["STAGES", "ChainTrace", "StageRunner", "StageSpec", "Transform", "run_chain"]

Transform = Callable[[Mapping[str, Any], Mapping[str, np.ndarray]], Any]
"""A transform: ``(previous outputs + carried, pipeline inputs) -> next inputs + carried``
(a mapping, or a ``Fanout`` of several)."""

StageRunner = Callable[[str, Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]
"""Runs one stage: ``(stage id, graph inputs) -> graph outputs``."""


@dataclass(frozen=True)
class StageSpec:
    """One stage of the OCR pipeline."""

    id: str
    """Stage id (also the bundle's directory name)."""
    graph_member: str
    """Path of the ONNX graph inside the rapidocr-onnxruntime wheel."""
    transform: Transform | None
    """Input transform from the previous stage; ``None`` on the first stage."""
    transform_ref: str | None
    """The transform as an edge config reference (``module:function``)."""


STAGES: Final = (
    StageSpec("detect", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx", None, None),
    StageSpec(
        "classify",
        "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        detect_to_classify,
        "edge_ocr_example.transforms:detect_to_classify",
    ),
    StageSpec(
        "recognize",
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
        classify_to_recognize,
        "edge_ocr_example.transforms:classify_to_recognize",
    ),
)
"""The stages in data-flow order."""


@dataclass(frozen=True)
class ChainTrace:
    """Everything one pass through the chain saw: per-stage graph inputs and outputs."""

    calls: dict[str, list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]]
    """Stage id -> ``(graph inputs, graph outputs)`` of every call, in call order (a
    transform that returns a ``Fanout`` makes one call per item)."""
    final: dict[str, Any]
    """The last stage's outputs plus the carried tensors: what the final decode takes
    (a fanned-out stage's outputs and per-item carries are lists in item order)."""

    @property
    def inputs(self) -> dict[str, dict[str, np.ndarray]]:
        """Stage id -> the graph inputs of its first call."""
        return {stage: calls[0][0] for stage, calls in self.calls.items() if calls}

    @property
    def outputs(self) -> dict[str, dict[str, np.ndarray]]:
        """Stage id -> the graph outputs of its first call."""
        return {stage: calls[0][1] for stage, calls in self.calls.items() if calls}


def run_chain(run_stage: StageRunner, source: Mapping[str, np.ndarray]) -> ChainTrace:
    """Run ``source`` (the detection inputs) through all stages with ``run_stage``.

    Applies the runtime's rules: ``carry:*`` values travel past a stage, and a transform's
    ``Fanout`` calls the stage once per item, gathering outputs into lists in item order.
    """
    calls: dict[str, list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]] = {}
    previous: dict[str, Any] = {}
    for stage in STAGES:
        produced: Any = dict(source) if stage.transform is None else stage.transform(
            previous, source)
        made = calls.setdefault(stage.id, [])
        if isinstance(produced, Fanout):
            gathered: dict[str, Any] = {}
            for item in produced.items:
                stage_inputs, carried = split_carry(item)
                stage_outputs = dict(run_stage(stage.id, stage_inputs))
                made.append((stage_inputs, stage_outputs))
                for name, value in {**stage_outputs, **carried}.items():
                    gathered.setdefault(name, []).append(value)
            previous = {**gathered, **produced.carry}
        else:
            stage_inputs, carried = split_carry(produced)
            stage_outputs = dict(run_stage(stage.id, stage_inputs))
            made.append((stage_inputs, stage_outputs))
            previous = {**stage_outputs, **carried}
    return ChainTrace(calls, previous)
