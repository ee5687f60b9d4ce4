"""A local test ``finish`` that reads a model asset from its stage's bundle folder.

Named by a pipeline file (``finish = "bundle_finish:finish"``): the answer is the size of
the graph file of stage ``s``'s bundle, found through the ``bundles`` mapping the server
passes (:mod:`edge_core.runtime.bundle_folders`), as a finish reading a character table
would. A bundle verified in place and rewritten since the stage opened is refused there
with ``BundleChanged``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


def finish(outputs: Mapping[str, Any], inputs: Mapping[str, Any],
           bundles: Mapping[str, Path | None]) -> dict[str, Any]:
    """``{"graph_bytes": n}``: the size of ``model.onnx`` in stage ``s``'s bundle folder."""
    folder = bundles["s"]
    assert folder is not None
    return {"graph_bytes": (Path(folder) / "model.onnx").stat().st_size}
