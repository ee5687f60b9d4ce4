"""A local test ``prepare``: a text file of numbers, the first of them how long to take.

Named by a pipeline file (``prepare = "slow_prepare:prepare"``) so that a request's
deadline can pass while ``prepare`` runs; the server needs this folder on its
``PYTHONPATH``.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np


def prepare(source: str) -> dict[str, np.ndarray]:
    """Sleep the file's first number of seconds; the rest of its numbers are ``x``."""
    values = [float(word) for word in Path(source).read_text(encoding="utf-8").split()]
    time.sleep(values[0])
    return {"x": np.asarray(values[1:], dtype=np.float32)}
