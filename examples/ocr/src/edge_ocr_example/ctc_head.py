"""The recogniser's CTC head: greedy decoding's reductions appended to its graph.

The PP-OCRv4 recogniser ends in a softmax over 6625 classes for each of ``T`` time
steps: ``N x T x 6625`` float32, 26 KiB a step, 2 MiB for one row 640 pixels wide. Greedy
CTC decoding reads two things of it per step: the best class and its probability. The
page pipeline's recogniser bundle (:mod:`edge_ocr_example.page_bundle`) appends both to
the graph as :data:`~edge_ocr_example.buckets.REC_BEST` (``ArgMax`` over the classes,
``N x T`` int64, the first of equal maxima as numpy's ``argmax`` picks) and
:data:`~edge_ocr_example.buckets.REC_CONFIDENCE` (``ReduceMax``, ``N x T`` float32) and
drops the probabilities from the graph's outputs, so a call returns 12 bytes a step
instead of 26 KiB: the worker does not write the probabilities to shared memory, the
controller does not copy them out, and :func:`~edge_ocr_example.decode.ctc_best_decode`
reads the same values :func:`~edge_ocr_example.decode.ctc_greedy_decode` would take from
them (the same texts and scores, bit for bit).
"""

from __future__ import annotations

from typing import Final

import onnx
from onnx import TensorProto, helper

from edge_ocr_example.buckets import REC_BEST, REC_CONFIDENCE, REC_OUTPUT
from edge_ocr_example.errors import OcrError

__all__ = ["CLASS_AXIS", "with_ctc_head"]

CLASS_AXIS: Final = 2
"""The classes' axis of the recogniser's ``N x T x C`` probabilities."""
_OPSET_MAX: Final = 17
"""``ReduceMax`` takes its axes as an attribute up to opset 17 (an input from 18)."""


def with_ctc_head(graph: bytes, probabilities: str = REC_OUTPUT) -> bytes:
    """The recogniser's graph with its probabilities replaced by the best class and its value.

    Metadata (the ``character`` dictionary), opset and every other node are kept.

    Raises:
        OcrError: the graph does not output ``probabilities``, already has a head, or its
            default-domain opset takes ``ReduceMax``'s axes as an input (above 17).

    """
    model = onnx.load_from_string(graph)
    outputs = [output.name for output in model.graph.output]
    if probabilities not in outputs:
        raise OcrError("recognize.graph.outputs", f"expected {probabilities!r}", outputs)
    if REC_BEST in outputs or REC_CONFIDENCE in outputs:
        raise OcrError("recognize.graph.outputs", "already has a CTC head", outputs)
    opset = next((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")),
                 None)
    if opset is None or opset > _OPSET_MAX:
        raise OcrError("recognize.graph.opset", f"expected at most {_OPSET_MAX}", opset)
    model.graph.node.extend([
        helper.make_node("ArgMax", [probabilities], [REC_BEST], name="ctc_head_argmax",
                         axis=CLASS_AXIS, keepdims=0),
        helper.make_node("ReduceMax", [probabilities], [REC_CONFIDENCE], name="ctc_head_max",
                         axes=[CLASS_AXIS], keepdims=0),
    ])
    del model.graph.output[:]
    model.graph.output.extend([
        helper.make_tensor_value_info(REC_BEST, TensorProto.INT64, ["N", "T"]),
        helper.make_tensor_value_info(REC_CONFIDENCE, TensorProto.FLOAT, ["N", "T"]),
    ])
    onnx.checker.check_model(model)
    serialised: bytes = model.SerializeToString()
    return serialised
