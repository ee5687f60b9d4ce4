"""The liveness monitor's judgement: thread states of real processes, and its rules."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from edge_core.host.liveness import SILENCE_S, STARVED_SILENCE_S, judge, thread_states


def test_a_stopped_process_shows_stopped_thread_states() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        os.kill(child.pid, signal.SIGSTOP)
        end = time.monotonic() + 5
        while (thread_states(child.pid) or set()).isdisjoint({"T", "t"}):
            assert time.monotonic() < end
            time.sleep(0.01)
        assert judge(SILENCE_S, False, thread_states(child.pid)) is not None
        os.kill(child.pid, signal.SIGCONT)
        end = time.monotonic() + 5
        while not (thread_states(child.pid) or set()).isdisjoint({"T", "t"}):
            assert time.monotonic() < end
            time.sleep(0.01)
        # sleeping, no heartbeat feature: silence alone never condemns it
        assert judge(60.0, False, thread_states(child.pid)) is None
    finally:
        child.kill()
        child.wait()
    assert thread_states(child.pid) is None  # gone (and reaped)


def test_the_rules() -> None:
    assert judge(SILENCE_S - 0.01, True, {"T"}) is None  # not silent long enough
    assert "stopped" in (judge(SILENCE_S, True, {"T", "S"}) or "")
    assert "no runnable thread" in (judge(SILENCE_S, True, {"S", "D"}) or "")
    assert judge(SILENCE_S, True, {"R", "S"}) is None  # runnable: maybe only starved
    assert "runnable" in (judge(STARVED_SILENCE_S, True, {"R", "S"}) or "")
    assert judge(STARVED_SILENCE_S, False, {"R"}) is None  # no heartbeats: stopped only
