"""The pipeline's two ends for ``edge run``: an image file in, recognised lines out.

``pipeline.toml`` names them as ``prepare`` and ``finish``:

* :data:`prepare` reads an image file (PNG, JPEG, BMP, WebP, TIFF, ... through
  :func:`edge_ocr_example.images.read_image`: on white, upright, RGB) and returns the
  detection stage's input at its bucket; a file it cannot read raises
  :class:`~edge_ocr_example.images.ImageInputError` (a ``ValueError``) naming the file and
  the reason, which ``edge run`` reports with exit code 2 before the pipeline opens. Its
  ``input_suffixes`` tell ``edge run --input DIR`` which files of a directory to read;
* :func:`finish` decodes the recogniser's outputs (plus the carried boxes) into lines,
  with the character table read from the recognise stage's *verified* bundle.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np

from edge_ocr_example.buckets import DET_INPUT, DET_SHAPE, FLOAT
from edge_ocr_example.decode import character_table, decode
from edge_ocr_example.images import IMAGE_SUFFIXES, read_image
from edge_ocr_example.preprocess import preprocess

__all__ = ["ImagePrepare", "finish", "prepare"]

CHARACTERS_FILE = "characters.txt"


class ImagePrepare:
    """The pipeline's ``prepare``: an image file -> the detection stage's inputs."""

    input_suffixes: Final = IMAGE_SUFFIXES
    """File suffixes ``edge run --input DIR`` reads from a directory."""

    def __call__(
        self, source: str,
        input_buffer: Callable[[str, tuple[int, ...], Any], np.ndarray] | None = None,
    ) -> dict[str, np.ndarray]:
        """Read the image at ``source`` and letterbox it into the detection bucket.

        With ``input_buffer`` (the pipeline's, offered by
        :func:`edge_core.config.transforms.call_prepare`) the bucket is written straight
        into one, so the detection input travels to its worker without a copy.

        Raises:
            ImageInputError: the file is missing, empty, not an image, truncated or too
                large.

        """
        out = None if input_buffer is None else input_buffer(DET_INPUT, DET_SHAPE, FLOAT)
        return preprocess(read_image(source), out=out)


prepare: Final = ImagePrepare()
"""The instance ``pipeline.toml`` names as ``prepare``."""


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
