"""The committed evidence example names no path of the machine that produced it."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "docs" / "examples"
MACHINE_PATH = re.compile(
    r"(?<![\w.$])/(?:home|root|tmp|work|Users|opt|mnt|srv|data|private/var|var/folders)/"
    r"|\b[A-Za-z]:(?:\\\\|\\|/)(?:Users|Windows|ProgramData|tmp|work)"  # C:\Users ...
)


@pytest.mark.parametrize(
    "path",
    sorted(p for p in REPORT.rglob("*") if p.suffix in {".json", ".md", ".html"}),
    ids=lambda p: str(p.relative_to(REPORT)),
)
def test_no_absolute_machine_paths(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    found = sorted(set(MACHINE_PATH.findall(text)))
    assert not found, f"{path.relative_to(ROOT)} names machine paths: {found}"


def test_no_checkout_or_temp_path() -> None:
    for path in sorted(p for p in REPORT.rglob("*") if p.suffix in {".json", ".md", ".html"}):
        text = path.read_text(encoding="utf-8")
        assert str(ROOT) not in text, path
        assert f'"{tempfile.gettempdir()}/' not in text, path


def test_the_check_sees_what_it_should() -> None:
    assert MACHINE_PATH.search('"interpreter": "/home/me/.venv/bin/python"')
    assert MACHINE_PATH.search('"tmp": "/private/var/folders/x/T/edge-bundle"')
    assert MACHINE_PATH.search('"python": "C:\\\\Users\\\\me\\\\python.exe"')
    assert MACHINE_PATH.search('"bundle": "/opt/models/detect"')
    assert not MACHINE_PATH.search('"interpreter": ".venv/bin/python"')
    assert not MACHINE_PATH.search('"staged": "$TMPDIR/edge-bundle-x"')
