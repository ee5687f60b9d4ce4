"""``edge serve`` as a real process on a free port, for the tests.

:func:`start` (or the block :func:`running`) starts ``edge serve --port 0 --json ...``
and waits for its ``listening on`` line; :meth:`Served.stop` (the block's end) sends
SIGTERM, waits for the exit, and checks that the server's whole process tree is gone, that
its closing summary says every worker was retired verified and the ledger is empty, and
that none of the shared-memory segments its processes had mapped is left. The summary is
kept on the :class:`Served`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

from edge_core.testing.leaks import leaks_since, snapshot

EDGE = str(Path(sys.executable).with_name("edge"))
SHM_PREFIX = "/dev/shm/edge_"
MEMFD_PREFIX = "/memfd:edge"
_LISTENING = re.compile(r"listening on (http://\S+)")


def _mapped_paths(pid: int) -> list[str]:
    """The paths of the files process ``pid`` has mapped, from ``/proc/PID/maps``.

    Not ``psutil``'s ``memory_maps``, which reads ``smaps``: the kernel then adds up each
    mapping's pages, which took 0.7 s for a vLLM server's tree on a loaded host (a test
    that signals its server records the tree first, and its worker may be paused).
    """
    with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as maps:
        return [fields[5] for fields in (line.rstrip("\n").split(maxsplit=5) for line in maps)
                if len(fields) == 6]


class Served:
    """A running server: its URL, its process, what it printed, and (after) its summary."""

    def __init__(self, process: subprocess.Popen[str], url: str, stderr: list[str]) -> None:
        self.process = process
        self.url = url
        self.stderr = stderr
        self.summary: dict[str, Any] = {}
        self.tree: set[tuple[int, float]] = set()
        self.segments: set[str] = set()
        self.memfds: set[str] = set()
        self.returncode: int | None = None
        self.before: Any = None
        self.readers: list[threading.Thread] = []
        self.stdout: list[str] = []
        self.stopped = False
        self.signalled = False

    def record_tree(self) -> set[tuple[int, float]]:
        """The server and every process below it (pid, creation time), and the edge
        shared-memory segments they have mapped."""
        root = psutil.Process(self.process.pid)
        processes = [root, *root.children(recursive=True)]
        found = set()
        for proc in processes:
            try:
                found.add((proc.pid, proc.create_time()))
                for path in _mapped_paths(proc.pid):
                    if path.startswith(SHM_PREFIX):
                        self.segments.add(path[len("/dev/shm/"):])
                    elif path.startswith(MEMFD_PREFIX):
                        # sealed memfd segments have no name in /dev/shm: they go with
                        # their last holder, so only their use is recorded
                        self.memfds.add(path.split()[0])
            except (psutil.NoSuchProcess, psutil.AccessDenied, OSError):
                continue
        self.tree |= found
        return found

    def producers(self) -> set[str]:
        """The producer prefixes (``edge_<id>_``) of the segments seen mapped."""
        return {name.rsplit("_", 1)[0] + "_" for name in self.segments}

    def send_signal(self, signum: signal.Signals = signal.SIGTERM) -> None:
        """Send the server a signal (recording its process tree first)."""
        if self.process.poll() is None:
            self.record_tree()
            self.process.send_signal(signum)
            self.signalled = True

    def stop(self, stop_signal: signal.Signals = signal.SIGTERM,
             stop_timeout_s: float = 90.0) -> None:
        """Stop the server (unless it stopped already) and check its shutdown (once).

        Its process tree must be gone, its closing summary must say that every worker was
        retired verified and the ledger is empty, and none of the shared-memory segments
        its processes had mapped may be left; the summary is kept in :attr:`summary`.
        """
        if self.stopped:
            return
        self.stopped = True
        if not self.signalled:
            self.send_signal(stop_signal)
        try:
            self.process.wait(timeout=stop_timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError("edge serve did not stop on SIGTERM:\n"
                                 + "".join(self.stderr[-40:])) from None
        for reader in self.readers:
            reader.join(10.0)
        self.returncode = self.process.returncode
        self.summary = _last_document("".join(self.stdout))
        deadline = time.monotonic() + 10.0
        while any(_alive(pid, created) for pid, created in self.tree):
            assert time.monotonic() < deadline, f"processes left: {self.tree}"
            time.sleep(0.05)
        leaks = leaks_since(self.before)
        # Other test runs on a shared machine create segments too: only this server's
        # count (those its processes had mapped, and any other of the same producers).
        ours = [name for name in leaks.segments
                if name in self.segments or name.startswith(tuple(self.producers()))]
        left = sorted(n for n in self.segments if Path("/dev/shm", n).exists())
        assert not leaks.children and not ours and not left, (leaks.describe(), ours, left)
        assert self.returncode == 0, "".join(self.stderr[-40:])
        assert self.summary["ok"] is True, self.summary
        assert self.summary["ledger_after_close"]["reservations"] == []
        for pipeline in self.summary["closed"].values():
            for stage in pipeline.values():
                assert stage["release"] == "released", stage
                assert stage["retire"]["verified"] is True, stage


def echo_pipeline(folder: Path, name: str, *, delay_s: float = 0.0, admission: int = 1,
                  file: str | None = None, head: str = "", stage: str = "",
                  options: str = "", backend: str = "echo") -> Path:
    """Write a one-stage echo pipeline (``y = x * 2`` after ``delay_s``); its path.

    ``head`` goes at the top level (``plugins = [...]``), ``stage`` into the stage's table
    (``restart = ...``), ``options`` into its backend options; ``backend`` is ``echo`` or
    ``echo-preemptible`` (cancelled in place).
    """
    path = folder / (file or f"{name}.toml")
    path.write_text(f'''
name = "{name}"
admission = {admission}
{head}

[[stages]]
id = "echo"
{stage}

[stages.backend]
name = "{backend}"

[stages.backend.options]
delay_s = {delay_s}
scale = 2.0
{options}
''')
    return path


def _last_document(out: str) -> dict[str, Any]:
    """The closing summary: the last JSON document on stdout.

    A worker's runtime may write its own log lines to the stdout it inherited (vLLM does),
    so the summary is found as the last top-level ``{`` line and what follows it.
    """
    lines = out.splitlines()
    starts = [index for index, line in enumerate(lines) if line == "{"]
    if not starts:
        return {}
    summary: dict[str, Any] = json.loads("\n".join(lines[starts[-1]:]))
    return summary


def _alive(pid: int, created: float) -> bool:
    try:
        proc = psutil.Process(pid)
        return proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def start(pipelines: Sequence[Path | str], *extra: str, env: dict[str, str] | None = None,
          start_timeout_s: float = 240.0,
          preexec: Callable[[], None] | None = None, verbose: bool = True) -> Served:
    """Start ``edge serve --port 0 --json`` on the pipelines; the server once it listens.

    Both of its outputs are read by threads of their own while it runs (a worker's
    runtime may log to the stdout it inherited: a full pipe would block it). ``preexec``
    runs in the child before ``edge`` does (to lower its open-file limit, say).
    ``verbose`` (``--verbose``, the default here): the workers' output on the server's
    stderr, kept in :attr:`Served.stderr` with the server's own lines (a failing test
    shows both), and no log folder left in the temporary folder.
    """
    before = snapshot()
    command = [EDGE, "serve", *map(str, pipelines), "--port", "0", "--json",
               *(["--verbose"] if verbose else []), *extra]
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True,
                               env={**os.environ, **(env or {})}, preexec_fn=preexec)
    assert process.stderr is not None and process.stdout is not None
    lines: list[str] = []
    out: list[str] = []
    found = threading.Event()
    url: list[str] = []

    def read_stderr() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.append(line)
            match = _LISTENING.search(line)
            if match and not url:
                url.append(match.group(1))
                found.set()
        found.set()

    def read_stdout() -> None:
        assert process.stdout is not None
        out.extend(process.stdout)

    readers = [threading.Thread(target=read_stderr, daemon=True),
               threading.Thread(target=read_stdout, daemon=True)]
    for reader in readers:
        reader.start()
    if not found.wait(start_timeout_s) or not url:
        process.kill()
        process.wait()
        raise AssertionError("edge serve did not start:\n" + "".join(lines[-40:]))
    served = Served(process, url[0], lines)
    served.before = before
    served.readers = readers
    served.stdout = out
    served.record_tree()
    return served


@contextmanager
def running(pipelines: Sequence[Path | str], *extra: str, env: dict[str, str] | None = None,
            start_timeout_s: float = 240.0, stop_timeout_s: float = 90.0,
            stop_signal: signal.Signals = signal.SIGTERM,
            preexec: Callable[[], None] | None = None,
            verbose: bool = True) -> Iterator[Served]:
    """Run ``edge serve`` on the pipelines until the block ends; check the shutdown."""
    served = start(pipelines, *extra, env=env, start_timeout_s=start_timeout_s,
                   preexec=preexec, verbose=verbose)
    try:
        yield served
    finally:
        served.stop(stop_signal, stop_timeout_s)
