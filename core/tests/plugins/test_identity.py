"""The stack identity: what a stored measurement and an evidence record are keyed on."""

from __future__ import annotations

from typing import Any

from edge_core import __version__
from edge_core.backend import BackendInfo, ProbeReport, StageKind
from edge_core.hookspecs import hookimpl
from edge_core.identity import MACHINE_KEYS, identity_digest, runtime_identity
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
