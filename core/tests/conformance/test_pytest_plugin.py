"""The pytest plugin: inert in unrelated projects; when asked, one item per backend x check."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

UNRELATED_TEST = '''
import sys

def test_plain():
    assert 1 + 1 == 2

def test_kit_not_loaded():
    assert "edge_core.testing.runner" not in sys.modules
    assert "edge_core.plugins" not in sys.modules
'''


def run_pytest(directory: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *argv],
        cwd=directory, capture_output=True, text=True, timeout=300, check=False,
    )


def test_an_unrelated_project_is_unaffected(tmp_path: Path) -> None:
    (tmp_path / "test_unrelated.py").write_text(UNRELATED_TEST, encoding="utf-8")
    with_plugin = run_pytest(tmp_path, "--trace-config")
    assert "edge_core.testing.plugin" in with_plugin.stdout  # loaded through pytest11
    assert with_plugin.returncode == 0, with_plugin.stdout
    assert "2 passed" in with_plugin.stdout and "conformance[" not in with_plugin.stdout
    without = run_pytest(tmp_path, "-p", "no:edge")
    assert without.returncode == 0 and "2 passed" in without.stdout


def test_options_are_listed_in_help(tmp_path: Path) -> None:
    done = run_pytest(tmp_path, "--help")
    for option in ("--edge-backend=NAME", "--edge-conformance", "--edge-report=PATH"):
        assert option in done.stdout


@pytest.mark.slow
def test_a_backend_run_writes_the_json_report_and_skips_are_skips(tmp_path: Path) -> None:
    report_path = tmp_path / "report.json"
    done = run_pytest(tmp_path, "--edge-backend", "echo-preemptible", "--edge-report",
                      str(report_path), "-rs")
    assert done.returncode == 0, done.stdout[-3000:]
    assert "13 passed, 1 skipped" in done.stdout
    assert "SKIPPED [1]" in done.stdout and "the stage has no artifact bundle" in done.stdout
    report = json.loads(report_path.read_text(encoding="utf-8"))
    assert report["summary"] == {"passed": 13, "failed": 0, "skipped": 1}
    (backend,) = report["backends"]
    assert backend["backend"] == "echo-preemptible" and len(backend["checks"]) == 14


def test_markers_select_a_backend_and_a_check(tmp_path: Path) -> None:
    done = run_pytest(tmp_path, "--edge-conformance", "-m", "edge_echo and edge_conformance",
                      "-k", "contract_version or hooks_have_specs", "-vv")
    assert done.returncode == 0, done.stdout[-3000:]
    assert "conformance[echo-contract_version] PASSED" in done.stdout
    assert "conformance[echo-hooks_have_specs] PASSED" in done.stdout
    assert "echo-preemptible" not in done.stdout.replace("deselected", "")
    assert "2 passed" in done.stdout


def test_unavailable_backends_are_reported_as_skipped(tmp_path: Path) -> None:
    done = run_pytest(tmp_path, "--edge-backend", "ort-vitisai", "-rs")
    assert done.returncode == 0, done.stdout[-3000:]
    assert "14 skipped" in done.stdout and "passed" not in done.stdout
    assert "backend unavailable here" in done.stdout


def test_an_unknown_backend_is_a_usage_error(tmp_path: Path) -> None:
    done = run_pytest(tmp_path, "--edge-backend", "no-such-backend")
    assert done.returncode == 4
    assert "--edge-backend: no installed plugin provides it" in done.stderr


WATCHER = '''
import pytest

@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item):
    kit = getattr(item, "kit", None)
    if kit is not None:
        held = kit.subjects[item.backend].share.held
        print(f"SHARE {item.check} {'open' if held is not None else 'closed'}")
'''


def test_selected_items_share_the_pipeline_only_with_the_next_selected_shared_check(
    tmp_path: Path,
) -> None:
    (tmp_path / "conftest.py").write_text(WATCHER, encoding="utf-8")
    done = run_pytest(tmp_path, "--edge-backend", "echo-preemptible", "-s", "-k",
                      "placement or calls or cancel_finished or retire_verified")
    assert done.returncode == 0, done.stdout[-3000:]
    shares = [line[line.index("SHARE "):] for line in done.stdout.splitlines()
              if "SHARE " in line]
    # stale_ack_frees_nothing is deselected: calls shares with cancel_finished_call; the
    # next selected after that is retire_verified, which opens its own.
    assert shares == ["SHARE warmup_placement_consistent open",
                      "SHARE calls_match_expected open",
                      "SHARE cancel_finished_call closed",
                      "SHARE retire_verified closed"], done.stdout[-3000:]
