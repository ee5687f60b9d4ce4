"""A worker tree's descendants and peak memory, read from /proc without a full scan."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from edge_core.host.identity import descendant_processes, start_time
from edge_core.testing.leaks import descendants
from edge_core.workerstage import tree_peak_rss

TREE = (
    "import subprocess, sys, time\n"
    "kids = [subprocess.Popen([sys.executable, '-c', "
    "'import subprocess, sys, time; subprocess.Popen([sys.executable, \"-c\", "
    "\"import time; time.sleep(30)\"]); time.sleep(30)']) for _ in range(2)]\n"
    "time.sleep(30)\n"
)


def test_descendants_match_psutil_and_peak_memory_sums_the_tree():
    root_proc = subprocess.Popen([sys.executable, "-c", TREE])
    try:
        root = psutil.Process(root_proc.pid)
        deadline = time.monotonic() + 10
        while len(root.children(recursive=True)) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        expected = sorted(p.pid for p in root.children(recursive=True))
        assert len(expected) == 4  # two children, each with a child
        assert sorted(p.pid for p in descendant_processes(root)) == expected
        total = tree_peak_rss(root.pid, start_time(root))
        assert total > psutil.Process(root.pid).memory_info().rss  # more than the root
        assert tree_peak_rss(root.pid, start_time(root) + 5) == 0  # not that process
    finally:
        for proc in psutil.Process(root_proc.pid).children(recursive=True):
            proc.kill()
        root_proc.kill()
        root_proc.wait()
        for proc in descendants():  # (the warm pool's zygote stays)
            proc.wait(5)
