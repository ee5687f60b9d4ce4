"""Workers start isolated: no module from the working directory, an allowlisted
environment, and the boot token never in the environment or on the command line."""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

import numpy as np
import pytest

from edge_contracts.requests import Operation, StageRequest
from edge_core.host import Route, RouteRefused, start_worker
from edge_core.host.environment import worker_environment

from .conftest import WORKERS, test_route

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/<pid>/environ")

TRAP = "import pathlib\npathlib.Path({marker!r}).write_text('imported')\nraise SystemExit(3)\n"


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


def test_a_module_in_the_working_directory_is_never_imported_by_a_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, start
) -> None:
    marker = tmp_path / "imported"
    for name in ("numpy", "onnxruntime", "edge_test_workers"):
        (tmp_path / f"{name}.py").write_text(TRAP.format(marker=str(marker)))
    monkeypatch.chdir(tmp_path)
    client = start("echo")
    assert client.hello["versions"]["numpy"] == np.__version__  # the real numpy
    x = np.arange(6, dtype=np.float32)
    request = StageRequest("r1", "s0", 0, 1, Operation.RUN)
    np.testing.assert_array_equal(client.submit(request, {"x": x}).result(timeout=20)["x"], x)
    assert not marker.exists()


def test_worker_environment_holds_only_the_allowlist_and_never_the_token(
    monkeypatch: pytest.MonkeyPatch, start
) -> None:
    token = "c0ffee" * 11 + "00"
    monkeypatch.setattr(secrets, "token_hex", lambda _: token)
    monkeypatch.setenv("EDGE_TEST_PRIVATE", "controller-only")
    monkeypatch.setenv("PYTHONSTARTUP", "/nonexistent/startup.py")
    monkeypatch.setenv("EDGE_SPIN_US", "150")
    monkeypatch.setenv("VENDOR_SDK_ROOT", "/opt/vendor")
    monkeypatch.setenv("LC_TIME", "C")
    client = start("echo", pass_env=("VENDOR_*",), set_env={"BACKEND_SET": "1"})
    pid = client.identity.pid
    environ = _environ(pid)
    assert "EDGE_TEST_PRIVATE" not in environ and "PYTHONSTARTUP" not in environ
    assert environ["EDGE_SPIN_US"] == "150" and environ["LC_TIME"] == "C"
    assert environ["VENDOR_SDK_ROOT"] == "/opt/vendor" and environ["BACKEND_SET"] == "1"
    assert environ["PATH"] == os.environ["PATH"]
    assert str(WORKERS) in environ["PYTHONPATH"].split(os.pathsep)
    assert not any(token in value for value in environ.values())
    assert "EDGE_WORKER_BOOT" not in environ
    assert token.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
    assert client.ping()["pid"] == pid  # the worker did get its boot configuration


def test_route_env_is_set_as_given_and_refuses_pythonpath(start) -> None:
    route = Route.default("echo", "edge_test_workers:echo", python_path=(str(WORKERS),))
    routed = Route(route.name, route.interpreter, route.entry, python_path=route.python_path,
                   env={"ROUTE_ONLY": "yes"})
    client = start_worker(routed, generation=1)
    try:
        assert _environ(client.identity.pid)["ROUTE_ONLY"] == "yes"
        assert routed.to_dict()["env"] == ["ROUTE_ONLY"]  # names only in plans
    finally:
        assert client.retire().verified
    with pytest.raises(RouteRefused, match=r"route\.env\.PYTHONPATH"):
        Route(route.name, route.interpreter, route.entry, env={"PYTHONPATH": "/tmp"})
    with pytest.raises(RouteRefused, match=r"pass_env\[0\]"):
        start_worker(test_route("echo"), generation=1, pass_env=("BAD NAME",))


def test_environment_builder_builds_pythonpath_and_drops_the_rest() -> None:
    source = {"PATH": "/bin", "PYTHONPATH": "/ctl", "PYTHONHOME": "/x", "SECRET": "s",
              "LC_ALL": "C", "EDGE_COPY_THREADS": "2"}
    env = worker_environment(source, python_path=["/staged"], inherit_python_path=False)
    assert env == {"PATH": "/bin", "LC_ALL": "C", "EDGE_COPY_THREADS": "2",
                   "PYTHONPATH": "/staged", "ORT_DISABLE_TELEMETRY": "1"}
    same = worker_environment(source, python_path=["/a"], declared=("SECRET",))
    assert same["PYTHONPATH"] == os.pathsep.join(["/a", "/ctl"]) and same["SECRET"] == "s"


def test_a_users_data_collection_switches_reach_the_worker_as_given() -> None:
    source = {"PATH": "/bin", "ORT_DISABLE_TELEMETRY": "0", "DO_NOT_TRACK": "1",
              "ORT_OTHER": "x"}
    assert worker_environment(source) == {"PATH": "/bin", "ORT_DISABLE_TELEMETRY": "0",
                                          "DO_NOT_TRACK": "1"}


def test_onnx_runtimes_telemetry_is_off_where_the_user_sets_nothing() -> None:
    assert worker_environment({"PATH": "/bin"}) == {"PATH": "/bin",
                                                    "ORT_DISABLE_TELEMETRY": "1"}
    # the backend's values and the route's env still set what they set, last
    assert worker_environment({}, route_env={"ORT_DISABLE_TELEMETRY": "0"}) == {
        "ORT_DISABLE_TELEMETRY": "0"}
