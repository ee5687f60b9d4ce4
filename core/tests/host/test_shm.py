"""Shared-memory segments: permissions, retention by generation, caps, no resource tracker."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import numpy as np
import pytest

from edge_contracts.shm import (
    DEFAULT_MAX_BUFFERS,
    DEFAULT_MAX_BYTES,
    SegmentConsumer,
    SegmentProducer,
    ShmCapExceeded,
    ShmRefused,
    new_prefix,
    retained_cap_for,
    segment_names,
    sweep,
)

MIB = 1024 * 1024


@pytest.fixture
def producer():
    p = SegmentProducer(new_prefix(), max_bytes=4 * MIB, max_buffers=4)
    yield p
    p.close()


def test_segments_are_private_and_unguessably_named(producer):
    a = producer.lease(1000)
    b = producer.lease(1000)
    mode = os.stat(f"/dev/shm/{a.segment}").st_mode
    assert stat.S_IMODE(mode) == 0o600
    assert a.segment != b.segment
    assert a.segment.startswith(f"edge_{producer.prefix}_")
    assert len(a.segment.rsplit("_", 1)[1]) == 16


def test_consumer_sees_producer_bytes_read_only(producer):
    consumer = SegmentConsumer(producer.prefix)
    try:
        lease = producer.lease(16)
        lease.view[:] = bytes(range(16))
        view = consumer.view(lease.segment, lease.offset, lease.generation, 16)
        assert bytes(view) == bytes(range(16))
        assert view.readonly
        del view
    finally:
        consumer.close()


def test_stale_acknowledgement_frees_nothing(producer):
    lease = producer.lease(1000)
    assert not producer.release(lease.segment, lease.generation + 1)
    assert producer.retained_buffers == 1
    assert producer.release(lease.segment, lease.generation)
    assert producer.retained_buffers == 0
    assert not producer.release(lease.segment, lease.generation)


def test_released_segment_is_reused_under_a_new_generation(producer):
    first = producer.lease(1000)
    producer.release(first.segment, first.generation)
    second = producer.lease(900)
    assert second.segment == first.segment
    assert second.generation > first.generation


def test_consumer_refuses_a_stale_generation_and_foreign_names(producer):
    consumer = SegmentConsumer(producer.prefix)
    try:
        old = producer.lease(64)
        producer.release(old.segment, old.generation)
        new = producer.lease(64)
        with pytest.raises(ShmRefused, match="generation"):
            consumer.view(old.segment, old.offset, old.generation, 64)
        with pytest.raises(ShmRefused, match="range"):
            consumer.view(new.segment, new.offset, new.generation, 10 * MIB)
        other = f"edge_{new_prefix()}_{'0' * 16}"
        with pytest.raises(ShmRefused, match="belong"):
            consumer.view(other, 4096, 1, 8)
    finally:
        consumer.close()


def test_byte_cap_is_a_typed_error_and_leaves_state_intact(producer):
    producer.lease(3 * MIB)
    with pytest.raises(ShmCapExceeded, match=r"shm.retained_bytes: exceeds .* 4194304"):
        producer.lease(2 * MIB)
    assert producer.retained_buffers == 1


def test_buffer_cap_is_a_typed_error(producer):
    for _ in range(4):
        producer.lease(10)
    with pytest.raises(ShmCapExceeded, match=r"shm\.retained_buffers"):
        producer.lease(10)


def test_pooled_segments_are_evicted_to_make_room(producer):
    leases = [producer.lease(MIB) for _ in range(4)]
    for lease in leases:
        producer.release(lease.segment, lease.generation)
    big = producer.lease(3 * MIB)
    assert producer.held_bytes <= 4 * MIB
    gone = producer.take_gone()
    assert len(gone) == 3
    assert big.segment not in gone
    kept = {lease.segment for lease in leases if lease.segment not in gone}
    assert set(segment_names(producer.prefix)) == {big.segment, *kept}


def test_close_unlinks_leased_and_pooled_segments():
    producer = SegmentProducer(new_prefix())
    a = producer.lease(100)
    producer.release(a.segment, a.generation)
    producer.lease(100)
    producer.lease(5000)
    assert len(segment_names(producer.prefix)) == 2
    producer.close()
    producer.close()
    assert segment_names(producer.prefix) == []


def test_sweep_removes_what_a_killed_producer_left():
    prefix = new_prefix()
    code = (
        "import os, sys; from edge_contracts.shm import SegmentProducer as P\n"
        f"p = P({prefix!r}); p.lease(100); p.lease(200); print('ok', flush=True); os._exit(0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"
    assert len(segment_names(prefix)) == 2
    assert len(sweep(prefix)) == 2
    assert segment_names(prefix) == []


def test_peer_processes_share_segments_without_resource_tracker_noise(producer):
    lease = producer.lease(8 * 4)
    np.frombuffer(lease.view, dtype=np.float32)[:] = np.arange(8, dtype=np.float32)
    code = (
        "import sys; import numpy as np; from edge_contracts.shm import SegmentConsumer as C\n"
        f"c = C({producer.prefix!r})\n"
        f"v = c.view({lease.segment!r}, {lease.offset}, {lease.generation}, 32)\n"
        "print(np.frombuffer(v, dtype=np.float32).sum()); del v; c.close()"
    )
    out = subprocess.run(
        [sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "28.0"
    assert out.stderr == ""
    assert lease.segment in segment_names(producer.prefix), "the consumer unlinked it early"


@pytest.mark.parametrize("max_io_bytes", [1, 64 * MIB, 96 * MIB + 12345])
@pytest.mark.parametrize("buffers", [1, 7, DEFAULT_MAX_BUFFERS])
def test_the_cap_for_a_frame_holds_any_frame_of_that_size(max_io_bytes, buffers):
    """``buffers`` segments of odd sizes, ``max_io_bytes`` in all, lease under the cap."""
    cap = retained_cap_for(max_io_bytes)
    assert cap >= DEFAULT_MAX_BYTES
    sizes = [max(1, max_io_bytes // buffers + 1)] * (buffers - 1)  # odd sizes, rounded up
    sizes = [size for size in sizes if size < max_io_bytes][: max(0, buffers - 1)]
    if sum(sizes) < max_io_bytes:
        sizes.append(max_io_bytes - sum(sizes))
    assert sum(sizes) <= max_io_bytes
    producer = SegmentProducer(new_prefix(), max_bytes=cap, max_buffers=DEFAULT_MAX_BUFFERS)
    try:
        leases = [producer.lease(size) for size in sizes]
        assert len(leases) == len(sizes)
    finally:
        producer.close()


def test_a_cap_of_exactly_the_frame_size_is_not_enough_for_odd_arrays():
    """Why the cap adds a page per segment: capacities are whole pages."""
    sizes = [4 * MIB + 1] * 15 + [4 * MIB - 15]  # 64 MiB in all
    assert sum(sizes) == 64 * MIB
    producer = SegmentProducer(new_prefix(), max_bytes=64 * MIB)
    try:
        for size in sizes[:-1]:
            producer.lease(size)
        with pytest.raises(ShmCapExceeded, match="retained_bytes"):
            producer.lease(sizes[-1])
    finally:
        producer.close()
    producer = SegmentProducer(new_prefix(), max_bytes=retained_cap_for(64 * MIB))
    try:
        for size in sizes:
            producer.lease(size)
    finally:
        producer.close()
