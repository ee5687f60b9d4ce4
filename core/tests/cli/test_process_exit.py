"""``edge`` as a process's own command line leaves its objects to the teardown, uncollected.

Counted, never timed: ``main()`` without ``argv`` (the ``edge`` script) freezes what is
still reachable for the cycle collector before the process ends (the interpreter's final
collections then have nothing to walk); ``main(argv)`` from a caller's own process, a
test's here, freezes nothing. The output and the exit code are the command's own.
"""

from __future__ import annotations

import gc
import json
import signal
import sys
from collections.abc import Iterator

import pytest

from edge_core.cli import main


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # nothing of this test stays in the permanent generation


@pytest.fixture
def signals() -> Iterator[None]:
    """The test process's SIGINT and SIGTERM handlers, put back after ``main()``."""
    kept = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    yield
    for signum, handler in kept.items():
        signal.signal(signum, handler)


def test_the_process_command_line_freezes_what_is_left_before_exit(
        unfrozen: None, signals: None, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("EDGE_PLUGINS", "echo")
    monkeypatch.setattr(sys, "argv", ["edge", "plugins", "--json"])
    assert main() == 0
    assert gc.get_freeze_count() > 0
    assert json.loads(capsys.readouterr().out)  # the command's output, whole
    # the exit hooks and the teardown follow: a late Ctrl-C or SIGTERM is ignored there
    # (the teardown would reset a handler to the default action: the process ended by
    # the signal instead of with the command's exit code; test_interrupts.py)
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN


def test_a_callers_main_argv_freezes_nothing(
        unfrozen: None, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("EDGE_PLUGINS", "echo")
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    assert main(["plugins", "--json"]) == 0
    assert gc.get_freeze_count() == 0
    assert json.loads(capsys.readouterr().out)
    # a caller's process keeps its own handlers
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers
