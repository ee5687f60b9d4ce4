import json
import subprocess
import sys
from pathlib import Path

import pytest

from edge_contracts.conformance import apply_overrides, load_fixtures, run

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "src/edge_contracts/conformance/v1.json"


def test_every_fixture_case_passes() -> None:
    results = run()
    failures = [r for r in results if not r.passed]
    assert not failures, failures
    assert len(results) > 150


def test_fixture_file_is_what_the_generator_writes() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools/make_fixtures.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_fixtures_cover_every_type_and_the_issue_cases() -> None:
    document = load_fixtures()
    assert set(document["types"]) == {
        "BufferDescriptor",
        "StageRequest",
        "StageEvent",
        "ErrorInfo",
        "StateHandle",
        "DeviceDescriptor",
        "ArtifactMetadata",
        "ArtifactManifest",
        "ShmRef",
        "TensorSpec",
        "FrameHeader",
        "Limits",
    }
    buffer_cases = {case["name"] for case in document["types"]["BufferDescriptor"]["invalid"]}
    assert {
        "nbytes off by one",
        "negative dimension",
        "33 dimensions",
        "unknown dtype",
        "unknown memory domain",
    } <= buffer_cases
    frame_errors = {case["name"]: case["error"] for case in document["frames"]["invalid"]}
    assert frame_errors["truncated header"] == "FrameTruncated"
    assert frame_errors["header length over cap"] == "HeaderTooLarge"
    assert frame_errors["header is not JSON"] == "HeaderMalformed"
    assert frame_errors["unknown required feature"] == "UnknownRequiredFeature"
    assert frame_errors["nbytes mismatch"] == "DescriptorInvalid"
    assert frame_errors["payload over limit in the prefix"] == "PayloadTooLarge"
    assert frame_errors["truncated payload"] == "FrameTruncated"
    assert len(document["state"]["stale"]) >= 7
    assert all(case["max_alloc_bytes"] > 0 for case in document["frames"]["invalid"])


def broken_copy(tmp_path: Path, change: str) -> Path:
    document = json.loads(FIXTURES.read_text(encoding="utf-8"))
    if change == "wrong error class":
        document["frames"]["invalid"][0]["error"] = "PayloadTooLarge"
    elif change == "valid object that is invalid":
        document["types"]["BufferDescriptor"]["valid"][1]["nbytes"] += 1
    elif change == "stale state that matches":
        document["state"]["stale"][0]["set"] = {}
    elif change == "wrong field":
        document["types"]["StageRequest"]["invalid"][0]["field"] = "request.elsewhere"
    elif change == "tight allocation bound":
        document["frames"]["invalid"][0]["max_alloc_bytes"] = 1
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "change",
    [
        "wrong error class",
        "valid object that is invalid",
        "stale state that matches",
        "wrong field",
        "tight allocation bound",
    ],
)
def test_runner_reports_a_case_the_implementation_does_not_meet(
    tmp_path: Path, change: str
) -> None:
    results = run(broken_copy(tmp_path, change))
    assert [r.passed for r in results].count(False) == 1


def test_command_line_exits_non_zero_and_reports_json_on_failure(tmp_path: Path) -> None:
    path = broken_copy(tmp_path, "wrong error class")
    result = subprocess.run(
        [sys.executable, "-m", "edge_contracts.conformance", "--json", "--fixtures", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["failed"] == 1
    assert report["passed"] == len(report["cases"]) - 1


def test_command_line_exits_zero_on_the_packaged_fixtures() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "edge_contracts.conformance"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout
    assert result.stdout.strip().endswith("0 failed")


def test_overrides_follow_json_pointer_escaping() -> None:
    base = {"files": {"a/b": 1}, "list": [1, 2], "t~x": 0}
    changed = apply_overrides(base, {"/files/a~1b": 2, "/list/1": 3, "/t~0x": 4}, ["/list/0"])
    assert changed == {"files": {"a/b": 2}, "list": [3], "t~x": 4}
    assert base["files"] == {"a/b": 1}
