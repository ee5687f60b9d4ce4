"""The ONNX graphs shipped as package data are exactly what their tools write today."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("tool", ["plugins/libraries/ort/tools/make_graphs.py",
                                  "plugins/backends/qnn/tools/make_graphs.py"])
def test_packaged_graphs_are_what_the_tool_writes(tool: str) -> None:
    result = subprocess.run([sys.executable, str(ROOT / tool), "--check"],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr


def test_check_reports_a_stale_graph(tmp_path: Path) -> None:
    """The check is not vacuous: a changed graph file makes it fail."""
    import importlib.util

    tool = ROOT / "plugins/libraries/ort/tools/make_graphs.py"
    spec = importlib.util.spec_from_file_location("ort_graphs", tool)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.OUT = tmp_path
    assert module.main([]) == 0
    assert module.main(["--check"]) == 0
    (tmp_path / "add_relu.onnx").write_bytes(b"\x08\x09")
    assert module.main(["--check"]) == 1
