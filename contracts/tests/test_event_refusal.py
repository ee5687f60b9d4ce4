"""A worker event that cannot be sent ends its call with an ERROR saying why.

The serve loop refuses an event whose header would exceed ``max_header_bytes`` (or whose
data is not JSON) by raising before it writes anything; :class:`Call` then ends the
request with an ERROR event carrying that error (the refused event's seq, the inputs'
acknowledgements) and drops later emits. Here the loop is a stand-in that records what
it is asked to send; core/tests/host/test_event_size.py runs the real one.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from typing import Any

import pytest

from edge_contracts.errors import ContractError, EventTooLarge
from edge_contracts.events import EventKind
from edge_contracts.frame_reader import FrameReader
from edge_contracts.headers import FrameHeader, Limits
from edge_contracts.protocol import FEATURE_BINARY_HEADER, FEATURE_EVENT_FIELDS, KNOWN_FEATURES
from edge_contracts.worker import BaseHandler
from edge_contracts.worker import _Server as ServeLoop
from edge_contracts.worker_call import Call
from edge_contracts.worker_events import EXCERPT_CHARS, too_large
from edge_contracts.worker_protocol import BootConfig

ACKS = [["seg-a", 3]]


class Loop:
    """Records each event it is asked to send; refuses the first ``refuse`` of them."""

    boot: Any = None
    use_shm = False

    def __init__(self, refuse: int) -> None:
        self.refuse = refuse
        self.events: list[tuple[EventKind, int, Any, Any, Any]] = []
        self.forgotten: list[Call] = []

    def tensors(self) -> Any:
        raise AssertionError("no tensors in these calls")

    def send_event(self, call: Call, kind: EventKind, seq: int, packed: Any,
                   data: Mapping[str, Any] | None, error: BaseException | None,
                   acks: list[list[Any]] | None) -> bool:
        self.events.append((kind, seq, data, error, acks))
        if len(self.events) <= self.refuse:
            raise EventTooLarge("event.data", 70_000, "over max_header_bytes 65536")
        return True

    def forget(self, call: Call) -> None:
        self.forgotten.append(call)


def _call(loop: Loop) -> Call:
    return Call(loop, FrameHeader("generate", "r1", "s0", 0, 1), {}, [list(a) for a in ACKS])


def test_a_refused_token_ends_the_call_with_an_error_that_acknowledges_the_inputs() -> None:
    loop = Loop(refuse=1)
    call = _call(loop)
    assert call.token({"text": "x" * 10}) is False
    assert call.closed and loop.forgotten == [call]
    (kind, seq, _, _, acks), (end, end_seq, data, error, end_acks) = loop.events
    assert (kind, seq, acks) == (EventKind.TOKEN, 0, None)
    assert (end, end_seq, data, end_acks) == (EventKind.ERROR, 0, None, ACKS)
    assert isinstance(error, EventTooLarge) and error.field == "event.data"
    assert error.__traceback__ is None  # only the loop's frames: not sent
    assert call.token({"text": "t"}) is False and call.done() is False
    assert len(loop.events) == 2 and loop.forgotten == [call]  # dropped, not sent


def test_a_report_that_cannot_be_sent_either_is_printed_and_the_call_is_ended(
    capsys: pytest.CaptureFixture[str],
) -> None:
    loop = Loop(refuse=2)
    call = _call(loop)
    assert call.done(data={"text": "x"}) is False
    assert [event[0] for event in loop.events] == [EventKind.DONE, EventKind.ERROR]
    assert call.closed and loop.forgotten == [call]
    printed = capsys.readouterr().err
    assert "edge worker: request 'r1': no event could be sent:" in printed
    assert "EventTooLarge: event.data: over max_header_bytes 65536" in printed


def test_the_error_names_the_longer_of_data_and_error_text() -> None:
    data = {"short": "s", "texts": ["x" * 500] * 4}
    by_data = too_large(EventKind.DONE, data, None, 70_000, 65_536)
    assert isinstance(by_data, ContractError)
    assert (by_data.field, by_data.value) == ("event.data", 70_000)
    assert by_data.reason == (
        "the done event's header would be 70000 bytes, over the channel's max_header_bytes "
        "65536; its data is 2035 bytes as JSON, 2013 of them in data['texts']: put large "
        "values in output tensors")
    long_error = ValueError("é" * 1000)  # 6000 bytes once escaped
    by_error = too_large(EventKind.ERROR, data, long_error, 90_000, 65_536)
    assert by_error.field == "event.error"
    excerpt = "é" * EXCERPT_CHARS + "..."
    assert f"its error (ValueError: {excerpt!r}) is " in by_error.reason
    assert by_error.reason.endswith("bytes as JSON: raise it with a shorter message")
    try:
        raise long_error
    except ValueError as raised:
        with_traceback = too_large(EventKind.ERROR, None, raised, 90_000, 65_536)
    assert with_traceback.reason.endswith(
        "bytes as JSON with its traceback: raise it with a shorter message")
    neither = too_large(EventKind.OUTPUT, None, None, 66_000, 65_536)
    assert neither.field == "event"
    assert "its tensor entries and acknowledgements alone" in neither.reason


class Producer:
    """A segment producer's names of unlinked segments, as the loop takes and restores them."""

    def __init__(self, gone: list[str]) -> None:
        self.gone = gone

    def take_gone(self) -> list[str]:
        gone, self.gone = self.gone, []
        return gone

    def restore_gone(self, names: list[str]) -> None:
        self.gone[:0] = names


