"""Per-request frames travel with the binary header when both ends negotiated it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from edge_contracts import frame_reader, wire
from edge_contracts.protocol import FEATURE_BINARY_HEADER, KNOWN_FEATURES
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

    def spy_encode(header: Any, payloads: Any, **kwargs: Any) -> Any:
        parts = encode(header, payloads, **kwargs)
        seen["sent"].append((header.op, bytes(parts[0][:4])))
        return parts

    def spy_parse(raw: Any, limits: Any, **kwargs: Any) -> Any:
        header = parse(raw, limits, **kwargs)
        seen["read"].append((header.op, kwargs.get("binary", False)))
        return header

    monkeypatch.setattr(client_module, "encode_frame", spy_encode)
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
