"""``edge conformance``: the same checks from the command line, exit code per the verdict."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def edge(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edge_core.cli", *argv], capture_output=True,
                          text=True, timeout=300, check=False)


@pytest.mark.slow
def test_a_conforming_backend_exits_0_and_shows_skips_as_skipped() -> None:
    done = edge("conformance", "echo-preemptible")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "echo-preemptible  [echo]  available"
    assert any(line.startswith("  PASSED   cancel_running_call: cancelled in place")
               for line in lines)
    assert "  SKIPPED  tampered_manifest_refused: stage.manifest: the stage has no artifact " \
           "bundle: None" in lines
    assert lines[-1] == "13 passed, 0 failed, 1 skipped (skipped is not passed)"


def test_json_report_lists_each_check_with_its_status() -> None:
    done = edge("conformance", "echo", "--check", "contract_version", "--check",
                "hooks_have_specs", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is True
    assert report["summary"] == {"passed": 2, "failed": 0, "skipped": 0}
    (backend,) = report["backends"]
    assert backend["backend"] == "echo" and backend["available"] is True
    assert [c["check"] for c in backend["checks"]] == ["contract_version", "hooks_have_specs"]
    assert {c["status"] for c in backend["checks"]} == {"passed"}


def test_an_unavailable_backend_asked_for_by_name_is_all_skipped_and_exits_1() -> None:
    done = edge("conformance", "ort-directml", "--json")
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is False
    assert "ort-directml: requested backend unavailable" in report["error"]
    assert "no check passed" in report["error"]
    (backend,) = report["backends"]
    assert backend["available"] is False
    assert backend["counts"]["passed"] == 0 and backend["counts"]["failed"] == 0
    assert all(c["status"] == "skipped" and backend["reason"] in c["detail"]
               for c in backend["checks"])


def test_unknown_backend_and_unknown_check_exit_2_before_any_check_runs() -> None:
    missing = edge("conformance", "no-such-backend")
    assert missing.returncode == 2
    assert "no installed plugin provides this backend" in missing.stderr
    assert "'no-such-backend'" in missing.stderr and "Traceback" not in missing.stderr
    typo = edge("conformance", "ort-cpuu")
    assert typo.returncode == 2 and "did you mean 'ort-cpu'?" in typo.stderr
    bad = edge("conformance", "echo", "--check", "nope")
    assert bad.returncode == 2
    assert "--check: unknown check" in bad.stderr and "'nope'" in bad.stderr


def test_a_run_in_which_nothing_passed_is_never_ok() -> None:
    """Every check skipped, none failed: still exit 1, and the text says why."""
    done = edge("conformance", "ort-directml", "--check", "contract_version")
    assert done.returncode == 1
    assert "0 passed, 0 failed, 1 skipped (skipped is not passed)" in done.stdout
    assert "edge: no check passed (every check was skipped or failed)" in done.stderr


def _conformance(capfd: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``edge conformance ARGV`` in this process (its workers are this test's children, for
    the leak check); the exit code and what reached stdout and stderr, workers' included."""
    from edge_core.cli import main
    from edge_core.host.worker_logs import set_log_directory

    try:
        code = main(["conformance", *argv])
        out, err = capfd.readouterr()
    finally:
        set_log_directory(None)  # the command's log folder is not the next test's
    return code, out, err


def _logged(folder: Path) -> str:
    """Every worker log in ``folder``, then the folder removed."""
    try:
        return "".join(log.read_text() for log in sorted(folder.iterdir()))
    finally:
        shutil.rmtree(folder)


def test_a_workers_expected_refusal_goes_to_the_log_folder_not_the_terminal(
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``malformed_frame_to_worker`` passes; the worker's refusal is in the log folder.

    ``edge conformance`` let workers write to the terminal, unlike ``edge run`` and
    ``edge plan``: the expected refusal read like an error (``edge worker: channel:
    refused frame: ...``). The folder is named on stderr, or under ``--json`` as
    ``worker_logs``; ``--verbose`` shows the workers' output on stderr instead.
    """
    from edge_core.host.worker_logs import LOG_DIR_ENV

    monkeypatch.delenv(LOG_DIR_ENV, raising=False)
    refusal = "edge worker: channel: refused frame: prefix.header_len: must be <= "
    check = ("echo", "--check", "malformed_frame_to_worker")
    code, out, err = _conformance(capfd, *check)
    assert code == 0, out + err
    assert "  PASSED   malformed_frame_to_worker: " in out
    assert "refused frame" not in out + err
    (named,) = [x for x in err.splitlines() if x.startswith("edge: worker logs: ")]
    assert refusal in _logged(Path(named.removeprefix("edge: worker logs: ")))

    code, out, err = _conformance(capfd, *check, "--json")
    assert code == 0, out + err
    report = json.loads(out)
    assert report["ok"] is True and "refused frame" not in err
    assert refusal in _logged(Path(report["worker_logs"]))

    code, out, err = _conformance(capfd, *check, "--json", "--verbose")
    assert code == 0, out + err
    assert json.loads(out)["worker_logs"] is None
    assert refusal in err and "worker logs" not in err


def test_a_run_that_is_not_ok_names_the_log_folder_after_its_problems(
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """The folder is named last on stderr when the run is not ok, for the reader of the
    failure; ``EDGE_WORKER_LOG_DIR``'s folder is the one used."""
    from edge_core.host.worker_logs import LOG_DIR_ENV

    monkeypatch.setenv(LOG_DIR_ENV, str(tmp_path / "logs"))
    code, out, err = _conformance(capfd, "ort-directml", "--check", "contract_version")
    assert code == 1
    assert "0 passed, 0 failed, 1 skipped (skipped is not passed)" in out
    assert err.splitlines()[0] == f"edge: worker logs: {tmp_path / 'logs'}"
    assert err.splitlines()[-2:] == [
        "edge: no check passed (every check was skipped or failed)",
        f"edge: worker logs: {tmp_path / 'logs'}"]


def test_a_run_that_is_not_ok_keeps_the_fresh_folder_it_names(tmp_path: Path) -> None:
    """No worker started (the backend is unavailable): the fresh folder named after the
    problems, and as ``worker_logs`` under ``--json``, is still there once it exited.

    Before, it was removed at exit as silent (no log in it), and the line that names it
    for the reader of the failure pointed at nothing.
    """
    import os

    env = {k: v for k, v in os.environ.items() if k != "EDGE_WORKER_LOG_DIR"}
    env["TMPDIR"] = str(tmp_path)
    argv = [sys.executable, "-m", "edge_core.cli", "conformance", "ort-directml", "--check",
            "contract_version"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False,
                          env=env)
    assert done.returncode == 1, done.stderr
    last = done.stderr.splitlines()[-1]
    assert last.startswith("edge: worker logs: "), done.stderr
    folder = Path(last.removeprefix("edge: worker logs: "))
    assert folder.parent == tmp_path and folder.is_dir()
    as_json = subprocess.run([*argv, "--json"], capture_output=True, text=True, timeout=300,
                             check=False, env=env)
    assert as_json.returncode == 1, as_json.stderr
    report = json.loads(as_json.stdout)
    assert report["ok"] is False and Path(report["worker_logs"]).is_dir()
    assert sorted(tmp_path.iterdir()) == sorted([folder, Path(report["worker_logs"])])
