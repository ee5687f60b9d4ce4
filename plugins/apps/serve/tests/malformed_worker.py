"""A local test worker: the echo worker, but a malformed reply when a request asks.

Named by a stage's route (``entry = "malformed_worker:create"``, this folder in its
``python_path``). A request with ``fail_call`` set is answered with a well-framed ERROR
event that carries no error: the controller reads the frame but cannot accept the event
(``event.error``), as from a worker that broke the protocol. Its DONE follows, which the
controller drops (the request has ended). Every other request is echoed.

Runs inside the worker process: imports only the standard library, edge_contracts and
the echo worker.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from edge_contracts.headers import FrameHeader
from edge_contracts.wire import encode_frame, write_frame
from edge_contracts.worker import Call
from edge_echo.worker import EchoHandler


class Malformed(EchoHandler):
    """Echo; ``fail_call`` gets an ERROR event without its error, then the echo's DONE."""

    def submit(self, call: Call) -> Mapping[str, Any] | None:
        """Write the malformed event first when the request asks for a failure."""
        if call.params.get("fail_call"):
            meta = {"seq": 0, "kind": "error", "data": {}, "error": None, "created_ns": 0}
            header = FrameHeader("event", call.request_id, call.stage_id, call.epoch,
                                 call.generation, meta=meta)
            channel = int(sys.argv[-1])  # the worker's end of its channel
            write_frame(lambda views: os.writev(channel, views), encode_frame(header, []))
            return {name: array for name, array in call.inputs.items()}
        return super().submit(call)


def create() -> Malformed:
    """The worker's handler."""
    return Malformed()
