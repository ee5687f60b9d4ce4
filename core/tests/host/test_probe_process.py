"""Probe subprocesses start as workers do: allowlisted environment, stdin closed, bounded,
and (for Python) the working directory off ``sys.path``."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edge_core.host.errors import RouteRefused
from edge_core.host.probe_process import DROP_CWD, probe_environment, run_probe

SECRETS = {"EDGE_TEST_SECRET": "s3cr3t-edge", "AWS_SECRET_ACCESS_KEY": "s3cr3t-aws",
           "PYTHONSTARTUP": "/nonexistent/startup.py"}

# What the probe process itself was started with: /proc/self/environ where there is one.
REPORT = DROP_CWD + """
import json, os, sys
try:
    raw = open("/proc/self/environ", "rb").read().split(b"\\0")
    env = dict(e.decode().split("=", 1) for e in raw if b"=" in e)
except OSError:
    env = dict(os.environ)
stdin = os.readlink("/proc/self/fd/0") if os.path.exists("/proc/self/fd/0") else None
print(json.dumps({"env": env, "stdin": stdin, "path0": sys.path[0]}))
"""


def _report(**kwargs: object) -> dict[str, object]:
    done = run_probe([sys.executable, "-c", REPORT], timeout_s=30.0, **kwargs)  # type: ignore[arg-type]
    assert done.returncode == 0, done.stderr
    found: dict[str, object] = json.loads(done.stdout)
    return found


def test_a_probe_does_not_see_the_controllers_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("EDGE_TEST_DECLARED", "wanted")
    monkeypatch.setenv("EDGE_TESTPREFIX_ONE", "one")
    found = _report(declared=("EDGE_TEST_DECLARED", "EDGE_TESTPREFIX_*"),
                    values={"EDGE_TEST_SET": "set"})
    env = found["env"]
    assert isinstance(env, dict)
    assert not set(SECRETS) & set(env)
    assert not any(v in SECRETS.values() for v in env.values())
    assert env["PATH"] == os.environ["PATH"]
    assert env["EDGE_TEST_DECLARED"] == "wanted"
    assert env["EDGE_TESTPREFIX_ONE"] == "one"
    assert env["EDGE_TEST_SET"] == "set"


def test_the_environment_is_the_allowlist_of_the_given_source() -> None:
    source = {"PATH": "/bin", "HOME": "/h", "LC_ALL": "C", "EDGE_SPIN_US": "5",
              "EDGE_TEST_SECRET": "x", "PYTHONPATH": "/p", "PYTHONINSPECT": "1", "N_X": "1"}
    assert probe_environment(source, declared=("N_*",)) == {
        "PATH": "/bin", "HOME": "/h", "LC_ALL": "C", "EDGE_SPIN_US": "5",
        "PYTHONPATH": "/p", "N_X": "1", "ORT_DISABLE_TELEMETRY": "1"}


@pytest.mark.skipif(not Path("/proc/self/fd/0").exists(), reason="needs /proc (Linux)")
def test_a_probes_stdin_is_closed() -> None:
    assert _report()["stdin"] == os.devnull


def test_a_python_probe_does_not_import_from_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "imported"
    for module in ("numpy", "onnxruntime"):
        (tmp_path / f"{module}.py").write_text(
            f"import pathlib\npathlib.Path({str(marker)!r}).write_text({module!r})\n"
            "raise SystemExit(3)\n")
    monkeypatch.chdir(tmp_path)
    script = "import numpy\ntry:\n    import onnxruntime\nexcept ImportError:\n    pass\n"
    done = run_probe([sys.executable, "-c", DROP_CWD + "\n" + script], timeout_s=60.0)
    assert done.returncode == 0, done.stderr
    assert not marker.exists()
    assert _report()["path0"] != ""
    # Without the first line the planted module runs: the check above can fail.
    done = run_probe([sys.executable, "-c", script], timeout_s=60.0)
    if not getattr(sys.flags, "safe_path", 0):
        assert done.returncode == 3 and marker.read_text() == "numpy"


def test_a_probe_past_its_bound_is_killed(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    script = (f"import os, pathlib, time\npathlib.Path({str(pid_file)!r})"
              ".write_text(str(os.getpid()))\ntime.sleep(60)\n")
    with pytest.raises(subprocess.TimeoutExpired):
        run_probe([sys.executable, "-c", script], timeout_s=2.0)
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.parametrize("bound", [0, -1.0, math.nan, math.inf, True, "5"])
def test_a_bound_that_is_not_a_positive_finite_number_is_refused(bound: object) -> None:
    with pytest.raises(ValueError, match=r"^timeout_s: must be a positive finite number"):
        run_probe([sys.executable, "-c", "pass"], timeout_s=bound)  # type: ignore[arg-type]


def test_a_declared_name_that_is_not_a_name_is_refused() -> None:
    with pytest.raises(RouteRefused, match=r"probe_env_names\[1\]"):
        run_probe([sys.executable, "-c", "pass"], timeout_s=5.0, declared=("OK", "NO SPACE"))
