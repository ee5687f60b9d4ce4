"""``edge`` as a process's own command line leaves its objects to the teardown, uncollected.

Counted, never timed: ``main()`` without ``argv`` (the ``edge`` script) freezes what is
still reachable for the cycle collector before the process ends (the interpreter's final
collections then have nothing to walk); ``main(argv)`` from a caller's own process, a
test's here, freezes nothing. The output and the exit code are the command's own.
"""

from __future__ import annotations

import gc
import json
import sys
from collections.abc import Iterator

import pytest

from edge_core.cli import main


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # nothing of this test stays in the permanent generation


def test_the_process_command_line_freezes_what_is_left_before_exit(
        unfrozen: None, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("EDGE_PLUGINS", "echo")
    monkeypatch.setattr(sys, "argv", ["edge", "plugins", "--json"])
    assert main() == 0
    assert gc.get_freeze_count() > 0
    assert json.loads(capsys.readouterr().out)  # the command's output, whole


def test_a_callers_main_argv_freezes_nothing(
        unfrozen: None, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("EDGE_PLUGINS", "echo")
    assert main(["plugins", "--json"]) == 0
    assert gc.get_freeze_count() == 0
    assert json.loads(capsys.readouterr().out)
