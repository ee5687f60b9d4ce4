"""The fixed input buckets of the three stages and the tensor names the graphs use.

The edge placement gate freezes every stage's inputs to its example bucket, so each stage
runs at exactly one shape. The choices (and the measurements behind them) are explained in
the example's README:

* detection: one 1x3x640x640 image (the generated page is rendered at that size; larger or
  differently shaped images are letterboxed into it);
* classification: 8 crops of 3x48x192 (the direction classifier's training shape);
* recognition: 8 crops of 3x48x640 (a 13.3:1 line fits without being squeezed).

Fewer crops than the batch are padded with blank (zero) crops and the valid count travels
as a carried tensor; more are truncated to the first ``CROP_BATCH`` in reading order.
"""

from __future__ import annotations

from typing import Final

import numpy as np

__all__ = [
    "CARRY_PREFIX",
    "CLS_HEIGHT",
    "CLS_INPUT",
    "CLS_OUTPUT",
    "CLS_SHAPE",
    "CLS_WIDTH",
    "CROP_BATCH",
    "DET_HEIGHT",
    "DET_INPUT",
    "DET_OUTPUT",
    "DET_SHAPE",
    "DET_WIDTH",
    "FLOAT",
    "REC_CLASSES",
    "REC_HEIGHT",
    "REC_INPUT",
    "REC_OUTPUT",
    "REC_SHAPE",
    "REC_STEPS",
    "REC_WIDTH",
    "STAGE_IDS",
]

FLOAT: Final = np.dtype(np.float32)
"""The dtype of every graph input and output."""

STAGE_IDS: Final = ("detect", "classify", "recognize")
"""Stage ids in data-flow order."""

DET_HEIGHT: Final = 640
"""Detection input height in pixels (a multiple of 32, as the DB network needs)."""
DET_WIDTH: Final = 640
"""Detection input width in pixels (a multiple of 32)."""
DET_SHAPE: Final = (1, 3, DET_HEIGHT, DET_WIDTH)
"""The detection bucket: one normalised RGB image, NCHW."""
DET_INPUT: Final = "x"
"""Input name of the detection graph."""
DET_OUTPUT: Final = "sigmoid_0.tmp_0"
"""Output name of the detection graph: the 1x1xHxW text probability map."""

CROP_BATCH: Final = 4
"""How many text crops the classifier and the recogniser take per call."""

CLS_HEIGHT: Final = 48
"""Classifier crop height."""
CLS_WIDTH: Final = 192
"""Classifier crop width."""
CLS_SHAPE: Final = (CROP_BATCH, 3, CLS_HEIGHT, CLS_WIDTH)
"""The classifier bucket."""
CLS_INPUT: Final = "x"
"""Input name of the direction classifier."""
CLS_OUTPUT: Final = "save_infer_model/scale_0.tmp_1"
"""Output name of the direction classifier: Nx2 probabilities of 0 and 180 degrees."""

REC_HEIGHT: Final = 48
"""Recogniser crop height."""
REC_WIDTH: Final = 480
"""Recogniser crop width."""
REC_SHAPE: Final = (CROP_BATCH, 3, REC_HEIGHT, REC_WIDTH)
"""The recogniser bucket."""
REC_INPUT: Final = "x"
"""Input name of the recogniser."""
REC_OUTPUT: Final = "softmax_11.tmp_0"
"""Output name of the recogniser: NxTxC per-step character probabilities."""
REC_STEPS: Final = REC_WIDTH // 8
"""Time steps the recogniser emits for one crop (its width is downsampled 8 times)."""
REC_CLASSES: Final = 6625
"""Recogniser classes: the CTC blank, 6623 dictionary characters and the space."""

CARRY_PREFIX: Final = "carry:"
"""Prefix of tensors a transform passes on to the next transform rather than to a graph.

A transform's result holds the next stage's graph inputs plus, under this prefix, the
context the following transform (or the final decode) needs: the boxes, the valid crop
count, the direction decisions. The pipeline strips carried tensors before the stage call
and merges them into the ``previous`` mapping handed to the next transform.
"""
