"""The process heap's policy: what a process gives back to the system, and when.

glibc's ``malloc`` keeps freed memory for reuse. A process that handles arrays of varying
size on several threads (the controller's transforms, a worker's tensors) then holds its
largest working set once per thread's heap, for good: glibc raises its ``mmap`` threshold
to the size of every large block freed (up to 32 MiB), after which such blocks come from
the heaps, which give back only what is free at their top. Giving memory back is not free
either: the next request touches fresh pages again (page faults and zeroing, a few
milliseconds per 10 MiB). So the policy decides *when*:

``rest`` (the default)
    One heap for all threads (``M_ARENA_MAX`` 1: what one thread frees, the next reuses,
    instead of each thread keeping a working set of its own), reused while the process
    works; once the process has been at rest for :data:`REST_S` (under 5 % of one CPU), a
    watcher thread gives back every free page (``malloc_trim(0)``) and calls what was
    registered with :func:`on_rest` (an ONNX Runtime worker shrinks its arena there).
    Requests that follow each other pay nothing; the first one after a rest pays for the
    pages it touches again.
``eager``
    Blocks of :data:`LEAN_THRESHOLD_BYTES` or more are mapped on their own and unmapped
    when freed (both glibc thresholds fixed): memory goes back at once, and every request
    pays for fresh pages. A new process gets the same from its start through
    ``GLIBC_TUNABLES`` (:func:`eager_process_environment`).
``off``
    glibc's own policy: nothing is given back.

:data:`HEAP_ENV` (``EDGE_HEAP``) chooses; it passes to workers. Other C libraries than
glibc (musl, macOS, Windows) are left as they are (the watcher still runs the
:func:`on_rest` callbacks). Standard library only: the controller names the variable in a
worker's environment allowlist, and worker modules apply the policy before loading their
runtime. ``benchmarks/memory.py`` measures each policy.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    import ctypes

__all__ = ["HEAP_ENV", "HEAP_POLICIES", "LEAN_THRESHOLD_BYTES", "LEAN_TUNABLES", "REST_S",
           "apply_heap_policy", "eager_process_environment", "heap_policy", "on_rest",
           "rests", "unknown_heap_policy"]

HEAP_ENV: Final = "EDGE_HEAP"
"""Environment variable naming the heap policy: ``rest`` (default), ``eager`` or ``off``."""

HEAP_POLICIES: Final = ("rest", "eager", "off")
"""The policies :data:`HEAP_ENV` accepts."""

REST_S: Final = 5.0
"""How long a process stays under 5 % of one CPU before it counts as at rest.

