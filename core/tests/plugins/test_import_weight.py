"""The controller stays light: listing and probing plugins imports no heavy runtime."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("numpy", "onnxruntime", "torch", "vllm", "qai_hub", "onnx")

SCRIPT = """
import contextlib, io, json, sys
from edge_core.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    code = main(sys.argv[1:])
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


@pytest.mark.parametrize(
    "argv",
    [["plugins", "--json"], ["plugins", "--json", "--backends"], ["probe", "--json"]],
)
def test_cli_commands_import_no_heavy_runtime(argv: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, *argv], capture_output=True, text=True, timeout=60,
        check=True,
    )
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["code"] == 0
    loaded = {name.split(".")[0] for name in report["modules"]}
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))
    # The in-tree plugins really were imported (the check would be empty otherwise).
    assert "edge_ort_cpu" in loaded


def test_plain_plugin_listing_imports_neither_pluggy_nor_attrs() -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, "plugins", "--json"], capture_output=True, text=True,
        timeout=60, check=True,
    )
    loaded = {name.split(".")[0] for name in json.loads(result.stdout)["modules"]}
    assert {"pluggy", "attrs", "attr"}.isdisjoint(loaded)
    assert "edge_qnn" in loaded
