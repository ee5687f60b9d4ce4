"""Output tensors over max_io_bytes fail their request, not the channel.

The controller's reader refuses a frame whose tensors (inline and shared memory together)
are more than the channel's ``max_io_bytes`` as a protocol violation: the channel would be
lost for every request on it. The worker adds up each event's output tensors once they are
packed and, before anything is written, ends the request with an ``EventTooLarge`` ERROR
instead (naming ``event.outputs``, the largest output and both sizes); its shared-memory
leases are taken back, its inputs acknowledged, and the same client serves the next
request. An output over the worker's shared-memory cap (``shm_max_bytes``) fails its
request with ``ShmCapExceeded`` the same way. Handler: ``big_outputs`` in
``workers/edge_test_workers.py``; the autouse leak check fails a test that leaves a
process, segment or descriptor behind.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from edge_contracts.protocol import FEATURE_BINARY_HEADER, KNOWN_FEATURES
from edge_contracts.requests import EventKind, Operation
from edge_core.host import WorkerClient, bootstrap

from .conftest import refused, request

LIMIT = 16 * 1024  # the channel's max_io_bytes in these tests
INLINE = {"shm_threshold": 1 << 30}  # every tensor inline
SHARED = {"shm_threshold": 1024}  # every output of these tests through shared memory



def _still_serves(client: WorkerClient, rid: str, **params: object) -> None:
    """The channel is good: outputs of exactly max_io_bytes go through on the same client."""
    done = client.submit(request(rid, sizes=[LIMIT - 100, 100], **params)).next(timeout=10)
    assert done.kind is EventKind.DONE, done.error
    assert [int(done.arrays[name].sum()) for name in ("o0", "o1")] == [LIMIT - 100, 200]
    done.release()
    health = client.health()
    assert health.state == "ready" and client.ping()["in_flight"] == 0, health


def _over(error: Any, kind: str = "done") -> None:
    """``error`` is the refusal of outputs [9000, 11000] (20000 bytes) over LIMIT."""
    assert error.type == "EventTooLarge", error
    assert error.message == (
        f"event.outputs: the {kind} event's output tensors are 20000 bytes, over the "
        f"channel's max_io_bytes {LIMIT}; the largest is outputs['o1'], 11000 bytes: "
        "raise the stage's max_io_bytes or send fewer bytes in one event: 20000")
    assert error.fault is None  # the backend's answer is too large, not the request


@pytest.mark.parametrize("transport", [INLINE, SHARED, {**SHARED, "buffers": True}],
                         ids=["inline", "shared-memory", "output-buffers"])
@pytest.mark.parametrize("without", [(), (FEATURE_BINARY_HEADER,)], ids=["binary", "json"])
def test_outputs_together_over_max_io_bytes_fail_their_request_and_the_channel_stays(
    start: Callable[..., WorkerClient], monkeypatch: pytest.MonkeyPatch,
    transport: dict[str, Any], without: tuple[str, ...],
) -> None:
    monkeypatch.setattr(bootstrap, "_supported", lambda: KNOWN_FEATURES - set(without))
    settings = dict(transport)
    buffers = settings.pop("buffers", False)
    client = start("big_outputs", max_io_bytes=LIMIT, **settings)
    assert not set(without) & client.features
    # each under the limit, together over it
    _over(refused(client, "r1", sizes=[9000, 11000], buffers=buffers)[-1].error)
    assert client.query({"returns": "r1"}) == {"returns": [False]}  # done() said not sent
    _still_serves(client, "r2", buffers=buffers)


@pytest.mark.parametrize("transport", [INLINE, SHARED], ids=["inline", "shared-memory"])
def test_one_byte_over_max_io_bytes_isrefused(
    start: Callable[..., WorkerClient], transport: dict[str, Any],
) -> None:
    client = start("big_outputs", max_io_bytes=LIMIT, **transport)
    _still_serves(client, "r1")  # exactly LIMIT
    error = refused(client, "r2", sizes=[LIMIT - 100, 101])[-1].error
    assert error.type == "EventTooLarge"
    assert error.message.startswith(
        f"event.outputs: the done event's output tensors are {LIMIT + 1} bytes, over the "
        f"channel's max_io_bytes {LIMIT}; the largest is outputs['o0'], {LIMIT - 100} bytes")
    _still_serves(client, "r3")


def test_a_streamed_output_over_max_io_bytes_ends_the_stream_and_later_emits_are_dropped(
    start: Callable[..., WorkerClient],
) -> None:
    client = start("big_outputs", max_io_bytes=LIMIT, **SHARED)
    deliveries = refused(client, "g1", Operation.GENERATE, on="output", sizes=[9000, 11000])
    assert [(d.kind, d.seq) for d in deliveries] == [(EventKind.ERROR, 0)]
    _over(deliveries[-1].error, "output")
    # the refused OUTPUT, the next OUTPUT and the DONE: none sent
    assert client.query({"returns": "g1"}) == {"returns": [False, False, False]}
    _still_serves(client, "r2")


def test_refused_outputs_give_back_their_segments_and_acknowledge_their_inputs(
    start: Callable[..., WorkerClient],
) -> None:
    # two buffers each way: a refused event that kept its output segments (worker side)
    # or left its input unacknowledged (controller side) would exhaust a cap by the next
    client = start("big_outputs", max_io_bytes=LIMIT, shm_max_buffers=2, **SHARED)
    x = np.zeros(4096, dtype=np.uint8)
    for i in range(4):
        for buffers in (False, True):
            error = refused(client, f"r{i}-{buffers}", inputs={"x": x}, sizes=[9000, 11000],
                             buffers=buffers)[-1].error
            _over(error)
    done = client.submit(request("last", sizes=[4096, 4096], buffers=True),
                         {"x": x}).next(timeout=10)
    assert done.kind is EventKind.DONE, done.error
    assert done.retained and int(done.arrays["o1"].sum()) == 2 * 4096
    done.release()
    _still_serves(client, "r-end", buffers=True)


def test_an_output_over_the_shared_memory_cap_fails_its_request_and_the_channel_stays(
    start: Callable[..., WorkerClient],
) -> None:
    # max_io_bytes would allow it: the worker's cap on retained shared memory does not
    cap = 64 * 1024
    client = start("big_outputs", max_io_bytes=1 << 20, shm_max_bytes=cap, **SHARED)
    for buffers in (False, True):
        error = refused(client, f"r-{buffers}", sizes=[2 * cap], buffers=buffers)[-1].error
        assert error.type == "ShmCapExceeded", error
        assert error.message.startswith(
            f"shm.retained_bytes: exceeds the per-producer cap of {cap} bytes: "), error
        assert error.fault is None and error.traceback is not None  # the packer's raise
        # emit sent that ERROR in place of the DONE: it says sent
        assert client.query({"returns": f"r-{buffers}"}) == {"returns": [True]}
        _still_serves(client, f"r2-{buffers}", buffers=buffers)
