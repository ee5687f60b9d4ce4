"""``edge serve`` as a real process on a free port, for the tests.

:func:`running` starts ``edge serve --port 0 --json ...``, waits for its ``listening on``
line, and on exit sends SIGTERM, waits for the exit, and checks that the server's whole
process tree is gone and that its closing summary says every worker was retired verified
and the ledger is empty, and that none of its processes and none of the shared-memory
segments they had mapped is left. The
summary is handed back through :class:`Served`.
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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

from edge_core.testing.leaks import leaks_since, snapshot

EDGE = str(Path(sys.executable).with_name("edge"))
SHM_PREFIX = "/dev/shm/edge_"
MEMFD_PREFIX = "/memfd:edge"
_LISTENING = re.compile(r"listening on (http://\S+)")


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

    def record_tree(self) -> set[tuple[int, float]]:
        """The server and every process below it (pid, creation time), and the edge
        shared-memory segments they have mapped."""
        root = psutil.Process(self.process.pid)
        processes = [root, *root.children(recursive=True)]
        found = set()
        for proc in processes:
            try:
                found.add((proc.pid, proc.create_time()))
                for mapped in proc.memory_maps():
                    if mapped.path.startswith(SHM_PREFIX):
                        self.segments.add(mapped.path[len("/dev/shm/"):])
                    elif mapped.path.startswith(MEMFD_PREFIX):
                        # sealed memfd segments have no name in /dev/shm: they go with
                        # their last holder, so only their use is recorded
                        self.memfds.add(mapped.path.split()[0])
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        self.tree |= found
        return found

    def producers(self) -> set[str]:
        """The producer prefixes (``edge_<id>_``) of the segments seen mapped."""
        return {name.rsplit("_", 1)[0] + "_" for name in self.segments}


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


@contextmanager
def running(pipelines: Sequence[Path | str], *extra: str, env: dict[str, str] | None = None,
            start_timeout_s: float = 240.0, stop_timeout_s: float = 90.0,
            stop_signal: signal.Signals = signal.SIGTERM) -> Iterator[Served]:
    """Run ``edge serve`` on the pipelines until the block ends; check the shutdown."""
    before = snapshot()
    command = [EDGE, "serve", *map(str, pipelines), "--port", "0", "--json", *extra]
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True,
                               env={**os.environ, **(env or {})})
    assert process.stderr is not None and process.stdout is not None
    lines: list[str] = []
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

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    served: Served | None = None
    try:
        if not found.wait(start_timeout_s) or not url:
            raise AssertionError("edge serve did not start:\n" + "".join(lines[-40:]))
        served = Served(process, url[0], lines)
        served.record_tree()
        yield served
    finally:
        if served is not None and process.poll() is None:
            served.record_tree()
        if process.poll() is None:
            process.send_signal(stop_signal)
        try:
            out, _ = process.communicate(timeout=stop_timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            out, _ = process.communicate()
            raise AssertionError("edge serve did not stop on SIGTERM:\n"
                                 + "".join(lines[-40:])) from None
        reader.join(5.0)
        if served is not None:
            served.returncode = process.returncode
            served.summary = _last_document(out)
    assert served is not None
    deadline = time.monotonic() + 10.0
    while any(_alive(pid, created) for pid, created in served.tree):
        assert time.monotonic() < deadline, f"processes left: {served.tree}"
        time.sleep(0.05)
    leaks = leaks_since(before)
    # Other test runs on a shared machine create segments too: only this server's count
    # (those its processes had mapped, and any other of the same producers).
    ours = [name for name in leaks.segments
            if name in served.segments or name.startswith(tuple(served.producers()))]
    left = sorted(n for n in served.segments if Path("/dev/shm", n).exists())
    assert not leaks.children and not ours and not left, (leaks.describe(), ours, left)
    assert served.returncode == 0, "".join(lines[-40:])
    assert served.summary["ok"] is True, served.summary
    assert served.summary["ledger_after_close"]["reservations"] == []
    for pipeline in served.summary["closed"].values():
        for stage in pipeline.values():
            assert stage["release"] == "released", stage
            assert stage["retire"]["verified"] is True, stage
