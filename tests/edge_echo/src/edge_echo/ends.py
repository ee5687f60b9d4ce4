"""For ``edge run --input`` and pipeline-input tests: a file of numbers in, a list out."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import numpy as np


class NumbersPrepare:
    """``prepare``: a ``.txt`` file of whitespace-separated numbers -> ``{"x": float32}``."""

    input_suffixes: Final = (".txt",)
    """The files ``edge run --input DIR`` reads from a directory."""

    def __call__(self, source: str) -> dict[str, np.ndarray]:
        """Read the numbers in ``source``.

        Raises:
            OSError: the file cannot be read.
            ValueError: it holds no numbers, or something that is not a number.

        """
        text = Path(source).read_text(encoding="utf-8")
        try:
            values = [float(word) for word in text.split()]
        except ValueError as exc:
            raise ValueError(f"{source}: not a list of numbers: {exc}") from None
        if not values:
            raise ValueError(f"{source}: holds no numbers: ''")
        return {"x": np.asarray(values, dtype=np.float32)}


prepare: Final = NumbersPrepare()
"""The instance a pipeline names as ``prepare``."""


def finish(outputs: Mapping[str, np.ndarray], inputs: Mapping[str, np.ndarray],
           bundles: Mapping[str, Any]) -> list[float]:
    """The final stage's ``x`` as a list of numbers."""
    return [float(v) for v in np.asarray(outputs["x"]).ravel()]


def add_carried_offset(previous: Mapping[str, np.ndarray],
                       source: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``x`` plus the pipeline input ``carry:offset``, which the first stage never saw.

    Raises:
        ValueError: the previous stage's outputs hold ``carry:offset`` (it was sent to it).

    """
    if "carry:offset" in previous:
        raise ValueError("previous: the first stage was sent a carry:* pipeline input")
    return {"x": previous["x"] + source["carry:offset"]}
