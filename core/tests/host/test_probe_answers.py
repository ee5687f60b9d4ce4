"""Cached probe answers: kept per boot and installed stack, asked again when either moves.

Real interpreter runs: the probe prints a fresh random token, so a cached answer is the
one that repeats. A probe whose interpreter has no ``site-packages`` to stamp, a failed
probe and ``EDGE_PROBE_CACHE=off`` are never cached.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from edge_core.host.probe_answers import PROBE_CACHE_ENV, cached_probe, site_folders

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
