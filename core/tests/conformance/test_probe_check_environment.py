"""The ``probe_fast_and_light`` check's fresh interpreter is a probe: it gets the probe
allowlist plus the plugin loader's settings, never the controller's secrets, and never
imports from the working directory."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from edge_core.plugins import load_plugins
from edge_core.testing.results import Status
from edge_core.testing.runner import run_backend

SECRETS = {"EDGE_TEST_SECRET": "s3cr3t-edge", "AWS_SECRET_ACCESS_KEY": "s3cr3t-aws"}


def test_the_fresh_interpreter_of_the_probe_check_is_isolated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    modules, work = tmp_path / "modules", tmp_path / "work"
    modules.mkdir()
    work.mkdir()
    seen = tmp_path / "seen.json"
    (modules / "environ_probe_plugin.py").write_text(textwrap.dedent(f'''
        import json, os, sys
        from edge_core import hookimpl
        EDGE_CONTRACT = "1.0"

        @hookimpl
        def edge_backends():
            from edge_core.backend import BackendInfo
            return [BackendInfo(name="environ", kinds=["graph"])]

        @hookimpl
        def edge_probe():
            from edge_core.backend import ProbeReport
            with open({str(seen)!r}, "w") as out:
                json.dump({{"env": dict(os.environ), "path": sys.path}}, out)
            return [ProbeReport(backend="environ", available=True)]
    '''), encoding="utf-8")
    marker = tmp_path / "imported"
    (work / "numpy.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('x')\nraise SystemExit(3)\n")
    monkeypatch.syspath_prepend(str(modules))
    monkeypatch.setenv("PYTHONPATH", str(modules))
    monkeypatch.setenv("EDGE_TRACE_HOOKS", "0")
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    plugins = load_plugins(local_modules=["environ_probe_plugin"], env={"EDGE_PLUGINS": ""})
    seen.unlink(missing_ok=True)  # in case loading ran the probe in this process
    monkeypatch.chdir(work)
    (result,) = run_backend(plugins, "environ", ["probe_fast_and_light"]).results
    assert result.status is Status.PASSED, result.detail
    found = json.loads(seen.read_text())
    assert not set(SECRETS) & set(found["env"])
    assert found["env"]["EDGE_PLUGINS"] == "environ_probe_plugin"
    assert found["env"]["EDGE_TRACE_HOOKS"] == "0"
    assert "" not in found["path"] and str(work) not in found["path"]
    assert not marker.exists()
