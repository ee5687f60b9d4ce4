"""A route's ``env`` table: set in the worker's environment, names only in plans."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from edge_core.config import load_pipeline
from edge_core.errors import ConfigError

PIPELINE = """
name = "p"

[[stages]]
id = "det"
manifest = "m"

[stages.backend]
name = "ort-cpu"

[stages.backend.route]
name = "vendor"
interpreter = "{python}"
env = {{ VENDOR_ROOT = "/opt/vendor", {extra} }}
"""


def _load(tmp_path: Path, extra: str = 'B = "2"') -> object:
    path = tmp_path / "pipeline.toml"
    path.write_text(PIPELINE.format(python=sys.executable, extra=extra), encoding="utf-8")
    return load_pipeline(path)


def test_route_env_reaches_the_host_route_and_the_plan_keeps_only_names(tmp_path: Path) -> None:
    config = _load(tmp_path)
    route = config.stages[0].backend.route  # type: ignore[attr-defined]
    assert dict(route.env) == {"VENDOR_ROOT": "/opt/vendor", "B": "2"}
    host = route.to_host_route("edge_ort.worker:create")
    assert dict(host.env) == {"VENDOR_ROOT": "/opt/vendor", "B": "2"}
    assert host.to_dict()["env"] == ["B", "VENDOR_ROOT"]
    plan = config.to_json()  # type: ignore[attr-defined]
    assert plan["stages"][0]["route"]["env"] == ["B", "VENDOR_ROOT"]


@pytest.mark.parametrize("extra", ["B = 2", 'PYTHONPATH = "/x"', '"BAD NAME" = "1"'])
def test_route_env_refuses_non_strings_pythonpath_and_bad_names(
    tmp_path: Path, extra: str
) -> None:
    with pytest.raises(ConfigError, match=r"route\.env"):
        _load(tmp_path, extra)
