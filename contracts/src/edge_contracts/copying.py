"""Copying large tensors into shared memory with a few threads.

One thread copying memory does not use all of a machine's memory bandwidth: on the
2-vCPU development machine two threads copy 64 MiB in 3.8 to 4.6 ms where ``np.copyto``
alone takes 5.3 to 5.5 ms (``benchmarks/copying.py``). numpy releases the GIL
while it copies, so :func:`copy_bytes` splits a large copy into contiguous chunks:
the calling thread copies the first, helper threads the others, and it returns when
all are done.

Helpers are daemon threads started on first use, one fewer than the chunk count; a
process that forked after they started gets fresh ones. ``EDGE_COPY_THREADS`` sets the
chunk count (default: the usable CPUs, at most 4; ``1`` copies on the calling thread
only). Copies below :data:`PARALLEL_MIN_BYTES` always stay on the calling thread, where a
hand-off would cost more than it saves. Standard library and numpy only.
"""

from __future__ import annotations

import os
import queue
import threading
from typing import Any

import numpy as np

from edge_contracts.copy_env import COPY_THREADS_ENV

__all__ = ["COPY_THREADS_ENV", "PARALLEL_MIN_BYTES", "copy_bytes", "copy_threads", "owned_copy"]

PARALLEL_MIN_BYTES = 32 * 1024 * 1024
"""Copies smaller than this run on the calling thread only.

Measured here with ``benchmarks/copying.py`` (2 vCPUs, two threads vs one): below
~16 MiB source and destination stay in the caches and one thread is faster (4 MiB:
114 µs shared vs 88 µs alone); 16 MiB is even (751 vs 735 µs); from 32 MiB sharing
pays (2.24 vs 2.45 ms; 64 MiB: 3.8 to 4.6 vs 5.3 to 5.5 ms).
"""

_MAX_THREADS = 4
_ALIGN = 4096  # chunk boundaries on page boundaries


def copy_threads() -> int:
    """How many threads share a large copy here (:data:`COPY_THREADS_ENV` or the CPUs)."""
    raw = os.environ.get(COPY_THREADS_ENV, "").strip()
    if raw.isdigit() and int(raw) > 0:
        return min(int(raw), 64)
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        usable = os.cpu_count() or 1
    return max(1, min(usable, _MAX_THREADS))


class _Helpers:
    """Daemon threads that each copy one chunk per job (one set per process)."""

    def __init__(self, count: int) -> None:
        self.pid = os.getpid()
        self.count = count
        self.jobs: queue.SimpleQueue[tuple[Any, Any, queue.SimpleQueue[BaseException | None]]]
        self.jobs = queue.SimpleQueue()
        for index in range(count):
            threading.Thread(target=self._run, name=f"edge-copy-{index}", daemon=True).start()

    def _run(self) -> None:
        while True:
            dst, src, done = self.jobs.get()
            failure: BaseException | None = None
            try:
                np.copyto(dst, src)
            except BaseException as exc:  # handed to the waiting caller
                failure = exc
            # Drop the views before answering: an idle helper must not keep a segment's
            # mapping (and its descriptor) alive after the caller has let go of it.
            del dst, src
            done.put(failure)
            del failure, done


_lock = threading.Lock()
_helpers: _Helpers | None = None


def _get_helpers(count: int) -> _Helpers:
    global _helpers
    with _lock:
        if _helpers is None or _helpers.pid != os.getpid() or _helpers.count < count:
            _helpers = _Helpers(count)  # after a fork the old threads do not exist here
        return _helpers


def copy_bytes(dst: np.ndarray[Any, Any], src: np.ndarray[Any, Any]) -> None:
    """Copy ``src`` into ``dst``: two 1-D ``uint8`` arrays of one length, C-contiguous.

    Large copies are shared between the calling thread and helper threads; the copy is
    complete when this returns, and an error in any chunk is raised here.
    """
    if dst.shape != src.shape or dst.ndim != 1 or dst.dtype != np.uint8 or src.dtype != np.uint8:
        raise ValueError(f"copy_bytes: needs two uint8 vectors of one length: "
                         f"{dst.dtype}{dst.shape} <- {src.dtype}{src.shape}")
    nbytes = dst.shape[0]
    threads = copy_threads() if nbytes >= PARALLEL_MIN_BYTES else 1
    if threads == 1:
        np.copyto(dst, src)
        return
    step = -(-nbytes // threads // _ALIGN) * _ALIGN
    bounds = [(start, min(start + step, nbytes)) for start in range(0, nbytes, step)]
    helpers = _get_helpers(len(bounds) - 1)
    done: queue.SimpleQueue[BaseException | None] = queue.SimpleQueue()
    for start, end in bounds[1:]:
        helpers.jobs.put((dst[start:end], src[start:end], done))
    first: BaseException | None = None
    try:
        start, end = bounds[0]
        np.copyto(dst[start:end], src[start:end])
    except BaseException as exc:  # still wait for the helpers: they write into dst
        first = exc
    for _ in bounds[1:]:
        failure = done.get()
        if first is None and failure is not None:
            first = failure
    if first is not None:
        raise first


def owned_copy(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Return a writable copy of ``array`` that owns its memory (large ones shared out).

    Same result as ``np.array(array, copy=True)`` for a C-contiguous array, copied with
    :func:`copy_bytes`; any other layout is copied by numpy.
    """
    if array.nbytes < PARALLEL_MIN_BYTES or not array.flags.c_contiguous or array.dtype.hasobject:
        return np.array(array, copy=True)
    out = np.empty(array.shape, array.dtype)
    copy_bytes(out.reshape(-1).view(np.uint8), array.reshape(-1).view(np.uint8))
    return out
