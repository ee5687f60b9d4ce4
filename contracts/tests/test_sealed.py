"""Sealed memfd segments and their descriptor channel, between two ends of a socketpair."""

from __future__ import annotations

import mmap
import os
import socket
import struct
from collections.abc import Iterator

import pytest

from edge_contracts.sealed import SEALS_AVAILABLE, FdChannel, held_sealed_names
from edge_contracts.shm import (
    HEADER_BYTES,
    SegmentConsumer,
    SegmentProducer,
    ShmRefused,
    new_prefix,
    segment_names,
)

pytestmark = pytest.mark.skipif(not SEALS_AVAILABLE, reason="memfd seals are Linux only")


@pytest.fixture
def ends() -> Iterator[tuple[FdChannel, FdChannel]]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    left, right = FdChannel(a.detach()), FdChannel(b.detach())
    yield left, right
    left.close()
    right.close()


def _fd_of(name: str) -> int:
    for entry in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{entry}").startswith(f"/memfd:{name}"):
                return os.open(f"/proc/self/fd/{entry}", os.O_RDWR)
        except OSError:
            continue
    raise FileNotFoundError(name)


def test_a_sealed_segment_travels_by_descriptor_and_cannot_change_size(ends):
    left, right = ends
    prefix = new_prefix()
    producer = SegmentProducer(prefix, channel=left)
    consumer = SegmentConsumer(prefix, channel=right)
    try:
        lease = producer.lease(10_000)
        lease.view[:5] = b"hello"
        assert segment_names(prefix) == []  # nothing named in /dev/shm
        assert held_sealed_names(prefix) == [lease.segment]  # held by this process
        view = consumer.view(lease.segment, lease.offset, lease.generation, 5)
        assert bytes(view) == b"hello"
        del view
        fd = _fd_of(lease.segment)
        try:
            with pytest.raises(PermissionError):
                os.ftruncate(fd, 0)
            with pytest.raises(PermissionError):
                os.ftruncate(fd, 1 << 30)
        finally:
            os.close(fd)
        del lease  # its view pins the producer's mapping
    finally:
        producer.close()
        consumer.close()
    assert held_sealed_names(prefix) == []  # gone with its last holder


def test_an_unsealed_memfd_is_refused_before_it_is_mapped(ends):
    left, right = ends
    prefix = new_prefix()
    name = f"edge_{prefix}_{os.urandom(8).hex()}"
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, HEADER_BYTES + 4096)
        with mmap.mmap(fd, HEADER_BYTES) as header:
            struct.pack_into("<8sQ", header, 0, b"EDGESHM1", 1)
        left.send(name, fd)
    finally:
        os.close(fd)
    consumer = SegmentConsumer(prefix, channel=right)
    try:
        with pytest.raises(ShmRefused, match="not sealed against shrinking"):
            consumer.view(name, HEADER_BYTES, 1, 10)
        with pytest.raises(ShmRefused, match="no sealed segment was sent"):
            consumer.view(f"edge_{prefix}_{os.urandom(8).hex()}", HEADER_BYTES, 1, 10)
    finally:
        consumer.close()


def test_descriptors_of_dropped_segments_are_closed(ends):
    left, right = ends
    prefix = new_prefix()
    producer = SegmentProducer(prefix, channel=left, max_buffers=1)
    consumer = SegmentConsumer(prefix, channel=right)
    try:
        first = producer.lease(100).segment
        producer.release(first, 1, unlink=True)  # dropped before the consumer mapped it
        consumer.forget(producer.take_gone())
        assert right.take(first) is None  # its descriptor was closed, not kept
    finally:
        producer.close()
        consumer.close()


def test_a_peer_that_takes_no_descriptors_gets_a_typed_refusal_not_a_hang(ends, monkeypatch):
    import edge_contracts.sealed as sealed
    from edge_contracts.shm import ShmCapExceeded

    monkeypatch.setattr(sealed, "SEND_TIMEOUT_S", 0.2)
    left, _ = ends
    producer = SegmentProducer(new_prefix(), channel=left, max_buffers=100_000,
                               max_bytes=1 << 40)


    def fill() -> None:
        for _ in range(100_000):  # the channel fills: nobody receives
            producer.lease(1)

    try:
        with pytest.raises(ShmCapExceeded, match="descriptor not sent"):
            fill()
    finally:
        producer.close()
