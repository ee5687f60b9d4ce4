"""Ctrl-C and SIGTERM from the first moment ``edge`` runs: 130 or 143 and one line, always.

The ``edge`` script is written here as an installer writes it, for the target
``core/pyproject.toml`` names, and run as a user runs it. A ``sitecustomize`` module put
first on its path (:data:`HOOK`) watches the process's audit events (every import, file
opened, code compiled or run): it notes which modules were imported before the process's
own handling of SIGINT and SIGTERM was in place, and sends the process the signal at the
Nth event after that, deterministically (no timing: wall-clock delays on a loaded machine
land anywhere, and in the interpreter's own start-up, which is Python's).

Before, the script imported the whole command line (argparse, the commands' shared code,
tens of milliseconds) before its ``main`` handled the signal: a Ctrl-C there printed a
``KeyboardInterrupt`` traceback, and a SIGTERM ended the process by the signal. So did
``python -m edge_core.cli`` (the command line as this suite and the docs run it) after
that was fixed for the script: ``runpy`` imported the package, which was the command
line, before its ``__main__`` ran; now the package imports nothing and ``__main__`` goes
through the script's own target.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import psutil
import pytest

from edge_contracts.shm import segment_names, segment_owner

from .conftest import echo_pipeline

CORE = Path(__file__).resolve().parents[2]

PIPELINE = echo_pipeline("numbers")

HOOK = '''
"""Sends this process a signal at its Nth audit event once edge handles signals."""
import atexit
import os
import sys

import _signal

# As started from a terminal: a process started in the background of a script (or under a
# runner started so) inherits SIGINT ignored, and Python then leaves it ignored.
if _signal.getsignal(_signal.SIGINT) is _signal.SIG_IGN:
    _signal.signal(_signal.SIGINT, _signal.default_int_handler)

AT = int(os.environ["EDGE_TEST_SIGNAL_AT"])  # -1: count the events, send nothing
SIGNUM = int(os.environ["EDGE_TEST_SIGNUM"])
MARKS = os.environ["EDGE_TEST_MARKS"]
ON_IMPORT = os.environ.get("EDGE_TEST_SIGNAL_ON_IMPORT")  # or: as this module imports
state = {"seen": 0, "handled": False, "done": False, "writing": False, "imports": []}


def mark(text):
    state["writing"] = True  # os.open is an audit event itself
    try:
        fd = os.open(MARKS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.write(fd, (text + "\\n").encode())
        os.close(fd)
    finally:
        state["writing"] = False


def hook(event, args):
    if state["done"] or state["writing"]:
        return
    if ON_IMPORT and event == "import" and args[0] == ON_IMPORT:  # handled or not
        state["done"] = True
        mark(f"sent on import {ON_IMPORT}")
        os.kill(os.getpid(), SIGNUM)
        return
    handler = _signal.getsignal(_signal.SIGINT)
    if handler is _signal.SIG_IGN:  # the command has ended: its exit code stands
        state["done"] = True
        mark(f"ended after {state['seen']}")
        return
    if not state["handled"]:
        if (handler is _signal.default_int_handler
                or _signal.getsignal(_signal.SIGTERM) == _signal.SIG_DFL):
            if event == "import":
                state["imports"].append(args[0])
            return
        state["handled"] = True
        mark("imported before " + " ".join(state["imports"]))
    if state["seen"] == AT:
        state["done"] = True
        mark(f"sent at {AT} ({event})")
        os.kill(os.getpid(), SIGNUM)
    state["seen"] += 1


def ended():  # registered first: runs last, the command and its exit hooks done
    if not state["done"]:
        state["done"] = True
        mark(f"ended after {state['seen']}")


sys.addaudithook(hook)
atexit.register(ended)
'''


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """The ``edge`` script as installed, the hook, a pipeline and its inputs."""
    target = tomllib.loads((CORE / "pyproject.toml").read_text("utf-8"))["project"]["scripts"]
    module, _, function = target["edge"].partition(":")
    script = tmp_path / "edge"
    script.write_text(  # what an installer writes (the one that made this venv's)
        f"#!{sys.executable}\nimport sys\nfrom {module} import {function}\n"
        "if __name__ == '__main__':\n"
        "    sys.argv[0] = sys.argv[0].removesuffix('.exe')\n"
        f"    sys.exit({function}())\n")
    script.chmod(0o755)
    (tmp_path / "hooks").mkdir()
    (tmp_path / "hooks" / "sitecustomize.py").write_text(HOOK)
    (tmp_path / "pipeline.toml").write_text(PIPELINE)
    return tmp_path


#: ``python -m edge_core.cli``: the command line started as a module, not as the script.
AS_MODULE = [sys.executable, "-m", "edge_core.cli"]


def edge_signalled(work: Path, argv: list[str], at: int, signum: int = signal.SIGINT,
                   command: list[str] | None = None, on_import: str | None = None,
                   ) -> tuple[subprocess.CompletedProcess[str], list[str], set[int]]:
    """Run ``edge ARGV``, the signal sent at audit event ``at``; result, marks, children.

    ``command``: how ``edge`` is started (default: the script); ``on_import``: send the
    signal as that module is imported instead, whether the signal is handled yet or not.
    """
    marks = work / "marks.txt"
    marks.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "EDGE_DEBUG"}
    env.update(EDGE_PLUGINS="echo", EDGE_TEST_SIGNAL_AT=str(at), EDGE_TEST_SIGNUM=str(signum),
               EDGE_TEST_MARKS=str(marks),
               PYTHONPATH=os.pathsep.join([str(work / "hooks"),
                                           *filter(None, [env.get("PYTHONPATH")])]))
    if on_import is not None:
        env["EDGE_TEST_SIGNAL_ON_IMPORT"] = on_import
    process = subprocess.Popen([*(command or [str(work / "edge")]), *argv], cwd=work, env=env,
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    seen: set[int] = set()
    while process.poll() is None:  # every descendant, to find any left running
        try:
            seen |= {c.pid for c in psutil.Process(process.pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            break
        time.sleep(0.005)
    out, err = process.communicate(timeout=120)
    done = subprocess.CompletedProcess(process.args, process.returncode, out, err)
    return done, marks.read_text().splitlines() if marks.exists() else [], seen


def assert_nothing_left(seen: set[int], pid: int) -> None:
    """No process the command started runs on; no segment it or they made is left."""
    deadline = time.monotonic() + 10
    alive = seen
    while alive and time.monotonic() < deadline:
        alive = {p for p in alive if psutil.pid_exists(p)
                 and psutil.Process(p).status() != psutil.STATUS_ZOMBIE}
        time.sleep(0.05)
    assert not alive, f"still running: {sorted(alive)}"
    owners = {pid, *seen}
    left = [name for name in segment_names()
            if (owner := segment_owner(name)) is not None and owner.pid in owners]
    assert not left, left


def points(count: int, first: int, spread: int) -> list[int]:
    """Where to send the signal among ``count`` events: the ``first`` ones, then spread.

    Spread over the first nine tenths: a run's count varies a little with its threads
    (``edge run``'s by well under one percent here), and a point past its end is none.
    """
    return sorted({*range(min(count, first)),
                   *(count * 9 * i // (10 * spread) for i in range(spread))})


def counted(work: Path, argv: list[str]) -> int:
    """How many audit events ``edge ARGV`` has once it handles signals, until it ends."""
    done, marks, _ = edge_signalled(work, argv, -1)
    assert done.returncode == 0, done.stderr
    (ended,) = [line for line in marks if line.startswith("ended after ")]
    return int(ended.removeprefix("ended after "))


def test_the_edge_script_handles_signals_before_it_imports_anything_but_its_target(
        work: Path) -> None:
    """Between the script's first import and the handling, nothing else is imported.

    Before, ``edge_core.cli`` and all it imports (argparse, enum, re, the commands' shared
    code) came first, under Python's own handling.
    """
    done, marks, _ = edge_signalled(work, ["plugins"], -1)
    assert done.returncode == 0, done.stderr
    (line,) = [mark for mark in marks if mark.startswith("imported before ")]
    imported = line.removeprefix("imported before ").split()
    ours = [name for name in imported if name.startswith("edge_core")]
    assert ours, imported
    # the script's import of its target (then its package, as the import system goes)
    assert imported[imported.index(ours[0]):] == ["edge_core.entry", "edge_core"], imported


def test_python_m_edge_core_cli_handles_signals_before_it_imports_the_command_line(
        work: Path) -> None:
    """After Python's own ``runpy``, only the two packages (which import nothing) and the
    script's target come before the handling.

    Before, ``runpy`` imported the package, then the whole command line (argparse, enum,
    re, json, the commands' shared code), under Python's own handling.
    """
    done, marks, _ = edge_signalled(work, ["plugins"], -1, command=AS_MODULE)
    assert done.returncode == 0, done.stderr
    (line,) = [mark for mark in marks if mark.startswith("imported before ")]
    imported = line.removeprefix("imported before ").split()
    ours = imported.index("edge_core")
    assert imported[ours:] == ["edge_core", "edge_core.cli", "edge_core.entry"], imported
    assert "argparse" not in imported and "runpy" in imported[:ours], imported


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("command", [None, AS_MODULE], ids=["edge", "python -m edge_core.cli"])
def test_a_signal_while_the_command_line_imports_exits_with_its_code_and_one_line(
        work: Path, signum: int, command: list[str] | None) -> None:
    """The signal comes as argparse is imported (the command line's first import).

    Before, under ``python -m edge_core.cli``, SIGINT there printed a ``KeyboardInterrupt``
    traceback (from ``runpy``) and SIGTERM ended the process by the signal (-15), with no
    line and no JSON document.
    """
    what = "terminated (SIGTERM)" if signum == signal.SIGTERM else "interrupted"
    done, marks, seen = edge_signalled(work, ["plugins", "--json"], -1, signum,
                                       command=command, on_import="argparse")
    assert "sent on import argparse" in marks, marks
    assert done.returncode == 128 + signum, (done.returncode, done.stderr)
    assert done.stderr == f"edge: {what}\n"
    assert json.loads(done.stdout) == {"ok": False, "error": what}
    assert not seen


@pytest.mark.parametrize(("argv", "signum", "first", "spread"), [
    (["plugins"], signal.SIGINT, 12, 16),
    (["plugins", "--json"], signal.SIGTERM, 12, 16),
    pytest.param(["run", "pipeline.toml", "--inputs", "x.npz", "--json"], signal.SIGINT, 0,
                 12, marks=pytest.mark.slow),
])
def test_a_signal_at_any_moment_of_a_command_exits_with_its_code_and_one_line(
        work: Path, argv: list[str], signum: int, first: int, spread: int) -> None:
    """From the handling's first moment to the command's end: never a traceback.

    Each of the first events after the handling is in place (the command line's own
    imports), then events spread over the whole command (its command module, the plugins,
    the pipeline's workers and their retirement for ``edge run``).
    """
    import numpy as np

    np.savez(work / "x.npz", x=np.arange(8, dtype=np.float32))
    what = "terminated (SIGTERM)" if signum == signal.SIGTERM else "interrupted"
    for at in points(counted(work, argv), first, spread):
        done, marks, seen = edge_signalled(work, argv, at, signum)
        where = (at, marks, done.stderr)
        assert any(mark.startswith(f"sent at {at} ") for mark in marks), where
        assert done.returncode == 128 + signum, where
        assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, where
        lines = done.stderr.splitlines()
        assert lines[-1] == f"edge: {what}", where
        assert all(line.startswith("edge: still retiring") for line in lines[:-1]), where
        if "--json" in argv:
            assert json.loads(done.stdout) == {"ok": False, "error": what}, where
        assert_nothing_left(seen, 0)
