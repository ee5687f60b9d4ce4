"""The liveness monitor's judgement: thread states of real processes, and its rules."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from edge_core.host.liveness import (
    NOT_RUNNABLE_S,
    SILENCE_S,
    STARVED_SILENCE_S,
    LivenessMonitor,
    judge,
    thread_states,
)


def test_a_stopped_process_shows_stopped_thread_states() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        os.kill(child.pid, signal.SIGSTOP)
        end = time.monotonic() + 5
        while (thread_states(child.pid) or set()).isdisjoint({"T", "t"}):
            assert time.monotonic() < end
            time.sleep(0.01)
        assert judge(SILENCE_S, False, thread_states(child.pid), 0.0) is not None
        os.kill(child.pid, signal.SIGCONT)
        end = time.monotonic() + 5
        while not (thread_states(child.pid) or set()).isdisjoint({"T", "t"}):
            assert time.monotonic() < end
            time.sleep(0.01)
        # sleeping, no heartbeat feature: silence alone never condemns it
        assert judge(60.0, False, thread_states(child.pid), 60.0) is None
    finally:
        child.kill()
        child.wait()
    assert thread_states(child.pid) is None  # gone (and reaped)


def test_the_rules() -> None:
    assert judge(SILENCE_S - 0.01, True, {"T"}, 0.0) is None  # not silent long enough
    assert "stopped" in (judge(SILENCE_S, True, {"T", "S"}, 0.0) or "")  # at the first look
    assert "no runnable thread" in (judge(SILENCE_S, True, {"S", "D"}, NOT_RUNNABLE_S) or "")
    # every thread asleep at one look (or for less than NOT_RUNNABLE_S): maybe a moment's
    assert judge(SILENCE_S, True, {"S", "D"}, 0.0) is None
    assert judge(SILENCE_S, True, {"S"}, NOT_RUNNABLE_S - 0.01) is None
    assert judge(SILENCE_S, True, {"R", "S"}, 0.0) is None  # runnable: maybe only starved
    assert "runnable" in (judge(STARVED_SILENCE_S, True, {"R", "S"}, 0.0) or "")
    assert judge(STARVED_SILENCE_S, False, {"R"}, 0.0) is None  # no heartbeats: stopped only


class _Silent:
    """A watched worker (the monitor's ``Watched``) that never speaks, with work outstanding;
    its process is a real child, whose threads the monitor reads."""

    def __init__(self, pid: int) -> None:
        self.liveness_pid = pid
        self.last_heard = 0.0
        self.heartbeats = True
        self.reasons: list[tuple[float, str]] = []

    def outstanding(self) -> int:
        return 1

    def unread(self) -> bool:
        return False

    def unresponsive(self, reason: str) -> None:
        self.reasons.append((time.monotonic(), reason))


def _watched_until_declared(code: str, within_s: float) -> tuple[float, list[tuple[float, str]]]:
    child = subprocess.Popen([sys.executable, "-c", code])
    watched = _Silent(child.pid)
    watcher = LivenessMonitor(tick_s=0.05)
    try:
        time.sleep(0.3)  # the child's interpreter is up
        started = time.monotonic()
        watcher.watch(watched)
        end = started + within_s
        while not watched.reasons and time.monotonic() < end:
            time.sleep(0.02)
        return started, watched.reasons
    finally:
        watcher.forget(watched)
        child.kill()
        child.wait()


def test_a_silent_worker_asleep_at_every_look_is_declared_only_after_not_runnable_s() -> None:
    started, reasons = _watched_until_declared("import time; time.sleep(30)", within_s=10.0)
    assert len(reasons) == 1, reasons
    at, reason = reasons[0]
    assert "no heartbeat and no runnable thread for" in reason, reason
    # silent from the first look; asleep at every look since SILENCE_S: not before both
    assert at - started >= SILENCE_S + NOT_RUNNABLE_S - 0.01, (at - started, reason)
    shown = float(reason.split("no runnable thread for ")[1].split(" s")[0])
    assert shown >= NOT_RUNNABLE_S