def _boot(features: tuple[str, ...]) -> BootConfig:
    return BootConfig(token="t", entry="m:f", generation=1, shm_prefix="edge-w",
                      peer_prefix="edge-c", shm_threshold=1 << 20, shm_max_bytes=1 << 20,
                      shm_max_buffers=4, max_io_bytes=1 << 20, features=features)


@pytest.mark.parametrize("features", [(FEATURE_BINARY_HEADER, FEATURE_EVENT_FIELDS),
                                      (FEATURE_BINARY_HEADER,), ()],
                         ids=["binary", "binary-no-event-fields", "json"])
def test_the_unlinked_names_of_a_refused_event_go_with_the_error_that_replaces_it(
    features: tuple[str, ...],
) -> None:
    boot = _boot(features)
    worker_end, controller_end = socket.socketpair()
    try:
        loop = ServeLoop(worker_end, boot, BaseHandler())
        loop._producer = Producer(["edge-w-1"])  # type: ignore[assignment]
        call = Call(loop, FrameHeader("run", "r1", "s0", 0, 1), {}, [])
        assert call.done(data={"text": "x" * 70_000}) is False
        reader = FrameReader(controller_end.recv_into,
                             Limits(max_io_bytes=1 << 20, supported_features=KNOWN_FEATURES))
        meta = reader.read().header.meta
        assert meta["kind"] == "error" and meta["seq"] == 0
        assert meta["error"]["type"] == "EventTooLarge"
        assert meta["error"]["message"].startswith("event.data: the done event's header")
        assert list(meta["gone"]) == ["edge-w-1"]  # not lost with the refused frame
        assert loop._producer.gone == []
    finally:
        worker_end.close()
        controller_end.close()


class Stalled:
    """A socket whose every write fails: makes no progress (``write_frame`` raises
    WireError) or raises ``BrokenPipeError`` (the controller is gone)."""

    def __init__(self, how: str) -> None:
        self.how = how
        self.writes = 0

    def sendmsg(self, parts: Any) -> int:
        self.writes += 1
        if self.how == "epipe":
            raise BrokenPipeError(32, "Broken pipe")
        return 0


@pytest.mark.parametrize("how", ["no-progress", "epipe"])
@pytest.mark.parametrize("features", [(FEATURE_BINARY_HEADER, FEATURE_EVENT_FIELDS), ()],
                         ids=["binary", "json"])
def test_a_failed_write_breaks_the_channel_and_is_never_taken_for_a_refused_event(
    features: tuple[str, ...], how: str,
) -> None:
    worker_end, controller_end = socket.socketpair()
    try:
        loop = ServeLoop(worker_end, _boot(features), BaseHandler())
        stalled = loop.sock = Stalled(how)  # type: ignore[assignment]
        call = Call(loop, FrameHeader("run", "r1", "s0", 0, 1), {}, [])
        # no ERROR written after part of a frame: the stream would be garbage
        assert call.done(data={"text": "x"}) is False and stalled.writes == 1
        assert call.closed
        assert loop.send(FrameHeader("heartbeat", "", "", 0, 1)) is False
        assert stalled.writes == 1  # broken: nothing more written
    finally:
        worker_end.close()
        controller_end.close()
