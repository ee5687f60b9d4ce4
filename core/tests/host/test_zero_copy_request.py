"""A zero-copy request read on the worker's usual path still gets every check of the general path.

A real worker (``CountingInPlace``) serves requests whose input is an input buffer sent
by reference. After the first, the worker serves each such request from a kept template
(``edge_contracts.worker_kept``: equal to a checked one but for its request id and its
reference's generation), mapping its input through the consumer's own checks. Here the
bytes of one request are changed as the client writes them, as a faulty controller would
have sent them: a stale generation, a segment of another name and an offset out of the
segment's range are refused as the general path refuses them (the request ends with a
``ShmRefused`` error naming the check, before any byte of the segment is read), and the
worker serves the next request on the usual path again.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from edge_contracts.binary_header import BINARY_MAGIC
from edge_contracts.requests import Operation, StageRequest
from edge_core.host import WorkerClient

SHAPE = (64, 64)  # float32: 16 KiB, over the threshold below
THRESHOLD = 4096
_RUN_AT = 16 + 2  # a binary frame's op code, after its prefix and version
_RUN_CODE = 1


class Rewriting:
    """The client's socket: the next request frame with a reference is changed first."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.change: Callable[[bytearray], None] | None = None

    def sendmsg(self, parts: list[Any]) -> int:
        data = bytearray(b"".join(bytes(memoryview(part).cast("B")) for part in parts))
        if (self.change is not None and data[:4] == BINARY_MAGIC
                and data[_RUN_AT] == _RUN_CODE and b"edge_" in data):
            self.change(data)
            self.change = None
        self.sock.sendall(data)
        return len(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


def _ref_at(frame: bytearray) -> int:
    """Where the input's segment name begins (its offset and generation: the 16 bytes before)."""
    return frame.index(b"edge_")


Started = tuple[WorkerClient, Rewriting, Callable[[int], Any]]


@pytest.fixture
def zero_copy(start: Callable[..., WorkerClient]) -> Iterator[Started]:
    client = start("counting_in_place", spin_us=0, shm_threshold=THRESHOLD)
    sock = Rewriting(client._sock)
    client._sock = sock  # type: ignore[assignment]
    held = [client.input_buffer(SHAPE, np.float32)]  # dropped at the end (its segment)

    def call(i: int) -> Any:
        """The output's first value, or the request's error."""
        if not held[0].flags.writeable:  # still held: acknowledged under another reference
            held[0] = client.input_buffer(SHAPE, np.float32)
        held[0][...] = i
        request = StageRequest(f"r{i:03}", "s0", 0, client.generation, Operation.RUN)
        with client.submit(request, {"x": held[0]}).next(timeout=10) as delivery:
            assert delivery.terminal, delivery
            if delivery.error is not None:
                return delivery.error
            assert delivery.retained, delivery  # the output by reference
            return float(delivery.arrays["y"][0, 0])

    for i in range(5):  # the request kept after the first, later ones served from it
        assert call(i) == float(i)
    yield client, sock, call
    held.clear()


def _refused(client: WorkerClient, call: Callable[[int], Any], field: str,
             why: str) -> None:
    error = call(99)
    assert error.type == "ShmRefused" and error.detail is not None, error
    assert error.detail.field == field and why in error.detail.reason, error
    assert client.health().state == "ready"
    for i in (100, 101):  # served again (the usual path: the template is still kept)
        assert call(i) == float(i)


def test_a_stale_generation_in_a_usual_request_is_refused(zero_copy: Started) -> None:
    client, sock, call = zero_copy

    def stale(frame: bytearray) -> None:
        at = _ref_at(frame) - 8
        (generation,) = struct.unpack_from("<Q", frame, at)
        struct.pack_into("<Q", frame, at, generation - 1)

    sock.change = stale
    _refused(client, call, "shm.generation", "stale")


def test_a_segment_of_another_name_in_a_usual_request_is_refused(zero_copy: Started) -> None:
    client, sock, call = zero_copy

    def other(frame: bytearray) -> None:
        last = _ref_at(frame) + len("edge_") + 8 + 16  # the name's last character
        frame[last] = ord("0") if frame[last] != ord("0") else ord("1")

    sock.change = other
    # (sealed segments: the name was never sent; named ones: no such segment)
    _refused(client, call, "shm.segment", "segment")


def test_an_offset_out_of_range_in_a_usual_request_is_refused(zero_copy: Started) -> None:
    client, sock, call = zero_copy

    def header_page(frame: bytearray) -> None:
        struct.pack_into("<Q", frame, _ref_at(frame) - 16, 0)  # the segment's header page

    sock.change = header_page
    _refused(client, call, "shm.offset", "must lie in")
