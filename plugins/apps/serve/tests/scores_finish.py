"""A local test ``finish``: the echo stage's output as a list of Python floats.

Named by a pipeline file (``finish = "scores_finish:finish"``) so that a request whose
tensor holds NaN or an infinity makes ``finish`` return a number strict JSON cannot carry
(the echo stage doubles its input); an input whose first value is 7 makes it return the
NumPy scalars themselves, a type JSON has no form for. The server needs this folder on
its ``PYTHONPATH``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np


def finish(outputs: Mapping[str, np.ndarray], inputs: Mapping[str, np.ndarray],
           bundles: object) -> dict[str, Any]:
    """``{"scores": [...]}``: the output ``x`` flattened, as Python floats, with its size
    (a non-finite input makes a non-finite score); NumPy scalars when the input's first
    value is 7 exactly (``{"scores": [np.float32, ...]}``)."""
    flat = outputs["x"].ravel()
    if flat.size and float(inputs["x"].ravel()[0]) == 7.0:
        return {"size": int(flat.size), "scores": list(flat)}
    return {"size": int(flat.size), "scores": [float(v) for v in flat]}
