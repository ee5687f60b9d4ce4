"""The workspace's distributions, as the packaging tests see them."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

#: Every distribution this repository publishes (the template under examples/ is not one).
DIRS = ["contracts", "core", "plugins/libraries/ort", "plugins/backends/ort_cpu",
        "plugins/backends/ort_directml", "plugins/backends/ort_vitisai", "plugins/backends/qnn",
        "plugins/backends/vllm_cuda", "plugins/apps/serve", "tests/edge_echo", "examples/ocr"]


def project(directory: str) -> dict[str, Any]:
    """The ``[project]`` table of ``directory/pyproject.toml``."""
    with (ROOT / directory / "pyproject.toml").open("rb") as handle:
        table: dict[str, Any] = tomllib.load(handle)["project"]
    return table


def packages(directory: str) -> list[str]:
    """The import packages the distribution's wheel ships (from its hatch wheel target)."""
    with (ROOT / directory / "pyproject.toml").open("rb") as handle:
        target = tomllib.load(handle)["tool"]["hatch"]["build"]["targets"]["wheel"]
    return [Path(p).name for p in target["packages"]]


def wheel_name(directory: str) -> str:
    """The distribution name as wheel file names spell it."""
    return str(project(directory)["name"]).replace("-", "_")
