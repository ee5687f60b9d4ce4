"""An event whose header would be over max_header_bytes fails its request, not the channel.

The controller's reader refuses a frame whose header is longer than the channel's
``max_header_bytes`` (64 KiB) as a protocol violation: the channel would be lost for every
request on it. The worker measures each event that carries data, an error or meta before
writing it, and ends the request with an ``EventTooLarge`` ERROR instead (naming
``event.data`` or ``event.error`` and the sizes); the same client then serves the next
request. Handler: ``big_events`` in ``workers/edge_test_workers.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from edge_contracts import frame_reader
from edge_contracts.headers import Limits
from edge_contracts.protocol import FEATURE_BINARY_HEADER, FEATURE_EVENT_FIELDS, KNOWN_FEATURES
from edge_contracts.requests import EventKind, Operation
from edge_core.host import WorkerClient, bootstrap

from .conftest import refused, request

LIMIT = Limits(max_io_bytes=1).max_header_bytes  # the channel's: the default, 64 KiB
OVER = LIMIT + 4000  # characters of data that no header of this limit holds



def _still_serves(client: WorkerClient, rid: str) -> None:
    """The channel is good: a normal request of the same client goes through."""
    done = client.submit(request(rid, pad=3)).next(timeout=10)
    assert done.kind is EventKind.DONE and done.data == {"text": "xxx"}, done.error
    health = client.health()
    assert health.state == "ready" and client.ping()["in_flight"] == 0, health


@pytest.fixture
def header_sizes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The length of every event header the controller's reader parses in full."""
    seen: list[int] = []
    parse = frame_reader.parse_header

    def spy(raw: Any, limits: Any, **kwargs: Any) -> Any:
        header = parse(raw, limits, **kwargs)
        if header.op == "event":
            seen.append(len(raw))
        return header

    monkeypatch.setattr(frame_reader, "parse_header", spy)
    return seen


def test_a_done_whose_data_is_over_the_limit_fails_its_request_and_the_channel_stays(
    start: Callable[..., WorkerClient],
) -> None:
    client = start("big_events")
    error = refused(client, "r1", pad=OVER)[-1].error
    assert error.type == "EventTooLarge", error
    assert error.message.startswith("event.data: the done event's header would be "), error
    assert f"over the channel's max_header_bytes {LIMIT}" in error.message
    assert "in data['text']: put large values in output tensors" in error.message
    assert error.fault is None  # the backend's limit, not the request's fault
    assert client.query({"returns": "r1"}) == {"returns": [False]}  # done() said not sent
    _still_serves(client, "r2")


def test_a_streamed_token_over_the_limit_ends_the_stream_and_later_emits_are_dropped(
    start: Callable[..., WorkerClient],
) -> None:
    client = start("big_events")
    deliveries = refused(client, "g1", Operation.GENERATE, on="token", pad=OVER)
    assert [d.kind for d in deliveries] == [EventKind.TOKEN, EventKind.ERROR]
    assert deliveries[0].data == {"text": "t0"}
    assert [d.seq for d in deliveries] == [0, 1]  # the ERROR takes the refused token's seq
    error = deliveries[-1].error
    assert error.type == "EventTooLarge"
    assert error.message.startswith("event.data: the token event's header would be ")
    # the refused token, the next token and the DONE: none sent
    assert client.query({"returns": "g1"}) == {"returns": [True, False, False, False]}
    _still_serves(client, "r2")


def test_an_error_whose_text_is_over_the_limit_is_replaced_by_one_that_says_so(
    start: Callable[..., WorkerClient],
) -> None:
    # 8000 "é": cut at 8192 characters, but six bytes each once escaped, twice (message
    # and traceback): about 96 KB of header
    client = start("big_events")
    error = refused(client, "r1", on="error", pad=8000)[-1].error
    assert error.type == "EventTooLarge"
    assert error.message.startswith("event.error: the error event's header would be ")
    assert "its error (ValueError: 'ééé" in error.message
    assert "bytes as JSON with its traceback: raise it with a shorter message" in error.message
    assert error.traceback is None and len(error.message) < 1000
    _still_serves(client, "r2")


def test_data_that_is_not_json_fails_its_request_instead_of_leaving_it_unanswered(
    start: Callable[..., WorkerClient],
) -> None:
    client = start("big_events")
    error = refused(client, "r1", on="set")[-1].error
    assert error.type == "HeaderMalformed"
    assert error.message.startswith("header.meta.data.bad: must be JSON-compatible")
    assert client.query({"returns": "r1"}) == {"returns": [False]}
    _still_serves(client, "r2")


def test_refused_events_give_back_their_outputs_and_acknowledge_their_inputs(
    start: Callable[..., WorkerClient],
) -> None:
    # two buffers each way: a refused event that kept its output segment (worker side)
    # or left its input unacknowledged (controller side) would exhaust a cap by the third
    client = start("big_events", shm_threshold=1024, shm_max_buffers=2)
    x = np.zeros(4096, dtype=np.uint8)
    for i in range(4):
        error = refused(client, f"r{i}", inputs={"x": x}, pad=OVER, outputs=4096)[-1].error
        assert error.type == "EventTooLarge", error
        deliveries = refused(client, f"g{i}", Operation.GENERATE, inputs={"x": x},
                              on="token", pad=OVER, outputs=4096)
        assert deliveries[-1].error.type == "EventTooLarge"
    done = client.submit(request("last", pad=3, outputs=4096), {"x": x}).next(timeout=10)
    assert done.kind is EventKind.DONE, done.error
    assert done.retained and int(done.arrays["y"].sum()) == 3 * 4096
    done.release()
    _still_serves(client, "r-end")


@pytest.mark.parametrize("without", [(), (FEATURE_EVENT_FIELDS,), (FEATURE_BINARY_HEADER,)],
                         ids=["binary", "binary-no-event-fields", "json"])
def test_data_up_to_the_limit_goes_through_and_one_byte_more_isrefused(
    start: Callable[..., WorkerClient], header_sizes: list[int],
    monkeypatch: pytest.MonkeyPatch, without: tuple[str, ...],
) -> None:
    monkeypatch.setattr(bootstrap, "_supported", lambda: KNOWN_FEATURES - set(without))
    client = start("big_events")
    assert not set(without) & client.features
    # the header grows by one byte per character of "x": measure it once
    probe = client.submit(request("r1", pad=10_000)).next(timeout=10)
    assert probe.kind is EventKind.DONE
    most = 10_000 + LIMIT - header_sizes[-1]
    fits = client.submit(request("r2", pad=most)).next(timeout=10)
    assert fits.kind is EventKind.DONE, fits.error
    assert len(fits.data["text"]) == most and header_sizes[-1] == LIMIT
    error = refused(client, "r3", pad=most + 1)[-1].error
    assert error.type == "EventTooLarge"
    assert error.message.startswith(
        f"event.data: the done event's header would be {LIMIT + 1} bytes, ")
    _still_serves(client, "r4")