Longer than one stage call usually takes: in a pipeline, a stage's worker (and the
controller) wait while the other stages compute, and a request that resumes after a
give-back pays for the pages it touches again."""

LEAN_THRESHOLD_BYTES: Final = 256 * 1024
"""``eager``: blocks at least this large are mapped on their own and unmapped when freed."""

LEAN_TUNABLES: Final = (f"glibc.malloc.mmap_threshold={LEAN_THRESHOLD_BYTES}:"
                        f"glibc.malloc.trim_threshold={LEAN_THRESHOLD_BYTES}:"
                        "glibc.malloc.hugetlb=1")
"""``GLIBC_TUNABLES`` for a process started with the ``eager`` heap: the two thresholds,
and transparent huge pages for the blocks mapped on their own (fewer page faults per
fresh block; no effect where the kernel's THP mode is ``never``)."""

_REST_CPU: Final = 0.05  # of one CPU: below it, a poll interval counts as quiet
_POLL_S: Final = 0.25
_M_TRIM_THRESHOLD: Final = -1  # glibc's malloc.h
_M_MMAP_THRESHOLD: Final = -3
_M_ARENA_MAX: Final = -8

_lock = threading.Lock()
_applied: dict[str, object] | None = None
_callbacks: list[Callable[[], None]] = []
_watcher: _RestWatcher | None = None


def heap_policy(environ: Mapping[str, str] | None = None) -> str:
    """The policy :data:`HEAP_ENV` names (``rest`` when unset or not one of the three).

    :func:`unknown_heap_policy` tells a value that names no policy apart from unset.
    """
    raw = (os.environ if environ is None else environ).get(HEAP_ENV, "").strip().lower()
    return raw if raw in HEAP_POLICIES else "rest"


def unknown_heap_policy(environ: Mapping[str, str] | None = None) -> str | None:
    """The value of :data:`HEAP_ENV` when it names no policy, else ``None``.

    Unset or empty means ``rest``; case and surrounding spaces do not matter. A process
    that opens pipelines (the controller) refuses such a value before anything starts;
    :func:`heap_policy` alone reads it as ``rest`` (a worker never refuses to start).
    """
    raw = (os.environ if environ is None else environ).get(HEAP_ENV, "")
    return raw if raw.strip() and raw.strip().lower() not in HEAP_POLICIES else None


def eager_process_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Variables that give a new process the ``eager`` heap from its first allocation.

    ``{"GLIBC_TUNABLES": LEAN_TUNABLES}`` under the ``eager`` policy, else nothing. A
    backend sets them for its worker processes (glibc reads them at start only; other C
    libraries ignore them).
    """
    return {"GLIBC_TUNABLES": LEAN_TUNABLES} if heap_policy(environ) == "eager" else {}


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


class _RestWatcher:
    """A daemon thread: once the process rests, give memory back (once per busy spell)."""

    def __init__(self, trim: Callable[[], object] | None) -> None:
        self.trim = trim
        self.rests = 0
        self._thread = threading.Thread(target=self._run, name="edge-heap-rest", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        busy = False
        quiet_since = time.monotonic()
        before = time.process_time()
        own = 0.0  # CPU spent giving memory back: not work that makes the process busy
        while True:
            time.sleep(_POLL_S)
            now, used = time.monotonic(), time.process_time()
            worked = used - before - own
            before, own = used, 0.0
            if worked > _REST_CPU * _POLL_S:
                busy, quiet_since = True, now
                continue
            if busy and now - quiet_since >= REST_S:
                started = time.process_time()  # its runtime's threads included
                self.give_back()
                own = time.process_time() - started
                busy = False

    def give_back(self) -> None:
        """Run the registered callbacks, then trim every heap."""
        with _lock:
            callbacks = list(_callbacks)
        for callback in callbacks:
            try:
                callback()
            except Exception:  # one failing callback keeps neither the others nor the trim
                import traceback  # only here: traceback (and linecache, tokenize) is not
                # on every worker's way to its hello

                traceback.print_exc()
        if self.trim is not None:
            self.trim()
        self.rests += 1


def on_rest(callback: Callable[[], None]) -> None:
    """Call ``callback`` (from the watcher thread) each time the process comes to rest.

    Only under the ``rest`` policy, once :func:`apply_heap_policy` has started the
    watcher; the callback must be safe to run while another thread may start work.
    """
    with _lock:
        _callbacks.append(callback)


def rests() -> int:
    """How many times this process has given memory back at rest so far."""
    return _watcher.rests if _watcher is not None else 0


def apply_heap_policy(environ: Mapping[str, str] | None = None) -> dict[str, object]:
    """Apply the policy :data:`HEAP_ENV` names to this process, once; what was done.

    Returns ``{"policy", "allocator", "applied"}`` plus ``rest_s`` and ``arenas``
    (``rest``),
    ``threshold_bytes`` (``eager``) and ``tunables`` (a process started with
    ``GLIBC_TUNABLES``). Idempotent: a later call returns the first call's answer.
    """
    global _applied, _watcher
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
        if policy == "eager" and libc is not None:
            import ctypes

            mallopt = libc.mallopt
            mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
            answer["applied"] = (mallopt(_M_MMAP_THRESHOLD, LEAN_THRESHOLD_BYTES) == 1
                                 and mallopt(_M_TRIM_THRESHOLD, LEAN_THRESHOLD_BYTES) == 1)
            answer["threshold_bytes"] = LEAN_THRESHOLD_BYTES
        elif policy == "rest":
            trim: Callable[[], object] | None = None
            if libc is not None:
                import ctypes

                libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
                answer["arenas"] = 1 if libc.mallopt(_M_ARENA_MAX, 1) == 1 else None
                malloc_trim = libc.malloc_trim
                malloc_trim.argtypes = (ctypes.c_size_t,)
                trim = lambda: malloc_trim(0)  # noqa: E731 - every heap, every free page
            _watcher = _RestWatcher(trim)
            answer["applied"] = True
            answer["rest_s"] = REST_S
        if os.environ.get("GLIBC_TUNABLES"):
            answer["tunables"] = os.environ["GLIBC_TUNABLES"]
        _applied = answer
        return dict(answer)
