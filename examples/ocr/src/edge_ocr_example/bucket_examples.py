"""Example inputs (and expected outputs) per bucket, for the bundles' shape sets.

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
    REC_BATCHES,
    REC_HEIGHT,
    REC_WIDTHS,
)
from edge_ocr_example.crops import crop_box, fit_crop, rotate_half_turn
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
