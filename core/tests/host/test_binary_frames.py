"""Per-request frames travel with the binary header when both ends negotiated it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from edge_contracts import frame_reader, wire
from edge_contracts.protocol import FEATURE_BINARY_HEADER, FEATURE_EVENT_FIELDS, KNOWN_FEATURES
from edge_contracts.requests import Operation, StageRequest
from edge_core.host import bootstrap
from edge_core.host import client as client_module


def request(rid: str, **params: object) -> StageRequest:
    return StageRequest(rid, "s0", 0, 1, Operation.RUN, params=params)


@pytest.fixture
def wire_spy(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """Records the ops the controller writes and reads, with the header form of each."""
    seen: dict[str, list[Any]] = {"sent": [], "read": []}
    encode, parse = wire.encode_frame, frame_reader.parse_header
    encode_call = client_module.encode_call_frame

    def spy_encode(header: Any, payloads: Any, **kwargs: Any) -> Any:
        parts = encode(header, payloads, **kwargs)
        seen["sent"].append((header.op, bytes(parts[0][:4])))
        return parts

    def spy_encode_call(op: str, *args: Any, **kwargs: Any) -> Any:  # requests, templated
        parts = encode_call(op, *args, **kwargs)
        seen["sent"].append((op, bytes(parts[0][:4])))
        return parts

    def spy_parse(raw: Any, limits: Any, **kwargs: Any) -> Any:
        header = parse(raw, limits, **kwargs)
        seen["read"].append((header.op, kwargs.get("binary", False)))
        return header

    encode_ack = client_module.encode_ack_frame

    def spy_encode_ack(*args: Any, **kwargs: Any) -> Any:  # acks, written directly
        raw = encode_ack(*args, **kwargs)
        seen["sent"].append(("ack", bytes(raw[:4])))
        return raw

    monkeypatch.setattr(client_module, "encode_frame", spy_encode)
    monkeypatch.setattr(client_module, "encode_call_frame", spy_encode_call)
    monkeypatch.setattr(client_module, "encode_ack_frame", spy_encode_ack)
    monkeypatch.setattr(frame_reader, "parse_header", spy_parse)
    return seen


def test_requests_events_and_acks_go_binary_when_negotiated(start, wire_spy) -> None:
    client = start()
    assert FEATURE_BINARY_HEADER in client.features
    big = np.arange(512 * 1024, dtype=np.uint8)  # through shared memory: an ack follows
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = client.submit(request("r1", note="params stay JSON"), {"x": x, "big": big}).result()
    np.testing.assert_array_equal(out["x"], x)
    np.testing.assert_array_equal(out["big"], big)
    assert client.ping()["in_flight"] == 0  # the ack was read before the ping
    sent = dict(wire_spy["sent"])
    assert sent["run"] == b"EDGB" and sent["ack"] == b"EDGB"
    assert sent["ping"] == b"EDGW"  # control frames keep the JSON header
    read = dict(wire_spy["read"])
    assert read["event"] is True and read["reply"] is False


def test_a_controller_without_the_feature_talks_json(start, wire_spy, monkeypatch) -> None:
    monkeypatch.setattr(bootstrap, "_supported", lambda: KNOWN_FEATURES - {FEATURE_BINARY_HEADER})
    client = start()
    assert FEATURE_BINARY_HEADER not in client.features
    x = np.arange(4, dtype=np.int64)
    np.testing.assert_array_equal(client.submit(request("r1"), {"x": x}).result()["x"], x)
    assert {magic for _, magic in wire_spy["sent"]} == {b"EDGW"}
    assert not any(binary for _, binary in wire_spy["read"])


@pytest.fixture
def event_spy(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Records every event header the controller reads."""
    seen: list[Any] = []
    parse = frame_reader.parse_header

    def spy_parse(raw: Any, limits: Any, **kwargs: Any) -> Any:
        header = parse(raw, limits, **kwargs)
        if header.op == "event":
            seen.append(header)
        return header

    monkeypatch.setattr(frame_reader, "parse_header", spy_parse)
    return seen


def _stream(client: Any, rid: str) -> list[Any]:
    call = client.submit(StageRequest(rid, "s0", 0, 1, Operation.GENERATE,
                                      params={"tokens": 3}))
    return list(call)


def test_event_fields_travel_in_the_block_when_negotiated(start, event_spy) -> None:
    client = start("stream", features=("stream-events",))
    assert FEATURE_EVENT_FIELDS in client.features
    deliveries = _stream(client, "g1")
    assert [d.kind.value for d in deliveries] == ["token", "token", "token", "done"]
    assert [d.seq for d in deliveries] == [0, 1, 2, 3]
    assert [d.data["text"] for d in deliveries[:3]] == ["t0", "t1", "t2"]
    assert deliveries[3].data == {"tokens": 3, "aborted_so_far": 0}
    assert all(d.created_ns > 0 for d in deliveries)
    assert all(FEATURE_EVENT_FIELDS in h.required_features for h in event_spy)
    # an error event names its error; an empty DONE's meta is the block's three fields
    echo = start()
    with pytest.raises(Exception, match="asked to fail: now"):
        echo.submit(request("e1", **{"raise": "now"})).result()
    assert echo.submit(request("e2"), {}).result() == {}
    done = event_spy[-1]
    assert set(done.meta) == {"seq", "kind", "created_ns"} and done.meta["kind"] == "done"


def test_a_controller_without_event_fields_reads_whole_meta(start, event_spy,
                                                            monkeypatch) -> None:
    monkeypatch.setattr(bootstrap, "_supported", lambda: KNOWN_FEATURES - {FEATURE_EVENT_FIELDS})
    client = start("stream", features=("stream-events",))
    assert FEATURE_EVENT_FIELDS not in client.features
    assert FEATURE_BINARY_HEADER in client.features
    deliveries = _stream(client, "g1")
    assert [(d.kind.value, d.seq) for d in deliveries] == [
        ("token", 0), ("token", 1), ("token", 2), ("done", 3)]
    assert deliveries[0].data == {"text": "t0", "index": 0}
    assert not any(FEATURE_EVENT_FIELDS in h.required_features for h in event_spy)
    assert {"seq", "kind", "data", "error", "created_ns"} <= set(event_spy[-1].meta)
