"""The process heap's policy: large blocks go back to the operating system when freed.

glibc's ``malloc`` serves a block of at least ``M_MMAP_THRESHOLD`` bytes (128 KiB at
start) with a mapping of its own, unmapped when freed. But the threshold is *dynamic*:
each time such a block is freed, it rises to that block's size (up to 32 MiB), so after a
few freed page-sized arrays every later array of that size comes from the heap, and a
heap keeps what was freed inside it. A process that handles arrays of varying size on
several threads (the controller's transforms, an ONNX Runtime worker's tensors) then holds
the largest working set it ever had, once per thread's heap, for good.

:func:`keep_heap_lean` fixes the threshold (glibc then stops moving it) and the trim
threshold at :data:`LEAN_THRESHOLD_BYTES`: a freed large block is unmapped at once, and a
heap's free top beyond that size is given back. The cost is a fresh mapping (page
faults) for each large block, measured in ``benchmarks/memory.py``.

:data:`HEAP_ENV` (``EDGE_HEAP``) chooses: ``lean`` (the default) or ``default`` (glibc's
own dynamic policy, as before). Other allocators (musl, macOS, Windows) are left as they
are. Standard library only: the controller names the variable in a worker's environment
allowlist, and worker modules call :func:`keep_heap_lean` before loading their runtime.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    import ctypes

__all__ = ["HEAP_ENV", "HEAP_POLICIES", "LEAN_THRESHOLD_BYTES", "LEAN_TUNABLES", "heap_policy",
           "keep_heap_lean", "lean_process_environment"]

HEAP_ENV: Final = "EDGE_HEAP"
"""Environment variable naming the heap policy: ``lean`` (default) or ``default``."""

HEAP_POLICIES: Final = ("lean", "default")
"""The policies :data:`HEAP_ENV` accepts."""

LEAN_THRESHOLD_BYTES: Final = 256 * 1024
"""Blocks at least this large are mapped on their own and unmapped when freed."""

LEAN_TUNABLES: Final = (f"glibc.malloc.mmap_threshold={LEAN_THRESHOLD_BYTES}:"
                        f"glibc.malloc.trim_threshold={LEAN_THRESHOLD_BYTES}:"
                        "glibc.malloc.hugetlb=1")
"""``GLIBC_TUNABLES`` for a process started with the lean heap: the two thresholds, and
transparent huge pages for the blocks mapped on their own (``hugetlb=1``: a fresh block
then costs a few page faults instead of one per 4 KiB, which is most of what a worker
pays for giving its tensors back; no effect where the kernel's THP mode is ``never``)."""

_M_TRIM_THRESHOLD: Final = -1  # glibc's malloc.h
_M_MMAP_THRESHOLD: Final = -3

_lock = threading.Lock()
_applied: dict[str, object] | None = None


def heap_policy(environ: Mapping[str, str] | None = None) -> str:
    """The policy :data:`HEAP_ENV` names (``lean`` when unset or not one of the two)."""
    raw = (os.environ if environ is None else environ).get(HEAP_ENV, "").strip().lower()
    return raw if raw in HEAP_POLICIES else "lean"


def lean_process_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Variables that give a process the lean heap from its first allocation.

    ``{"GLIBC_TUNABLES": LEAN_TUNABLES}`` under the ``lean`` policy, else nothing. A
    backend sets them for its worker processes (glibc reads them at start only; other C
    libraries ignore them).
    """
    return {"GLIBC_TUNABLES": LEAN_TUNABLES} if heap_policy(environ) == "lean" else {}


def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # here: its import costs milliseconds, and only opening a pipeline pays

    try:
        libc = ctypes.CDLL(None)
        version = libc.gnu_get_libc_version
    except (OSError, AttributeError):  # musl and others have no gnu_get_libc_version
        return None
    version.restype = ctypes.c_char_p
    return libc


def keep_heap_lean(environ: Mapping[str, str] | None = None) -> dict[str, object]:
    """Apply the policy :data:`HEAP_ENV` names to this process, once; what was done.

    Returns ``{"policy", "allocator", "applied"}`` (and ``threshold_bytes`` when
    applied, ``tunables`` when the process was started with ``GLIBC_TUNABLES``).
    Idempotent: a second call returns the first call's answer.
    """
    global _applied
    with _lock:
        if _applied is not None:
            return dict(_applied)
        policy = heap_policy(environ)
        libc = _glibc()
        answer: dict[str, object] = {
            "policy": policy,
            "allocator": ("glibc " + libc.gnu_get_libc_version().decode()) if libc else "other",
            "applied": False,
        }
        if libc is not None and policy == "lean":
            import ctypes

            mallopt = libc.mallopt
            mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
            ok = (mallopt(_M_MMAP_THRESHOLD, LEAN_THRESHOLD_BYTES) == 1
                  and mallopt(_M_TRIM_THRESHOLD, LEAN_THRESHOLD_BYTES) == 1)
            answer["applied"] = ok
            answer["threshold_bytes"] = LEAN_THRESHOLD_BYTES
        if os.environ.get("GLIBC_TUNABLES"):
            answer["tunables"] = os.environ["GLIBC_TUNABLES"]
        _applied = answer
        return dict(answer)
