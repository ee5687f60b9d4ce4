"""The leak check itself: it must see a leaked process, segment and descriptor."""

from __future__ import annotations

import os
import subprocess
import sys

from edge_contracts.shm import SegmentProducer, new_prefix
from edge_core.testing.leaks import leaks_since, snapshot


def test_leak_check_reports_a_child_process_segment_and_fd():
    before = snapshot()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    producer = SegmentProducer(new_prefix())
    segment = producer.lease(100).segment  # keep no view: it would pin the mapping's fd
    fd = os.open(os.devnull, os.O_RDONLY)
    try:
        report = leaks_since(before, grace_s=0.1)
        assert report
        assert any(str(child.pid) in line for line in report.children)
        assert report.segments == (segment,)
        assert any(line.startswith(f"{fd}->") for line in report.fds), report.fds
        assert "children: processes left running" in report.describe()
    finally:
        os.close(fd)
        producer.close()
        child.kill()
        child.wait()
    assert not leaks_since(before, grace_s=1.0)
