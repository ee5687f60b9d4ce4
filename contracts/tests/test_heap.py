"""The heap policies: ``rest`` gives freed memory back once at rest, ``eager`` at once,
``off`` (glibc's own) never."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from edge_contracts.heap import (
    HEAP_ENV,
    LEAN_TUNABLES,
    REST_S,
    eager_process_environment,
    heap_policy,
    unknown_heap_policy,
)

glibc = pytest.mark.skipif(not sys.platform.startswith("linux")
                           or not os.confstr("CS_GNU_LIBC_VERSION"),
                           reason="the policy acts on glibc's malloc only")

# On a thread of its own (a heap of its own): free a 16 MiB block (glibc then raises its
# threshold to 16 MiB), then 40 blocks of 2 MiB with a small block kept between each (so
# the freed ones are holes a heap cannot trim), then free the 2 MiB blocks: how much of
# them the process still holds at once, and after waiting (WAIT seconds, or until the
# watcher has given memory back).
SCRIPT = textwrap.dedent("""
    import json, sys, threading, time
    from edge_contracts.heap import apply_heap_policy, rests

    applied = apply_heap_policy()

    def resident():
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * 4096

    held = {}

    def work():
        big = bytearray(16 << 20)
        del big
        blocks, keep = [], []
        for _ in range(40):
            block = bytearray(2 << 20)
            block[::4096] = b"x" * len(block[::4096])
            blocks.append(block)
            keep.append(bytearray(2048))
        before = resident()
        del blocks
        held["at_once"] = (resident() - before + (80 << 20)) / (1 << 20)
        held["keep"] = keep  # alive after the thread: the holes stay holes
        held["base"] = before - (80 << 20)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    deadline = time.monotonic() + float(sys.argv[1])
    while time.monotonic() < deadline and not rests():
        time.sleep(0.05)
    later = (resident() - held["base"]) / (1 << 20)
    print(json.dumps({"applied": applied, "at_once_mib": held["at_once"], "later_mib": later,
                      "rests": rests()}))
""")


def _held(policy: str, wait_s: float) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in (HEAP_ENV, "GLIBC_TUNABLES")}
    env[HEAP_ENV] = policy
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(wait_s)], env=env,
                          capture_output=True, text=True, timeout=60, check=True)
    found: dict[str, Any] = json.loads(done.stdout)
    return found


@glibc
def test_at_rest_the_process_gives_freed_blocks_back_eager_at_once_off_never() -> None:
    rest = _held("rest", 2 * REST_S + 5)  # until the watcher has given memory back
    eager = _held("eager", 0)
    off = _held("off", REST_S + 1)
    assert (rest["applied"]["policy"], eager["applied"]["policy"]) == ("rest", "eager")
    assert rest["applied"]["applied"] and eager["applied"]["applied"]
    assert off["applied"]["applied"] is False
    assert rest["at_once_mib"] > 60  # reused while busy ...
    assert rest["rests"] >= 1 and rest["later_mib"] < 12  # ... given back at rest
    assert eager["at_once_mib"] < 8 and eager["rests"] == 0
    assert off["at_once_mib"] > 60 and off["later_mib"] > 60 and off["rests"] == 0


def test_the_policy_comes_from_the_environment_and_defaults_to_rest() -> None:
    assert heap_policy({}) == "rest"
    assert heap_policy({HEAP_ENV: "off"}) == "off"
    assert heap_policy({HEAP_ENV: " Eager "}) == "eager"
    assert heap_policy({HEAP_ENV: "bogus"}) == "rest"
    assert eager_process_environment({HEAP_ENV: "eager"}) == {"GLIBC_TUNABLES": LEAN_TUNABLES}
    assert eager_process_environment({}) == {}
    assert "glibc.malloc.mmap_threshold=262144" in LEAN_TUNABLES


def test_a_value_that_names_no_policy_is_told_apart_from_unset() -> None:
    for value in ("", "  ", "rest", "EAGER", " off "):
        assert unknown_heap_policy({HEAP_ENV: value}) is None, value
    assert unknown_heap_policy({}) is None
    assert unknown_heap_policy({HEAP_ENV: "eagre"}) == "eagre"
    assert unknown_heap_policy({HEAP_ENV: "1"}) == "1"
    assert heap_policy({HEAP_ENV: "eagre"}) == "rest"  # a worker still starts (with rest)
