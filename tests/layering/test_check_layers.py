"""The layering check (tools/check_layers.py, run by ``make lint``) fails on what it forbids.

Each test plants one fault in a temporary distribution (``src/`` layout, like ours) and
runs the check as ``make lint`` does; the real tree must pass.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "check_layers.py"
d = textwrap.dedent


def check(*args: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TOOL), *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=300, check=False)


def package(tmp_path: Path, files: dict[str, str]) -> Path:
    """A distribution ``tmp_path/dist`` with package ``pkg`` holding ``files``."""
    src = tmp_path / "dist" / "src" / "pkg"
    src.mkdir(parents=True)
    (src / "__init__.py").write_text('"""A planted package."""\n')
    for name, text in files.items():
        (src / name).write_text(text)
    return tmp_path / "dist"


CLEAN = {
    "low.py": d('''\
        """The bottom layer."""

        class Low:
            def __init__(self) -> None:
                self._lock = 1

            def held(self) -> int:
                return self._lock
        '''),
    "high.py": d('''\
        """The top layer: imports down only."""

        from pkg.low import Low

        def make() -> Low:
            return Low()
        '''),
}


def test_a_clean_package_passes(tmp_path: Path) -> None:
    done = check(package(tmp_path, CLEAN))
    assert done.returncode == 0, done.stderr


def test_a_circle_hidden_in_a_function_and_under_type_checking_fails(tmp_path: Path) -> None:
    root = package(tmp_path, {**CLEAN, "low.py": CLEAN["low.py"] + d('''
        from typing import TYPE_CHECKING

        if TYPE_CHECKING:
            from pkg.high import make

        def later() -> object:
            from pkg import high
            return high
        ''')})
    done = check(root)
    assert done.returncode == 1
    assert "circle: pkg.high -> pkg.low" in done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["circles"] == 1


def test_a_private_name_imported_from_another_module_fails(tmp_path: Path) -> None:
    root = package(tmp_path, {**CLEAN, "low.py": CLEAN["low.py"] + "\n_SECRET = 1\n",
                              "other.py": '"""Reaches in."""\n\nfrom pkg.low import _SECRET\n'})
    done = check(root)
    assert done.returncode == 1
    assert "pkg.other imports _SECRET from pkg.low" in done.stderr


def test_a_private_attribute_of_another_object_fails(tmp_path: Path) -> None:
    root = package(tmp_path, {**CLEAN, "high.py": CLEAN["high.py"] + d('''
        def peek(low: Low) -> int:
            return low._lock
        ''')})
    done = check(root)
    assert done.returncode == 1
    assert "pkg.high uses low._lock" in done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["private_cross_module"] == 1


def test_a_package_private_module_is_private_to_its_package(tmp_path: Path) -> None:
    root = package(tmp_path, {**CLEAN, "_native.py": '"""Package-private."""\n\nX = 1\n',
                              "low.py": CLEAN["low.py"] + "\nfrom pkg._native import X\n"})
    assert check(root).returncode == 0  # a sibling may use it
    outside = root / "src" / "other"
    outside.mkdir()
    (outside / "__init__.py").write_text('"""Another package."""\n\nfrom pkg import _native\n')
    done = check(root)
    assert done.returncode == 1
    assert "imports the package-private module pkg._native" in done.stderr


def test_standard_library_idioms_and_dunders_are_not_private(tmp_path: Path) -> None:
    root = package(tmp_path, {**CLEAN, "high.py": CLEAN["high.py"] + d('''
        import collections
        import os
        import sys

        Point = collections.namedtuple("Point", "x y")

        def idioms() -> object:
            sys._getframe(0)
            if False:
                os._exit(1)
            return Point(1, 2)._replace(x=3), Low.__name__, Low().__class__
        ''')})
    done = check(root)
    assert done.returncode == 0, done.stderr


MIXIN = d('''\
    """A class split in halves."""

    import threading


    class LockedHalf:
        _lock: threading.Lock

        def locked(self) -> bool:
            return self._lock.locked()


    class Whole(LockedHalf):
        def __init__(self) -> None:
            self._lock = threading.Lock()
    ''')


def test_a_mixin_that_leans_on_attributes_another_class_sets_fails(tmp_path: Path) -> None:
    done = check(package(tmp_path, {**CLEAN, "halves.py": MIXIN}))
    assert done.returncode == 1
    assert "mixin: LockedHalf uses attributes it never sets: _lock" in done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["mixin_classes"] == 1


def test_a_half_raising_not_implemented_for_its_sibling_base_fails(tmp_path: Path) -> None:
    root = package(tmp_path, {**CLEAN, "halves.py": d('''\
        """Two halves of one object."""


        class Sending:
            def _send(self, data: bytes) -> None:
                raise NotImplementedError

            def ping(self) -> None:
                self._send(b"ping")


        class Socket:
            def _send(self, data: bytes) -> None:
                print(data)


        class Client(Sending, Socket):
            """One object made of two halves."""
        ''')})
    done = check(root)
    assert done.returncode == 1
    assert "mixin: Sending, combined with another base, raises NotImplementedError" in done.stderr


def test_protocols_value_classes_and_exceptions_are_not_mixins(tmp_path: Path) -> None:
    root = package(tmp_path, {**CLEAN, "kinds.py": d('''\
        """Declared attributes that are not a mixin's."""

        import dataclasses
        from typing import Protocol


        class HasLock(Protocol):
            lock: object

            def locked(self) -> bool:
                return bool(self.lock)


        @dataclasses.dataclass
        class Value:
            size: int

            def twice(self) -> int:
                return 2 * self.size


        class Refused(KeyError, ValueError):
            """Multiple inheritance of exceptions."""
        ''')})
    done = check(root)
    assert done.returncode == 0, done.stderr


def test_a_missing_root_is_a_usage_error(tmp_path: Path) -> None:
    assert check(tmp_path / "nowhere").returncode == 2


@pytest.mark.slow
def test_the_tree_passes_and_the_report_names_each_module_with_its_concept() -> None:
    done = check("--report")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    summary = json.loads(lines[-1])
    assert summary["circles"] == summary["private_cross_module"] == 0
    assert summary["mixin_classes"] == 0
    assert summary["largest_module_lines"] > 0
    rows = {line.split()[0]: line for line in lines[:-1]}
    assert "The stage opener: resolve, reserve, start" in rows["edge_core.runtime.opener"]
    assert all("(no docstring)" not in row for row in rows.values()), [
        name for name, row in rows.items() if "(no docstring)" in row]
    for extra in ("tests/edge_echo", "examples"):  # make lint scans these too
        assert check(extra).returncode == 0
