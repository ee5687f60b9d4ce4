"""Byte-compile the edge packages before a benchmark measures start-up or import times.

An installed wheel is byte-compiled by pip; an editable checkout is compiled lazily, and
not at all when ``PYTHONDONTWRITEBYTECODE`` is set (as in some shells and CI images).
Every fresh worker process would then compile edited modules from source, which is not
what a user's installation does, so the benchmarks compile them first.
"""

from __future__ import annotations

import compileall
import importlib.util
from pathlib import Path

PACKAGES = ("edge_contracts", "edge_core", "edge_ort", "edge_ort_cpu", "edge_ort_directml",
            "edge_ort_vitisai", "edge_qnn", "edge_vllm_cuda", "edge_serve",
            "edge_ocr_example")
"""Every package ``edge`` or a worker may import at start-up (``edge probe`` loads every
installed plugin)."""


def ensure_bytecode() -> None:
    """Write current ``.pyc`` files for every edge package found (quietly)."""
    for name in PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            continue
        for location in spec.submodule_search_locations:
            compileall.compile_dir(Path(location), quiet=2, force=False, legacy=False)
