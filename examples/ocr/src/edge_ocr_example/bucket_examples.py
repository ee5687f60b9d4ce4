"""Example inputs (and expected outputs) per bucket, for the bundles' shape sets.

Detection serves a dynamic range (``DET_RANGE``: height and width 320 to 960 in steps of
32, what the DB network's 32-fold downsampling needs), gated at its minimum (the page
downscaled to 320x320), its maximum (upscaled to 960x960) and the page itself at 640x640.
The classifier and the recogniser serve several buckets; the load warms up and gates every
one, so each needs an example in the bundle. Each example is made of the example page's
own crops (turned as the classifier decided, fitted to the bucket's width, repeated to fill
the batch), so the gate runs real text at every shape. Expected outputs come from the
direct onnxruntime run; the recogniser's are kept for batch 1 only (its NxTxC softmax at
16 x 1280 is 68 MB; the other buckets are checked for placement and memory, and their
numerics against nothing, on the CPU).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np

from edge_ocr_example.buckets import (
    CARRY_PREFIX,
    CLS_BATCHES,
    CLS_HEIGHT,
    CLS_WIDTH,
    DET_INPUT,
    DET_RANGE,
    REC_BATCHES,
    REC_HEIGHT,
    REC_WIDTHS,
)
from edge_ocr_example.crops import crop_box, fit_crop, resize_bilinear, rotate_half_turn
from edge_ocr_example.npz import save_npz

__all__ = ["BUCKET_DIR", "bucket_grid", "write_bucket_examples"]

BUCKET_DIR: Final = "buckets"
"""Where a stage bundle keeps its per-bucket examples."""

#: Recogniser buckets whose expected outputs are stored (the rest are large).
_REC_EXPECTED_BATCHES: Final = (1,)


def bucket_grid(stage_id: str) -> list[tuple[int, int, int]]:
    """``(batch, height, width)`` of every bucket of a crop stage, in declaration order."""
    if stage_id == "classify":
        return [(b, CLS_HEIGHT, CLS_WIDTH) for b in CLS_BATCHES]
    if stage_id == "recognize":
        return [(b, REC_HEIGHT, w) for b in REC_BATCHES for w in REC_WIDTHS]
    return []


def _detection_range(
    folder: Path,
    run: Callable[[str, Mapping[str, np.ndarray]], Mapping[str, np.ndarray]],
    source: Mapping[str, np.ndarray],
    input_name: str,
) -> dict[str, Any]:
    """The detection entry: the page at the range's minimum, between and maximum."""
    low, high, step = DET_RANGE
    page = source[DET_INPUT][0]
    (folder / BUCKET_DIR).mkdir()
    examples = []
    for size in (low, page.shape[1], high):
        name = f"page{size}"
        image = page if size == page.shape[1] else resize_bilinear(page, size, size)
        inputs = {input_name: np.ascontiguousarray(image[None], dtype=np.float32)}
        example = {"example_inputs": f"{BUCKET_DIR}/{name}.npz",
                   "expected_outputs": f"{BUCKET_DIR}/{name}.expected.npz"}
        save_npz(folder / example["example_inputs"], inputs)
        save_npz(folder / example["expected_outputs"], dict(run("detect", inputs)))
        examples.append(example)
    side = [low, high, step]
    return {"name": "page",
            "inputs": {input_name: {"dtype": "float32", "dims": [1, 3, side, side]}},
            "examples": examples}


def _crops(source: Mapping[str, np.ndarray], final: Mapping[str, Any],
           stage_id: str) -> list[np.ndarray]:
    image = source[DET_INPUT][0]
    boxes = final[CARRY_PREFIX + "boxes"]
    angles = final.get(CARRY_PREFIX + "angle")
    crops = []
    for index, box in enumerate(boxes):
        crop = crop_box(image, box)
        if stage_id == "recognize" and angles is not None and int(angles[index]) == 180:
            crop = rotate_half_turn(crop)
        crops.append(crop)
    return crops


def write_bucket_examples(
    folder: Path,
    stage_id: str,
    run: Callable[[str, Mapping[str, np.ndarray]], Mapping[str, np.ndarray]],
    source: Mapping[str, np.ndarray],
    final: Mapping[str, Any],
    input_name: str = "x",
) -> Sequence[dict[str, Any]]:
    """Write every bucket's example (and expected outputs) into ``folder/buckets``.

    Returns:
        The stage's ``metadata.validation.shapes`` entries (empty for a one-bucket stage).
    """
    if stage_id == "detect":
        return [_detection_range(folder, run, source, input_name)]
    grid = bucket_grid(stage_id)
    if not grid:
        return []
    crops = _crops(source, final, stage_id)
    if not crops:
        raise ValueError(f"{stage_id}: the example page has no crops to fill the buckets")
    (folder / BUCKET_DIR).mkdir()
    entries = []
    for batch, height, width in grid:
        name = f"b{batch}_w{width}"
        rows = [fit_crop(crops[i % len(crops)], height, width) for i in range(batch)]
        inputs = {input_name: np.stack(rows).astype(np.float32)}
        example: dict[str, Any] = {"example_inputs": f"{BUCKET_DIR}/{name}.npz"}
        save_npz(folder / example["example_inputs"], inputs)
        if stage_id != "recognize" or batch in _REC_EXPECTED_BATCHES:
            example["expected_outputs"] = f"{BUCKET_DIR}/{name}.expected.npz"
            save_npz(folder / example["expected_outputs"], dict(run(stage_id, inputs)))
        entries.append({
            "name": name,
            "inputs": {input_name: {"dtype": "float32",
                                    "dims": [batch, 3, height, width]}},
            "examples": [example],
        })
    return entries
