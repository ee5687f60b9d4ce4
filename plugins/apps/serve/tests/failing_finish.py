"""A local test ``finish`` that raises for some inputs, as the model's own code may.

Named by a pipeline file (``finish = "failing_finish:finish"``): an input whose first value
is 1 is answered ``{"size": n}``; 2 makes it raise ``RuntimeError``, 3 a ``ValueError``
(no request's fault either: the finish failed), anything else a ``KeyError``. The server
needs this folder on its ``PYTHONPATH``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np


def finish(outputs: Mapping[str, np.ndarray], inputs: Mapping[str, np.ndarray],
           bundles: object) -> dict[str, Any]:
    """``{"size": n}`` for an input starting with 1; raises for any other."""
    first = float(inputs["x"].ravel()[0])
    if first == 1.0:
        return {"size": int(outputs["x"].size)}
    if first == 2.0:
        raise RuntimeError("the labels file is gone")
    if first == 3.0:
        raise ValueError("scores and labels differ in length: 4 and 3")
    return {"size": {"missing": 1}["x"]}  # a KeyError: 'x'
