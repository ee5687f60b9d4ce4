"""The shape sets of the three stages and the tensor names the graphs use.

Every stage serves a declared set of shapes (``metadata.validation.shapes`` in its bundle),
each warmed up and gated at load; anything else is refused before it is sent:

* detection: a dynamic range, height and width ``DET_RANGE`` (320 to 960 in steps of 32);
  ``preprocess`` letterboxes every image into 1x3x640x640 (the generated page is rendered
  at that size), inside the range, and the range is there for page-scale inputs;
* classification: batches of ``CLS_BATCHES`` crops of 3x48x192 (the direction classifier's
  training shape);
* recognition: ``REC_BATCHES`` x ``REC_WIDTHS`` (batch 1, 4 or 8 crops 48 high and 320,
  640, 960 or 1280 wide), so that a short line is not run at the width of a long one and
  a long line is not squeezed. Batch 16 was measured and left out: its four buckets
  lengthened the warm-up gate and raised the worker's peak memory, for no throughput gain
  on 2 cores (the figures: "Figures moved from the prose" in benchmarks/RESULTS.md).

A page's crops are mapped over these buckets within one request (``edge_core.runtime.Fanout``):
every detected line is classified and recognised, however many there are
(:mod:`edge_ocr_example.chunks` chooses the chunks).
"""

from __future__ import annotations

from typing import Final

import numpy as np

__all__ = [
    "CARRY_PREFIX",
    "CLS_BATCHES",
    "CLS_HEIGHT",
    "CLS_INPUT",
    "CLS_OUTPUT",
    "CLS_WIDTH",
    "DET_HEIGHT",
    "DET_INPUT",
    "DET_OUTPUT",
    "DET_RANGE",
    "DET_SHAPE",
    "DET_WIDTH",
    "FLOAT",
    "REC_BATCHES",
    "REC_BEST",
    "REC_CLASSES",
    "REC_CONFIDENCE",
    "REC_HEIGHT",
    "REC_INPUT",
    "REC_OUTPUT",
    "REC_STRIDE",
    "REC_WIDTHS",
    "STAGE_IDS",
    "STAGE_RAM",
]

FLOAT: Final = np.dtype(np.float32)
"""The dtype of every graph input and output."""

STAGE_IDS: Final = ("detect", "classify", "recognize")
"""Stage ids in data-flow order."""

DET_HEIGHT: Final = 640
"""Detection input height in pixels (a multiple of 32, as the DB network needs)."""
DET_WIDTH: Final = 640
"""Detection input width in pixels (a multiple of 32)."""
DET_RANGE: Final = (320, 960, 32)
"""Height and width the detection stage serves: ``(low, high, step)``; the DB network
downsamples by 32, so sizes are multiples of 32."""
DET_SHAPE: Final = (1, 3, DET_HEIGHT, DET_WIDTH)
"""The detection bucket: one normalised RGB image, NCHW."""
DET_INPUT: Final = "x"
"""Input name of the detection graph."""
DET_OUTPUT: Final = "sigmoid_0.tmp_0"
"""Output name of the detection graph: the 1x1xHxW text probability map."""

CLS_BATCHES: Final = (1, 4, 8, 16)
"""Crops per classifier call: the batch buckets of the classifier's shape set."""
CLS_HEIGHT: Final = 48
"""Classifier crop height."""
CLS_WIDTH: Final = 192
"""Classifier crop width."""
CLS_INPUT: Final = "x"
"""Input name of the direction classifier."""
CLS_OUTPUT: Final = "save_infer_model/scale_0.tmp_1"
"""Output name of the direction classifier: Nx2 probabilities of 0 and 180 degrees."""

REC_HEIGHT: Final = 48
"""Recogniser crop height."""
REC_BATCHES: Final = (1, 4, 8)
"""Crops per recogniser call: the batch axis of the recogniser's buckets."""
REC_WIDTHS: Final = (320, 640, 960, 1280)
"""Recogniser crop widths: the width axis of its buckets (a wider line is squeezed to the
largest)."""
REC_INPUT: Final = "x"
"""Input name of the recogniser."""
REC_OUTPUT: Final = "softmax_11.tmp_0"
"""Output name of the recogniser: NxTxC per-step character probabilities."""
REC_BEST: Final = "ctc_best"
"""Output of the page pipeline's recogniser (its CTC head, :mod:`edge_ocr_example.ctc_head`):
NxT int64, the best class of each step."""
REC_CONFIDENCE: Final = "ctc_confidence"
"""Output of the page pipeline's recogniser (its CTC head): NxT float32, the best class's
probability at each step."""
REC_STRIDE: Final = 8
"""The recogniser emits one time step per this many pixels of crop width."""
REC_CLASSES: Final = 6625
"""Recogniser classes: the CTC blank, 6623 dictionary characters and the space."""

STAGE_RAM: Final = {"detect": "352 MiB", "classify": "128 MiB", "recognize": "352 MiB"}
"""Worker memory to reserve per stage: its peak plus a quarter, rounded up to 32 MiB.
Measured on the 2-vCPU machine with the default arena settings (the worker tree's peak
resident set after the warm-up of every bucket, 640 x 640 and batch 8 x 1280 included,
and 13 varied pages): detection 262 MiB, the classifier 78 MiB, the recogniser 274 MiB
(460 MB when batch 16 was served)."""

CARRY_PREFIX: Final = "carry:"
"""Prefix of tensors a transform passes on to the next transform rather than to a graph.

A transform's result holds the next stage's graph inputs plus, under this prefix, the
context the following transform (or the final decode) needs: the boxes, the valid crop
count, the direction decisions. The pipeline strips carried tensors before the stage call
and merges them into the ``previous`` mapping handed to the next transform.
"""
