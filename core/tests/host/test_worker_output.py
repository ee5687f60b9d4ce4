"""A worker's stdout and stderr never reach the controller's stdout.

Real worker processes whose factory prints to both streams: by default both go to the
controller's stderr; with a log directory both go to a per-worker log file, named in the
stage's description.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

NOISY = textwrap.dedent('''
    import sys

    def create():
        print("NOISY-OUT", flush=True)
        print("NOISY-ERR", file=sys.stderr, flush=True)
        from edge_echo.worker import create as echo
        return echo()
''')

CONTROLLER = textwrap.dedent('''
    import json, sys
    from pathlib import Path
    from edge_core.host.bootstrap import start_worker
    from edge_core.host.routes import Route
    from edge_core.host.worker_logs import open_worker_output, set_log_directory

    if len(sys.argv) > 1:
        set_log_directory(Path(sys.argv[1]))
    output = open_worker_output("stage/a", 3)
    try:
        client = start_worker(Route.default("echo", "noisy_worker:create"), generation=3,
                              stdout=output.stdout, stderr=output.stderr)
    finally:
        output.close()
    client.load({})
    outcome = client.retire()
    print(json.dumps({"log": str(output.path) if output.path else None,
                      "verified": outcome.verified}))
''')


def _controller(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "noisy_worker.py").write_text(NOISY)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    env.pop("EDGE_WORKER_LOG_DIR", None)
    return subprocess.run([sys.executable, "-c", CONTROLLER, *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_worker_output_goes_to_stderr_not_stdout(tmp_path: Path) -> None:
    result = _controller(tmp_path)
    assert result.returncode == 0, result.stderr
    (line,) = result.stdout.splitlines()  # only the controller's own document
    assert json.loads(line) == {"log": None, "verified": True}
    assert "NOISY-OUT" in result.stderr and "NOISY-ERR" in result.stderr


def test_with_a_log_directory_worker_output_goes_to_its_log_file(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    result = _controller(tmp_path, str(logs))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["log"] == str(logs / "stage_a.g3.log")
    text = Path(report["log"]).read_text()
    assert "NOISY-OUT" in text and "NOISY-ERR" in text
    assert "NOISY" not in result.stderr and "NOISY" not in result.stdout


def test_a_log_folder_goes_only_when_every_log_this_process_opened_stayed_empty(
        tmp_path: Path) -> None:
    from edge_core.host.worker_logs import open_worker_output, remove_if_silent, set_log_directory

    folder = tmp_path / "logs"
    set_log_directory(folder)
    try:
        for stage in ("a", "b"):
            open_worker_output(stage, 1).close()
    finally:
        set_log_directory(None)
    names = ["a.g1.log", "b.g1.log"]
    (folder / "c.g1.log").touch()  # empty, but not a log this process opened
    assert remove_if_silent(folder) is False
    assert sorted(p.name for p in folder.iterdir()) == [*names, "c.g1.log"]
    (folder / "c.g1.log").unlink()
    (folder / "a.g1.log").write_text("said something\n")  # a worker spoke
    assert remove_if_silent(folder) is False
    assert sorted(p.name for p in folder.iterdir()) == names  # the empty b.g1.log too
    (folder / "a.g1.log").write_bytes(b"")
    (folder / "b.g1.log").unlink()
    (tmp_path / "elsewhere").touch()
    (folder / "b.g1.log").symlink_to(tmp_path / "elsewhere")  # a link is not its log
    assert remove_if_silent(folder) is False
    assert sorted(p.name for p in folder.iterdir()) == names
    (folder / "b.g1.log").unlink()
    (folder / "b.g1.log").touch()
    assert remove_if_silent(folder) is True
    assert not folder.exists() and (tmp_path / "elsewhere").exists()
    assert remove_if_silent(folder) is True  # gone already
