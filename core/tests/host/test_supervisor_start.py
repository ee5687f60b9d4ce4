"""What a worker's supervisor imports before it starts the worker, which waits for it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from edge_core.host.supervisor import supervisor_argv

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux subreaper")


def test_the_supervisor_becomes_a_subreaper_without_the_ctypes_package():
    """``prctl`` through ``_ctypes`` alone: the package around it is start-up time.

    The supervisor runs with ``-X importtime`` on a worker that exits at once; every
    module it imported is on its stderr. (That it is a subreaper: test_tree_escape.py.)
    """
    argv = supervisor_argv(["true"], controller=os.getpid(), prefixes=[], remove=[])
    assert argv[1:3] == ["-I", "-S"]
    done = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], capture_output=True,
                          text=True, timeout=30, start_new_session=True)
    assert done.returncode == 0, done.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    assert "supervisor" in imported and "_ctypes" in imported, sorted(imported)
    assert not {"ctypes", "struct", "contextlib", "signal"} & imported, sorted(imported)
