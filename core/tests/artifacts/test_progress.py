"""The progress reporter: drawn when forced or on a terminal, silent otherwise."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from edge_core.artifacts.hashing import hash_member
from edge_core.progress import PROGRESS_ENV, Progress

MIB = 1 << 20


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def big_file(tmp_path: Path) -> Path:
    path = tmp_path / "weights.bin"
    path.write_bytes(os.urandom(12 * MIB))
    return path


def test_forced_progress_reports_hashing_of_a_multi_megabyte_file(
    big_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(PROGRESS_ENV, raising=False)
    stream = io.StringIO()
    with Progress("hashing", 12 * MIB, stream=stream, enabled=True, min_total=8 * MIB) as bar:
        hash_member(big_file.parent.resolve(), big_file.name, progress=bar)
    lines = stream.getvalue().splitlines()
    assert lines, "forced progress must draw on a stream that is not a terminal"
    assert "\r" not in stream.getvalue()
    last = lines[-1]
    assert last.startswith("hashing [########################] 100% 12.0 MiB/12.0 MiB")
    assert last.endswith("weights.bin")
    assert bar.done == 12 * MIB


def test_progress_is_silent_when_not_a_terminal_and_not_forced(
    big_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(PROGRESS_ENV, raising=False)
    stream = io.StringIO()
    with Progress("hashing", 12 * MIB, stream=stream) as bar:
        hash_member(big_file.parent.resolve(), big_file.name, progress=bar)
    assert stream.getvalue() == ""


def test_progress_on_a_terminal_redraws_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PROGRESS_ENV, raising=False)
    stream = _Terminal()
    with Progress("loading", 4, unit="stages", stream=stream) as bar:
        for _ in range(4):
            bar.update(1)
    text = stream.getvalue()
    assert text.startswith("\rloading [")
    assert text.endswith("100% 4 stages/4 stages\x1b[K\n")
    assert text.count("\n") == 1


@pytest.mark.parametrize(("setting", "drawn"), [("1", True), ("always", True), ("0", False),
                                                ("never", False)])
def test_environment_forces_progress_on_or_off(
    monkeypatch: pytest.MonkeyPatch, setting: str, drawn: bool
) -> None:
    monkeypatch.setenv(PROGRESS_ENV, setting)
    stream = _Terminal() if not drawn else io.StringIO()
    with Progress("work", 10, unit="", stream=stream) as bar:
        bar.update(10)
    assert bool(stream.getvalue()) is drawn


def test_explicit_disable_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PROGRESS_ENV, "1")
    stream = _Terminal()
    with Progress("work", 10, stream=stream, enabled=False) as bar:
        bar.update(10)
    assert stream.getvalue() == ""


def test_small_work_below_the_threshold_draws_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PROGRESS_ENV, raising=False)
    stream = io.StringIO()
    with Progress("hashing", MIB, stream=stream, enabled=True, min_total=8 * MIB) as bar:
        bar.update(MIB)
    assert stream.getvalue() == ""


def test_unknown_total_shows_the_amount_done(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PROGRESS_ENV, raising=False)
    stream = io.StringIO()
    with Progress("reading", stream=stream, enabled=True) as bar:
        bar.update(3 * MIB)
    assert stream.getvalue().splitlines()[-1].startswith("reading 3.0 MiB ")


def test_updates_after_close_draw_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PROGRESS_ENV, raising=False)
    stream = io.StringIO()
    bar = Progress("x", 1, stream=stream, enabled=True)
    bar.close()
    drawn = stream.getvalue()
    bar.update(1)
    bar.close()
    assert stream.getvalue() == drawn
