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


# Another edge-core program: started before the check, it keeps making segments (under
# its own prefixes) and staged directories while the check runs.
_OTHER_PROGRAM = """
import sys, time
from edge_contracts.shm import SegmentProducer, new_prefix
from edge_core.host.staging import stage_packages
print("ready", flush=True)
sys.stdin.readline()
producer = SegmentProducer(new_prefix())
lease = producer.lease(100)
staged = stage_packages(())
print(lease.segment, staged, flush=True)
sys.stdin.readline()
import shutil
shutil.rmtree(staged)
producer.close()
"""


def test_leak_check_ignores_what_another_edge_program_makes_meanwhile():
    # Launched through an intermediate process that exits at once, so that the other
    # program is not a descendant of this one (as another user's program would not be).
    launcher = (
        "import subprocess, sys\n"
        "subprocess.Popen([sys.executable, '-c', sys.argv[1]], start_new_session=True)\n"
    )
    other = subprocess.Popen([sys.executable, "-c", launcher, _OTHER_PROGRAM],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert other.stdin is not None and other.stdout is not None
    try:
        assert other.stdout.readline().strip() == b"ready"
        other.wait(timeout=30)  # the launcher: gone, its child re-parented away
        before = snapshot()
        other.stdin.write(b"go\n")
        other.stdin.flush()
        segment, staged = other.stdout.readline().decode().split()
        assert os.path.exists(f"/dev/shm/{segment}") and os.path.isdir(staged)
        assert not leaks_since(before, grace_s=0.1)  # not this process's
    finally:
        other.stdin.write(b"done\n")
        other.stdin.close()
        other.stdout.read()  # until the other program has exited (its end of the pipe)
        other.stdout.close()


def test_leak_check_reports_a_staged_directory_of_its_own():
    import shutil

    from edge_core.host.staging import stage_packages

    before = snapshot()
    staged = stage_packages(())
    try:
        report = leaks_since(before, grace_s=0.1)
        assert report.files == (str(staged),)
        assert "files: staged directories left" in report.describe()
    finally:
        shutil.rmtree(staged)
    assert not leaks_since(before, grace_s=0.1)
