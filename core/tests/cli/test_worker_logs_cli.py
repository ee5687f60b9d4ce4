"""``edge profile`` and ``edge plan`` keep their workers' output off the terminal.

The pipeline's one stage runs real echo workers on a route of their own whose Python
path holds a ``sitecustomize`` module (it speaks on both streams as any worker process of
the route starts: the stage's, and the bare ones ``edge profile`` times) and whose entry
speaks again as it loads, with a Python warning, as a runtime does. ``edge run`` and
``edge plan`` wrote that to a log folder; ``edge profile`` let it reach the terminal,
between its own lines (and on the stderr a script reads beside ``--json``). Now it goes
to the folder too, named on stderr and as ``worker_logs`` under ``--json`` (``edge plan``
named it on stderr only), and ``--verbose`` shows it instead. The folder is kept at exit
because its logs are not empty (one whose logs all stayed empty is removed). The
command's workers are all gone afterwards, and no shared-memory segment of theirs is left.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from edge_contracts.shm import segment_names, segment_owner

from .conftest import echo_pipeline

SITECUSTOMIZE = """
import sys
print("NOISY-START out", flush=True)
print("NOISY-START err", file=sys.stderr, flush=True)
"""

NOISY_WORKER = """
import sys
import warnings


def create():
    print("NOISY-LOAD out", flush=True)
    print("NOISY-LOAD err", file=sys.stderr, flush=True)
    warnings.warn("NOISY-LOAD warning")
    from edge_echo.worker import create as echo
    return echo()
"""

PIPELINE = echo_pipeline("noisy", after="""{options}
[stages.backend.route]
name = "noisy"
interpreter = "{python}"
entry = "noisy_worker:create"
python_path = ["{folder}"]
""")

PROFILE = ["profile", "pipeline.toml", "--inputs", "x.npz", "--requests", "1", "--warmup",
           "0", "--concurrency", "1", "--process-starts", "1", "--startup-samples", "0",
           "--matched-requests", "1", "--no-warm-restart", "--out", "p.json"]


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """The noisy route's folder, the pipeline on it, an input, a temporary folder."""
    import numpy as np

    noisy = tmp_path / "noisy"
    noisy.mkdir()
    (noisy / "sitecustomize.py").write_text(SITECUSTOMIZE)
    (noisy / "noisy_worker.py").write_text(NOISY_WORKER)
    for name, options in (("pipeline.toml", ""), ("failing.toml", 'fail_at = "call"')):
        (tmp_path / name).write_text(PIPELINE.format(python=sys.executable, folder=noisy,
                                                     options=options))
    np.savez(tmp_path / "x.npz", x=np.arange(4, dtype=np.float32).reshape(2, 2))
    (tmp_path / "tmp").mkdir()  # where a fresh log folder is made: not /tmp
    return tmp_path


