"""``edge hub`` against a loopback server speaking AI Hub's protobuf API.

The ``edge`` command runs in a real child process with the real ``qai-hub`` client; only
the service is local. Nothing here contacts the real service.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import make_bundle
from .hub_server import DEVICES, TOKEN, HubServer

DEVICE = DEVICES[0][0]


@pytest.fixture
def server() -> Iterator[HubServer]:
    with HubServer() as running:
        yield running


def write_ini(path: Path, server: HubServer, token: str = TOKEN) -> Path:
    path.write_text(f"[api]\napi_token = {token}\napi_url = {server.base}\n"
                    f"web_url = {server.base}\nverbose = false\n", encoding="utf-8")
    return path


def edge_hub(args: list[str], ini: Path | None, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "QAIHUB_CLIENT_INI"}
    env["EDGE_PLUGINS"] = "qnn"
    if ini is not None:
        env["QAIHUB_CLIENT_INI"] = str(ini)
    return subprocess.run([sys.executable, "-m", "edge_core.cli", "hub", *args,
                           "--poll", "0.05", "--json"],
                          capture_output=True, text=True, env=env, cwd=cwd, timeout=180,
                          check=False)


def answer(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def test_devices_come_from_the_service_named_by_the_client_ini(
    server: HubServer, tmp_path: Path
) -> None:
    result = edge_hub(["devices"], write_ini(tmp_path / "client.ini", server), tmp_path)
    assert result.returncode == 0, result.stderr
    names = [d["name"] for d in answer(result)["devices"]]
    assert names == [d[0] for d in DEVICES]
    assert any(r.startswith("GET /api/v1/devices") for r in server.state.requests)


def test_a_rejected_token_is_a_typed_error_without_retries(
    server: HubServer, tmp_path: Path
) -> None:
    result = edge_hub(["devices"], write_ini(tmp_path / "client.ini", server, "wrong"),
                      tmp_path)
    assert result.returncode == 1
    error = answer(result)["error"]
    assert error.startswith("hub.devices: UserError: Failed to authenticate")
    assert server.base in error
    assert len(server.state.requests) == 1


def test_no_client_configuration_is_a_typed_error(tmp_path: Path) -> None:
    missing = tmp_path / "absent.ini"
    result = edge_hub(["devices"], missing, tmp_path)
    assert result.returncode == 1
    assert answer(result)["error"].startswith("hub.config: no AI Hub client configuration")
    assert str(missing) in answer(result)["error"]


def test_retries_are_bounded_and_each_one_is_reported(
    server: HubServer, tmp_path: Path
) -> None:
    server.state.unavailable = 100
    result = edge_hub(["devices", "--retries", "1"], write_ini(tmp_path / "c.ini", server),
                      tmp_path)
    assert result.returncode == 1
    assert "hub: retrying" in result.stderr
    assert "hub.devices" in answer(result)["error"]
    assert len(server.state.requests) <= 4


def test_a_failed_compile_job_names_the_job_and_leaves_a_failed_record(
    server: HubServer, tmp_path: Path
) -> None:
    bundle = make_bundle(tmp_path / "bundle")
    server.state.fail_compile = "Compilation failed: op Conv unsupported"
    result = edge_hub(["compile", str(bundle), "--device", DEVICE, "--record-dir",
                       str(tmp_path / "records")], write_ini(tmp_path / "c.ini", server),
                      tmp_path)
    assert result.returncode == 1
    body = answer(result)
    job_id = body["job_id"]
    assert job_id and job_id in body["error"]
    assert body["error"].startswith("hub.compile: job failed: 'Compilation failed")
    assert f"compile job {job_id}: FAILED" in result.stderr
    record = json.loads(Path(body["record"]).read_text(encoding="utf-8"))
    assert record["status"] == "failed"
    assert record["label"] == "PROFILE_ONLY"
    assert record["jobs"] == {"compile": job_id}
    assert record["not_local_deployment"] is True


def test_profile_records_delegation_but_no_execution_evidence(
    server: HubServer, tmp_path: Path
) -> None:
    bundle = make_bundle(tmp_path / "bundle")
    result = edge_hub(["profile", str(bundle), "--device", DEVICE, "--record-dir",
                       str(tmp_path)], write_ini(tmp_path / "c.ini", server), tmp_path)
    assert result.returncode == 0, result.stderr
    record = answer(result)
    assert record["label"] == "PROFILE_ONLY"
    assert set(record["jobs"]) == {"compile", "profile"}
    assert record["delegation"]["all_on_npu"] is True
    assert [layer["compute_unit"] for layer in record["layers"]] == ["NPU", "NPU"]
    assert record["execution"] == {"evidence": "none", "comparison": None}
    assert record["estimated_inference_time_us"] == 1234


def test_compile_profile_infer_compares_hosted_outputs_with_the_local_reference(
    server: HubServer, tmp_path: Path
) -> None:
    bundle = make_bundle(tmp_path / "bundle")
    result = edge_hub(["infer", str(bundle), "--device", DEVICE, "--record-dir",
                       str(tmp_path / "records")], write_ini(tmp_path / "c.ini", server),
                      tmp_path)
    assert result.returncode == 0, result.stderr
    record = answer(result)
    assert record["label"] == "COMPONENT" and record["status"] == "passed"
    assert record["device"]["name"] == DEVICE
    assert set(record["jobs"]) == {"compile", "inference"}
    assert [layer["type"] for layer in record["layers"]] == ["Conv", "Relu"]
    assert record["peak_memory_bytes"] == 5 << 20
    comparison = record["execution"]["comparison"]
    assert comparison["reference"] == "expected-outputs"
    assert comparison["passed"] is True
    assert "not evidence of deployment" in record["note"]
    saved = json.loads(Path(record["record"]).read_text(encoding="utf-8"))
    assert saved["jobs"] == record["jobs"]
    requests = server.state.requests
    assert any(r.startswith("PUT /blob/model/") for r in requests)
    assert any(r.startswith("POST /blob/dataset/") for r in requests)
    assert f"inference job {record['jobs']['inference']}" not in result.stderr
    assert f"infer job {record['jobs']['inference']}: SUCCESS" in result.stderr


def test_an_unreachable_service_is_a_typed_error_after_bounded_retries(tmp_path: Path) -> None:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ini = tmp_path / "c.ini"
    ini.write_text(f"[api]\napi_token = {TOKEN}\napi_url = http://127.0.0.1:{port}\n"
                   f"web_url = http://127.0.0.1:{port}\n", encoding="utf-8")
    result = edge_hub(["devices", "--retries", "1"], ini, tmp_path)
    assert result.returncode == 1
    error = answer(result)["error"]
    assert error.startswith("hub.devices: ")
    assert f"http://127.0.0.1:{port}" in error
    assert "hub: retrying" in result.stderr
