"""Huge pages under shared-memory files: what the kernel holds, read from this process's own maps.

Whether a file's pages are huge folios is read without privileges from
``/proc/self/smaps``: a mapping of the file at an address aligned to the huge-page size
shows its huge folios as ``ShmemPmdMapped`` (ordinary pages never do), so each test
counts only the mapping it made itself.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import socket
from collections.abc import Iterator

import pytest

from edge_contracts.hugepages import HUGE_ENV, back_with_huge_pages, huge_page_bytes
from edge_contracts.sealed import SEALS_AVAILABLE, FdChannel
from edge_contracts.shm import HEADER_BYTES, Segment, SegmentProducer, new_prefix, sweep

HUGE = huge_page_bytes()
_SHMEM_ENABLED = "/sys/kernel/mm/transparent_hugepage/shmem_enabled"


def _kernel_collapses() -> bool:
    """Linux 6.1 or later with transparent huge pages, and shared ones not denied."""
    release = platform.release().split(".")
    try:
        version = (int(release[0]), int(release[1].split("-")[0]))
    except (IndexError, ValueError):
        return False
    try:
        with open(_SHMEM_ENABLED) as setting:
            denied = "[deny]" in setting.read()
    except OSError:
        return False
    return HUGE > 0 and version >= (6, 1) and not denied


pytestmark = pytest.mark.skipif(
    not _kernel_collapses(), reason="needs Linux 6.1+ with transparent huge pages for shmem")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]


def pmd_mapped_bytes(fd: int, size: int) -> int:
    """Bytes of ``fd``'s first ``size`` that a huge-aligned read-only mapping maps as huge pages."""
    reserved = _libc.mmap(None, size + HUGE, 0, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    assert reserved not in (None, ctypes.c_void_p(-1).value)
    try:
        aligned = -(-reserved // HUGE) * HUGE
        mapped = _libc.mmap(aligned, size, mmap.PROT_READ,
                            mmap.MAP_SHARED | 0x10 | mmap.MAP_POPULATE, fd, 0)  # MAP_FIXED
        assert mapped == aligned
        with open("/proc/self/smaps") as smaps:
            text = smaps.read()
        block = text[text.index(f"{aligned:x}-"):]
        line = next(row for row in block.splitlines() if row.startswith("ShmemPmdMapped:"))
        return int(line.split()[1]) * 1024
    finally:
        _libc.munmap(reserved, size + HUGE)


@pytest.fixture
def memfd() -> Iterator[int]:
    fd = os.memfd_create("edge_test_huge", os.MFD_CLOEXEC)
    yield fd
    os.close(fd)


def test_every_whole_huge_page_becomes_one_and_the_file_reads_zeros(memfd):
    size = 2 * HUGE + 3 * mmap.PAGESIZE
    os.ftruncate(memfd, size)
    assert back_with_huge_pages(memfd, size) is True
    assert os.fstat(memfd).st_size == size  # nothing grew or shrank
    assert pmd_mapped_bytes(memfd, size) == 2 * HUGE  # the tail keeps ordinary pages
    with mmap.mmap(memfd, size, flags=mmap.MAP_SHARED) as mapping:
        assert mapping[:] == bytes(size)  # a new folio is cleared, the holes read as zeros
        mapping[size - 1 : size] = b"\x01"  # and the file stays writable through any mapping
        assert mapping[size - 1] == 1


def test_turned_off_the_file_keeps_ordinary_pages_and_no_page_is_allocated(memfd, monkeypatch):
    monkeypatch.setenv(HUGE_ENV, "0")
    size = 2 * HUGE
    os.ftruncate(memfd, size)
    assert back_with_huge_pages(memfd, size) is False
    assert os.fstat(memfd).st_blocks == 0
    assert pmd_mapped_bytes(memfd, size) == 0


def test_a_file_smaller_than_a_huge_page_is_left_alone(memfd):
    size = HUGE - mmap.PAGESIZE
    os.ftruncate(memfd, size)
    assert back_with_huge_pages(memfd, size) is False
    assert os.fstat(memfd).st_blocks == 0


def test_a_file_that_cannot_be_written_is_refused_quietly(tmp_path):
    path = tmp_path / "readonly"
    path.write_bytes(bytes(2 * HUGE))
    fd = os.open(path, os.O_RDONLY)
    try:
        assert back_with_huge_pages(fd, 2 * HUGE) is False
    finally:
        os.close(fd)


def test_a_named_segment_lies_in_huge_pages():
    prefix = new_prefix()
    name = f"edge_{prefix}_{os.urandom(8).hex()}"
    segment = Segment.create(name, 2 * HUGE)
    try:
        fd = os.open(f"/dev/shm/{name}", os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            assert size == HEADER_BYTES + 2 * HUGE
            assert pmd_mapped_bytes(fd, size) == 2 * HUGE
        finally:
            os.close(fd)
    finally:
        segment.close()
        assert sweep(prefix) == [name]


@pytest.mark.skipif(not SEALS_AVAILABLE, reason="memfd seals are Linux only")
def test_a_sealed_segment_lies_in_huge_pages_and_stays_sealed():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    left, right = FdChannel(a.detach()), FdChannel(b.detach())
    producer = SegmentProducer(new_prefix(), channel=left)
    try:
        lease = producer.lease(2 * HUGE)
        fd = right.take(lease.segment)
        assert fd is not None
        try:
            size = os.fstat(fd).st_size
            assert pmd_mapped_bytes(fd, size) == 2 * HUGE
            with pytest.raises(PermissionError):  # the seals went on after the collapse
                os.ftruncate(fd, size // 2)
        finally:
            os.close(fd)
    finally:
        producer.close()
        left.close()
        right.close()
