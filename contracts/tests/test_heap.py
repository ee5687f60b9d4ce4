"""The lean heap policy gives freed arrays back to the system; glibc's own keeps them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from edge_contracts.heap import (
    HEAP_ENV,
    LEAN_TUNABLES,
    heap_policy,
    lean_process_environment,
)

glibc = pytest.mark.skipif(not sys.platform.startswith("linux")
                           or not os.confstr("CS_GNU_LIBC_VERSION"),
                           reason="the policy acts on glibc's malloc only")

# On a thread of its own (a heap of its own): free a 16 MiB block (glibc then raises its
# threshold to 16 MiB), then 40 blocks of 2 MiB with a small block kept between each (so
# the freed ones are holes a heap cannot trim), then free the 2 MiB blocks: how much of
# them the process still holds.
SCRIPT = textwrap.dedent("""
    import json, threading
    from edge_contracts.heap import keep_heap_lean

    applied = keep_heap_lean()

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
        held["mib"] = (resident() - before + (80 << 20)) / (1 << 20)
        held["keep"] = len(keep)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    print(json.dumps({"applied": applied, "held_mib": held["mib"]}))
""")


def _held(policy: str) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k not in (HEAP_ENV, "GLIBC_TUNABLES")}
    env[HEAP_ENV] = policy
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=60, check=True)
    return dict(json.loads(done.stdout))


@glibc
def test_the_lean_heap_gives_freed_blocks_back_and_glibcs_own_policy_keeps_them() -> None:
    lean = _held("lean")
    default = _held("default")
    assert lean["applied"]["applied"] is True  # type: ignore[index]
    assert default["applied"]["applied"] is False  # type: ignore[index]
    assert float(lean["held_mib"]) < 8  # type: ignore[arg-type]
    assert float(default["held_mib"]) > 60  # type: ignore[arg-type]


def test_the_policy_comes_from_the_environment_and_defaults_to_lean() -> None:
    assert heap_policy({}) == "lean"
    assert heap_policy({HEAP_ENV: "default"}) == "default"
    assert heap_policy({HEAP_ENV: " Lean "}) == "lean"
    assert heap_policy({HEAP_ENV: "bogus"}) == "lean"
    assert lean_process_environment({}) == {"GLIBC_TUNABLES": LEAN_TUNABLES}
    assert lean_process_environment({HEAP_ENV: "default"}) == {}
    assert "glibc.malloc.mmap_threshold=262144" in LEAN_TUNABLES
