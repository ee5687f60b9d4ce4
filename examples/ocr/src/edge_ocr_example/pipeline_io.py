"""The pipeline's two ends for ``edge run``: an image file in, recognised lines out.

``pipeline.toml`` names them as ``prepare`` and ``finish``:

* :func:`prepare` reads an image file (any format Pillow reads) and returns the
  detection stage's input at its bucket;
* :func:`finish` decodes the recogniser's outputs (plus the carried boxes) into lines,
  with the character table read from the recognise stage's *verified* bundle.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from edge_ocr_example.buckets import DET_INPUT, DET_SHAPE, FLOAT
from edge_ocr_example.decode import character_table, decode
from edge_ocr_example.preprocess import preprocess

__all__ = ["finish", "prepare"]

CHARACTERS_FILE = "characters.txt"


def prepare(
    source: str, input_buffer: Callable[[str, tuple[int, ...], Any], np.ndarray] | None = None
) -> dict[str, np.ndarray]:
    """Read the image at ``source`` and letterbox it into the detection bucket.

    With ``input_buffer`` (the pipeline's, given by ``edge run``) the bucket is written
    straight into one, so the detection input travels to its worker without a copy.
    """
    with Image.open(source) as image:
        pixels = np.asarray(image.convert("RGB"), dtype=np.uint8)
    out = None if input_buffer is None else input_buffer(DET_INPUT, DET_SHAPE, FLOAT)
    return preprocess(pixels, out=out)


def finish(outputs: Mapping[str, np.ndarray], inputs: Mapping[str, np.ndarray],
           bundles: Mapping[str, Path | None]) -> list[dict[str, Any]]:
    """Recognised lines as JSON: text, score and box (detection-bucket pixels)."""
    directory = bundles.get("recognize")
    if directory is None:
        raise ValueError("bundles.recognize: the recognise stage has no bundle: None")
    dictionary = (Path(directory) / CHARACTERS_FILE).read_text(encoding="utf-8")
    characters = character_table(dictionary.split("\n"))
    return [
        {"text": line.text, "score": round(float(line.score), 4),
         "box": np.asarray(line.box).round(1).tolist()}
        for line in decode(outputs, inputs, characters=characters)
    ]
