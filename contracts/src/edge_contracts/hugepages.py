"""Huge pages under a shared-memory file: a large segment in physically contiguous memory.

Standard library only (:mod:`ctypes` for ``mmap``/``madvise`` at a chosen address).

Anonymous memory of a process gets transparent huge pages where the system allows them
(numpy asks for them for every large array), but shared memory (``/dev/shm``, memfd) gets
them only where ``/sys/kernel/mm/transparent_hugepage/shmem_enabled`` says so, and most
distributions leave that at ``never``. A 64 MiB segment is then 16,384 pages of 4 KiB
wherever the page allocator found them; on a virtual machine a tensor whose pages are
scattered over thousands of 2 MiB physical regions reads and writes measurably slower
than the same tensor in a few dozen (the figures are in benchmarks/RESULTS.md,
``ort_call``: the zero-copy call's input and output lie in segments, the plain session's
in numpy's memory), because each page's translation misses the host's page-walk caches.

``MADV_COLLAPSE`` (Linux 6.1) asks the kernel to move a range's pages into huge pages at
once, whatever the sysfs setting, unless an administrator denied huge pages outright
(``shmem_enabled`` set to ``deny``, or this process's ``PR_SET_THP_DISABLE``). It acts on
a mapping whose addresses are aligned with the file's offsets to the huge-page size, which
Python's :class:`mmap.mmap` cannot ask for, so :func:`back_with_huge_pages` maps the file
once more through libc at an aligned address, collapses it and unmaps it: the file's pages
are then huge folios, and every later mapping of it (the creator's, the peer's) reads
physically contiguous memory, PMD-mapped or not. Done on a new, empty file it also costs
less than allocating its ordinary pages one by one: the kernel clears one huge folio per
range instead of faulting in 512 pages.

It is an optimisation only: wherever it cannot happen (not Linux, an older kernel, no
huge page free, huge pages denied) the segment keeps its ordinary pages and nothing else
changes. :data:`HUGE_ENV` set to ``0`` turns it off.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
from functools import cache

__all__ = ["HUGE_ENV", "MADV_COLLAPSE", "MADV_HUGEPAGE", "back_with_huge_pages", "huge_page_bytes"]

HUGE_ENV = "EDGE_SHM_HUGE"
"""Environment variable: ``0`` keeps every segment on ordinary pages (default: huge pages
for every whole huge page a segment spans, where the kernel allows it)."""

MADV_HUGEPAGE = 14
"""``madvise`` advice: the range may use transparent huge pages (Linux)."""

MADV_COLLAPSE = 25
"""``madvise`` advice: collapse the range's pages into huge pages now (Linux 6.1)."""

_PMD_SIZE = "/sys/kernel/mm/transparent_hugepage/hpage_pmd_size"  # no pathlib: worker start-up
_MAP_FIXED = 0x10  # Linux's value on every architecture but Alpha and PA-RISC
_PROT_NONE = 0


@cache
def huge_page_bytes() -> int:
    """The size of a transparent huge page here, or 0 where there are none (not Linux, no THP)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        with open(_PMD_SIZE, encoding="ascii") as handle:
            return int(handle.read().strip())
    except (OSError, ValueError):
        return 0


class _Libc:
    """The three libc calls :func:`back_with_huge_pages` needs, typed for ctypes."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self.mmap = libc.mmap
        self.mmap.restype = ctypes.c_void_p
        self.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_long]
        self.munmap = libc.munmap
        self.munmap.restype = ctypes.c_int
        self.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        self.madvise = libc.madvise
        self.madvise.restype = ctypes.c_int
        self.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


@cache
def _libc() -> _Libc | None:
    try:
        return _Libc()
    except (OSError, AttributeError):
        return None


_FAILED = ctypes.c_void_p(-1).value


def back_with_huge_pages(fd: int, size: int) -> bool:
    """Put each whole huge page of the shared-memory file ``fd``'s first ``size`` bytes in a folio.

    The file must be open read-write, ``size`` bytes long and not yet written: one ordinary
    page is allocated at the start of each huge page's range and the range is collapsed,
    which the kernel does by clearing a new huge folio (the file still reads as zeros),
    so no data is copied. The tail shorter than a huge page, and every range the kernel
    would not collapse, keep ordinary pages, which the caller's ``MAP_POPULATE``
    allocates as it would without this. Returns True when every whole huge page was
    collapsed, False when the file keeps ordinary pages, all or some (turned off by
    :data:`HUGE_ENV`, smaller than a huge page, or refused by the kernel: never an error).
    """
    huge = huge_page_bytes()
    span = size // huge * huge if huge else 0
    if span == 0 or os.environ.get(HUGE_ENV, "1") == "0":
        return False
    libc = _libc()
    if libc is None:
        return False
    try:
        for offset in range(0, span, huge):  # a page in each range: an empty one is refused
            os.posix_fallocate(fd, offset, mmap.PAGESIZE)
    except OSError:
        return False
    reserved = libc.mmap(None, span + huge, _PROT_NONE,
                         mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)  # PROT_NONE: not charged
    if reserved in (None, _FAILED):
        return False
    try:
        aligned = -(-reserved // huge) * huge
        # MADV_COLLAPSE acts only where a mapping's addresses and the file's offsets are
        # aligned alike: this one, over the reservation, maps offset 0 at a huge boundary
        mapped = libc.mmap(aligned, span, mmap.PROT_READ | mmap.PROT_WRITE,
                           mmap.MAP_SHARED | _MAP_FIXED, fd, 0)
        if mapped != aligned:  # not placed there: never leave a stray mapping of the file
            if mapped not in (None, _FAILED):
                libc.munmap(mapped, span)
            return False
        advised: int = libc.madvise(aligned, span, MADV_HUGEPAGE)
        collapsed: int = libc.madvise(aligned, span, MADV_COLLAPSE) if advised == 0 else -1
        return collapsed == 0
    finally:
        libc.munmap(reserved, span + huge)
