"""The worker-log setting of one command does not carry over to the next in one process.

``main(argv)`` called twice in one process (a test, a script that embeds the command
line) runs two real ``edge run`` commands on an echo pipeline. Each logs its workers to a
folder of its own, and a ``--verbose`` one (its workers' output on stderr) leaves
``EDGE_WORKER_LOG_DIR`` where it was, for the next. Before, the second command logged into
the folder the first had made, and after a ``--verbose`` one ``EDGE_WORKER_LOG_DIR`` was
gone from the environment: the next command made a fresh folder instead of using it.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np
import psutil
import pytest

from edge_contracts.shm import segment_names, segment_owner
from edge_core.cli import main
from edge_core.host.worker_logs import LOG_DIR_ENV, log_directory
from edge_core.testing.leaks import descendants

from .conftest import echo_pipeline

PIPELINE = echo_pipeline("one")


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "pipeline.toml").write_text(PIPELINE)
    np.savez(tmp_path / "x.npz", x=np.arange(8, dtype=np.float32))
    (tmp_path / "tmp").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EDGE_PLUGINS", "echo")
    monkeypatch.delenv(LOG_DIR_ENV, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # fresh folders here
    return tmp_path


def _run(capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, object]:
    """``edge run pipeline.toml --inputs x.npz --json EXTRA`` in this process: its JSON."""
    code = main(["run", "pipeline.toml", "--inputs", "x.npz", "--json", *extra])
    out, err = capsys.readouterr()
    assert code == 0, err
    document: dict[str, object] = json.loads(out)
    assert document["ok"] is True
    assert document["answer"] == {"x": {"dtype": "float32", "shape": [8]}}
    return document


def _assert_nothing_left() -> None:
    children = descendants()  # the warm pool's zygote is the pool's
    assert not [c for c in children if c.status() != psutil.STATUS_ZOMBIE], children
    left = [n for n in segment_names()
            if (o := segment_owner(n)) is not None and o.pid == os.getpid()]
    assert not left, left


def test_two_commands_in_one_process_each_log_to_a_folder_of_their_own(
        work: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first = _run(capsys)["worker_logs"]
    second = _run(capsys)["worker_logs"]
    assert isinstance(first, str) and isinstance(second, str)
    assert Path(first).parent == Path(second).parent == work / "tmp"
    assert first != second  # before: the second logged into the first one's folder
    assert log_directory() is None  # the process's setting is as before the commands
    _assert_nothing_left()


def test_a_verbose_command_leaves_the_log_variable_for_the_next(
        work: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    named = work / "named-logs"
    monkeypatch.setenv(LOG_DIR_ENV, str(named))
    assert _run(capsys, "--verbose")["worker_logs"] is None  # on stderr: no folder
    assert os.environ.get(LOG_DIR_ENV) == str(named)  # before: taken out for good
    assert _run(capsys)["worker_logs"] == str(named)
    assert log_directory() == named
    assert list((work / "tmp").iterdir()) == []  # no fresh folder was made
    _assert_nothing_left()
