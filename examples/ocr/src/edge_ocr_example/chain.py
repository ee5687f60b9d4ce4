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
from typing import Final

import numpy as np

from edge_ocr_example.transforms import classify_to_recognize, detect_to_classify, split_carry

__all__ = ["STAGES", "ChainTrace", "StageRunner", "StageSpec", "Transform", "run_chain"]

Transform = Callable[[Mapping[str, np.ndarray], Mapping[str, np.ndarray]], dict[str, np.ndarray]]
"""A transform: ``(previous stage outputs + carried, pipeline inputs) -> next inputs + carried``."""

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

    inputs: dict[str, dict[str, np.ndarray]]
    """Stage id -> the graph inputs it was called with."""
    outputs: dict[str, dict[str, np.ndarray]]
    """Stage id -> the graph outputs it returned."""
    final: dict[str, np.ndarray]
    """The last stage's outputs plus the carried tensors: what the final decode takes."""


def run_chain(run_stage: StageRunner, source: Mapping[str, np.ndarray]) -> ChainTrace:
    """Run ``source`` (the detection inputs) through all stages with ``run_stage``."""
    inputs: dict[str, dict[str, np.ndarray]] = {}
    outputs: dict[str, dict[str, np.ndarray]] = {}
    previous: dict[str, np.ndarray] = {}
    for stage in STAGES:
        if stage.transform is None:
            stage_inputs, carried = dict(source), dict[str, np.ndarray]()
        else:
            stage_inputs, carried = split_carry(stage.transform(previous, source))
        stage_outputs = dict(run_stage(stage.id, stage_inputs))
        inputs[stage.id] = stage_inputs
        outputs[stage.id] = stage_outputs
        previous = {**stage_outputs, **carried}
    return ChainTrace(inputs, outputs, previous)
