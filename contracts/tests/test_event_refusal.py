"""A worker event that cannot be sent ends its call; a failed write ends the channel.

Here the serve loop runs on a socketpair whose worker end is replaced by a stand-in that
fails every write.
"""

from __future__ import annotations

import socket
from typing import Any

import pytest

from edge_contracts.headers import FrameHeader
from edge_contracts.protocol import FEATURE_BINARY_HEADER, FEATURE_EVENT_FIELDS
from edge_contracts.worker import BaseHandler
from edge_contracts.worker import _Server as ServeLoop
from edge_contracts.worker_call import Call
from edge_contracts.worker_protocol import BootConfig


def _boot(features: tuple[str, ...]) -> BootConfig:
    return BootConfig(token="t", entry="m:f", generation=1, shm_prefix="edge-w",
                      peer_prefix="edge-c", shm_threshold=1 << 20, shm_max_bytes=1 << 20,
                      shm_max_buffers=4, max_io_bytes=1 << 20, features=features)


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
