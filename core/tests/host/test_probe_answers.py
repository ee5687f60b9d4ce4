"""Cached probe answers: kept per boot and installed stack, asked again when either moves.

Real interpreter runs: the probe prints a fresh random token, so a cached answer is the
one that repeats. A probe whose interpreter has no ``site-packages`` to stamp, a failed
probe and ``EDGE_PROBE_CACHE=off`` are never cached.

``edge probe``'s whole answer (``keep_answer``/``kept_answer``): reused under the same
path, environment and boot, and given up when a module file it was made with, another
interpreter its probes asked, or any environment variable but the shell's bookkeeping
changes. These tests set ``sys.path`` to folders of their own, so nothing another test
writes meanwhile moves the key.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from edge_core.host.probe_answers import (
    PROBE_CACHE_ENV,
    cached_probe,
    keep_answer,
    kept_answer,
    site_folders,
    stack_key,
)
from edge_core.host.probe_process import observed_probes

SCRIPT = "import secrets; print(secrets.token_hex(8))"


def _venv(root: Path) -> str:
    """A folder laid out as a virtual environment whose python is this interpreter."""
    (root / "bin").mkdir(parents=True)
    (root / "lib" / f"python3.{sys.version_info.minor}" / "site-packages").mkdir(parents=True)
    python = root / "bin" / "python"
    python.symlink_to(sys.executable)
    return str(python)


def _ask(interpreter: str, script: str = SCRIPT) -> tuple[str, str | None]:
    result, cached_at = cached_probe([interpreter, "-c", script], interpreter=interpreter,
                                     timeout_s=60)
    return result.stdout, cached_at


def test_an_answer_is_reused_until_the_installed_stack_changes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PROBE_CACHE_ENV, str(tmp_path / "cache"))
    python = _venv(tmp_path / "env")
    (site,) = site_folders(python)
    first, cached = _ask(python)
    assert cached is None and first.strip()
    again, cached = _ask(python)
    assert again == first and cached is not None  # the same token: not asked again
    (site / "newly_installed-1.0.dist-info").mkdir()  # what pip install does to the folder
    os.utime(site, ns=(site.stat().st_atime_ns, site.stat().st_mtime_ns + 10**9))
    fresh, cached = _ask(python)
    assert cached is None and fresh != first


def test_another_environment_value_asks_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PROBE_CACHE_ENV, str(tmp_path / "cache"))
    python = _venv(tmp_path / "env")
    first, _ = _ask(python)
    monkeypatch.setenv("PYTHONHASHSEED", "7")  # on the probes' allowlist: reaches the probe
    second, cached = _ask(python)
    assert cached is None and second != first


def test_off_failures_and_unstamped_interpreters_are_never_cached(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PROBE_CACHE_ENV, str(tmp_path / "cache"))
    python = _venv(tmp_path / "env")
    failing = "import sys; print('partial'); sys.exit(3)"
    assert _ask(python, failing) == ("partial\n", None)
    assert _ask(python, failing) == ("partial\n", None)
    bare = tmp_path / "bare" / "python"  # no site-packages beside it
    bare.parent.mkdir()
    bare.symlink_to(sys.executable)
    assert site_folders(str(bare)) == []
    assert _ask(str(bare))[0] != _ask(str(bare))[0]
    monkeypatch.setenv(PROBE_CACHE_ENV, "off")
    assert _ask(python)[0] != _ask(python)[0]


def test_a_corrupt_cached_answer_is_asked_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv(PROBE_CACHE_ENV, str(cache))
    python = _venv(tmp_path / "env")
    first, _ = _ask(python)
    (path,) = cache.glob("*.json")
    path.write_text("{not json")
    second, cached = _ask(python)
    assert cached is None and second != first


ANSWER = {"host": {"domain": "posix"}, "pools": [], "plugin_errors": [],
          "backends": [{"plugin": "p", "backend": "b", "available": True, "notes": []}]}


@pytest.fixture
def whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache folder of the test's own and a ``sys.path`` of one folder nobody else writes."""
    monkeypatch.setenv(PROBE_CACHE_ENV, str(tmp_path / "cache"))
    path = tmp_path / "path"
    path.mkdir()
    monkeypatch.setattr(sys, "path", [str(path)])
    return path


def _bump(path: Path) -> None:
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))


def test_a_whole_answer_is_reused_until_a_module_it_was_made_with_changes(
        whole: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = whole.parent / "edge_probe_answer_subject.py"
    source.write_text("VALUE = 1\n")
    spec = importlib.util.spec_from_file_location("edge_probe_answer_subject", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "edge_probe_answer_subject", module)
    assert kept_answer() is None
    assert keep_answer(ANSWER)
    kept = kept_answer()
    assert kept is not None and kept[0] == ANSWER and kept[1].endswith("Z")
    monkeypatch.setenv("PWD", "/elsewhere")  # the shell's bookkeeping: not in the key
    assert kept_answer() is not None
    source.write_text("VALUE = 2\n")  # the plugin's code changed: ask again
    _bump(source)
    assert kept_answer() is None


def test_an_install_or_another_environment_gives_the_whole_answer_up(
        whole: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert keep_answer(ANSWER)
    key = stack_key()
    (whole / "newly_installed-1.0.dist-info").mkdir()  # what pip install does to the folder
    _bump(whole)
    assert stack_key() != key and kept_answer() is None
    assert keep_answer(ANSWER) and kept_answer() is not None
    monkeypatch.setenv("EDGE_ORT_DIRECTML_PYTHON", "/opt/vendor/bin/python")
    assert kept_answer() is None


def test_another_interpreter_a_probe_asked_is_stamped(whole: Path) -> None:
    python = _venv(whole.parent / "vendor")
    with observed_probes() as programs:
        _ask(python, "print('devices')")
    assert programs == [python]
    assert keep_answer(ANSWER, programs) and kept_answer() is not None
    (site,) = site_folders(python)
    (site / "onnxruntime_vendor-1.0.dist-info").mkdir()
    _bump(site)
    assert kept_answer() is None


def test_off_and_a_corrupt_whole_answer_are_asked_again(
        whole: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert keep_answer(ANSWER)
    (path,) = (whole.parent / "cache").glob("edge-probe-*.json")
    document = json.loads(path.read_text())
    path.write_text(json.dumps({**document, "files": [["/no/such/module.py", 1, 2]]}))
    assert kept_answer() is None
    path.write_text("{not json")
    assert kept_answer() is None
    monkeypatch.setenv(PROBE_CACHE_ENV, "off")
    assert not keep_answer(ANSWER) and kept_answer() is None


def test_nested_observers_each_see_the_probes_asked_while_they_are_active(
        tmp_path: Path) -> None:
    python = _venv(tmp_path / "env")
    with observed_probes() as outer:
        with observed_probes() as inner:  # equal (empty) lists: each is kept by identity
            pass
        _ask(python, "print(1)")
    assert inner == [] and outer == [python]