def edge(work: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """``edge ARGV`` as a user runs it; then no process it started runs, no segment is left.

    Every descendant is noted while it runs; the log folder is a fresh one (no
    ``EDGE_WORKER_LOG_DIR``), made in the test's own temporary folder.
    """
    env = {k: v for k, v in os.environ.items() if k not in {"EDGE_DEBUG",
                                                            "EDGE_WORKER_LOG_DIR"}}
    env.update(EDGE_PLUGINS="echo", TMPDIR=str(work / "tmp"))
    process = subprocess.Popen([sys.executable, "-m", "edge_core.cli", *argv], cwd=work,
                               env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    seen: set[int] = set()
    while process.poll() is None:
        try:
            seen |= {c.pid for c in psutil.Process(process.pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            break
        time.sleep(0.005)
    out, err = process.communicate(timeout=300)
    deadline = time.monotonic() + 10
    alive = seen
    while alive and time.monotonic() < deadline:
        alive = {p for p in alive if psutil.pid_exists(p)
                 and psutil.Process(p).status() != psutil.STATUS_ZOMBIE}
        time.sleep(0.05)
    assert not alive, f"still running: {sorted(alive)}"
    owners = {process.pid, *seen}
    assert not [n for n in segment_names()
                if (owner := segment_owner(n)) is not None and owner.pid in owners]
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def named_folder(err: str) -> Path:
    """The one log folder the command named on stderr."""
    (line,) = {x for x in err.splitlines() if x.startswith("edge: worker logs: ")}
    return Path(line.removeprefix("edge: worker logs: "))


def logged(folder: Path) -> str:
    """Everything the workers wrote to their log files in ``folder``."""
    return "".join(log.read_text() for log in sorted(folder.iterdir()))


def test_edge_profile_logs_its_workers_output_to_the_folder_it_names(work: Path) -> None:
    traced = [*PROFILE]  # a traced run, in which the bare worker starts are timed
    traced[traced.index("--startup-samples") + 1] = "1"
    done = edge(work, *traced)
    assert done.returncode == 0, done.stderr
    assert "NOISY" not in done.stdout + done.stderr
    folder = named_folder(done.stderr)
    assert folder.parent == work / "tmp"
    text = logged(folder)
    for said in ("NOISY-START out", "NOISY-START err", "NOISY-LOAD out", "NOISY-LOAD err",
                 "UserWarning: NOISY-LOAD warning"):
        assert said in text, (said, text)
    assert (folder / "a.process-start.g1.log").is_file()  # the bare worker timed
    profile = json.loads((work / "p.json").read_text())
    assert Path(profile["plan"]["stages"][0]["worker"]["log"]).parent == folder


def test_edge_profile_json_names_the_folder_and_verbose_shows_the_output(
        work: Path) -> None:
    done = edge(work, *PROFILE, "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert "NOISY" not in done.stderr
    assert "NOISY-LOAD err" in logged(Path(report["worker_logs"]))
    shown = edge(work, *PROFILE, "--json", "--verbose")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["worker_logs"] is None  # stdout: the document alone
    assert "NOISY-LOAD out" in shown.stderr and "NOISY-START err" in shown.stderr
    assert "worker logs" not in shown.stderr


def test_a_failed_profile_names_the_log_folder_again_after_its_summary(work: Path) -> None:
    done = edge(work, *PROFILE[:1], "failing.toml", *PROFILE[2:])
    assert done.returncode == 1, done.stderr
    assert "FAILED at" in done.stdout
    folder = named_folder(done.stderr)
    assert done.stderr.splitlines()[-1] == f"edge: worker logs: {folder}"
    assert "NOISY-LOAD err" in logged(folder)
    assert "NOISY" not in done.stdout + done.stderr


def test_edge_plan_json_names_the_folder_its_workers_logged_to(work: Path) -> None:
    done = edge(work, "plan", "pipeline.toml", "--json")
    assert done.returncode == 0, done.stderr
    assert "NOISY" not in done.stdout + done.stderr
    answer = json.loads(done.stdout)
    assert "NOISY-LOAD err" in logged(Path(answer["worker_logs"]))
    probed = edge(work, "plan", "pipeline.toml", "--probe-only", "--json")
    assert probed.returncode == 0, probed.stderr
    assert json.loads(probed.stdout)["worker_logs"] is None  # no worker, no folder
    assert list((work / "tmp").iterdir()) == [Path(answer["worker_logs"])]
    quiet = (work / "pipeline.toml").read_text().split("[stages.backend.route]")[0]
    (work / "quiet.toml").write_text(quiet)  # the echo worker on the default route
    said = edge(work, "plan", "quiet.toml", "--json")
    assert said.returncode == 0, said.stderr
    assert Path(json.loads(said.stdout)["worker_logs"]).parent == work / "tmp"
    # its one log stayed empty: removed at exit with its folder; the noisy one is kept
    assert list((work / "tmp").iterdir()) == [Path(answer["worker_logs"])]


def test_a_failed_profile_keeps_the_folder_it_names_though_its_workers_wrote_nothing(
        work: Path) -> None:
    # the echo worker on the default route says nothing, and its call fails: the folder
    # named after the summary (and under --json) was removed at exit with its empty
    # logs, so the line pointed at nothing; now a command that failed keeps it
    quiet = (work / "failing.toml").read_text().split("[stages.backend.route]")[0]
    (work / "quiet-failing.toml").write_text(quiet)
    done = edge(work, *PROFILE[:1], "quiet-failing.toml", *PROFILE[2:])
    assert done.returncode == 1, done.stderr
    folder = named_folder(done.stderr)
    assert done.stderr.splitlines()[-1] == f"edge: worker logs: {folder}"
    assert folder.is_dir() and list(folder.iterdir()), folder  # the logs are there,
    assert logged(folder) == ""  # all empty: the workers wrote nothing
    as_json = edge(work, *PROFILE[:1], "quiet-failing.toml", *PROFILE[2:], "--json")
    assert as_json.returncode == 1, as_json.stderr
    report = json.loads(as_json.stdout)
    assert report["ok"] is False and Path(report["worker_logs"]).is_dir()
    # a run that succeeds with silent workers still leaves nothing behind
    (work / "quiet.toml").write_text(
        (work / "pipeline.toml").read_text().split("[stages.backend.route]")[0])
    fine = edge(work, *PROFILE[:1], "quiet.toml", *PROFILE[2:], "--json")
    assert fine.returncode == 0, fine.stderr
    assert not Path(json.loads(fine.stdout)["worker_logs"]).exists()
    assert sorted((work / "tmp").iterdir()) == sorted([folder, Path(report["worker_logs"])])


EXITING = """
import atexit
import sys

atexit.register(lambda: print("EXITING-WORKER said so as it ended", file=sys.stderr,
                              flush=True))
"""

UNCLOSED = """
import sys
from pathlib import Path

from edge_core.cli import common
from edge_core.config import load_pipeline
from edge_core.plugins import load_plugins
from edge_core.runtime import Pipeline
from edge_core.runtime.pipeline_files import default_ledger

plugins = load_plugins()


def opened(name):
    config = load_pipeline(Path(name))
    return Pipeline.open(config, plugins, default_ledger(config, plugins))


# a worker started (and closed) first: the workers' exit hook is registered now, before
# the folder's below, as in a process that ran a pipeline before a command's folder
opened("quiet.toml").close()
folder = common.worker_logs(False)  # a fresh folder for what starts next, removed if silent
pipeline = opened("exiting.toml")
print(folder)  # and exit with the pipeline open: its worker is retired at exit
"""


def test_a_worker_still_running_at_exit_writes_its_last_words_into_a_folder_kept(
        work: Path) -> None:
    # a worker left running at exit (a pipeline never closed) is retired by the exit
    # hook, and writes as it ends: where the folder's removal ran first (its hook came
    # after the workers' one: this process had started a worker before the folder was
    # made), the folder was judged silent and removed with the worker still running, and
    # what it wrote then was lost with the unlinked log. Now the workers are retired
    # before the folder is judged.
    exiting = work / "exiting"
    exiting.mkdir()
    (exiting / "sitecustomize.py").write_text(EXITING)
    (exiting / "noisy_worker.py").write_text("from edge_echo.worker import create\n")
    route = (work / "pipeline.toml").read_text().replace(str(work / "noisy"), str(exiting))
    (work / "exiting.toml").write_text(route)
    (work / "quiet.toml").write_text(
        (work / "pipeline.toml").read_text().split("[stages.backend.route]")[0])
    (work / "unclosed.py").write_text(UNCLOSED)
    env = {k: v for k, v in os.environ.items() if k not in {"EDGE_DEBUG",
                                                            "EDGE_WORKER_LOG_DIR"}}
    env.update(EDGE_PLUGINS="echo", TMPDIR=str(work / "tmp"))
    done = subprocess.run([sys.executable, "unclosed.py"], cwd=work, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    folder = Path(done.stdout.splitlines()[-1])
    assert folder.parent == work / "tmp"
    assert "EXITING-WORKER said so as it ended" in logged(folder)
    assert "EXITING-WORKER" not in done.stdout + done.stderr
