"""A local test worker: the echo worker, but a malformed event in shared memory when asked.

Named by a stage's route (``entry = "forged_shm_events:create"``, this folder in its
``python_path``). A request's ``forge`` parameter makes the worker answer with an event
whose outputs travel through its shared memory (``pad_bytes`` zero bytes, over the
shared-memory threshold) but whose fields break the protocol: it carries an error on a
kind that takes none, which the controller finds when it checks the event, after the
frame (and its segment references) was read.

* ``"done"``: a DONE with the outputs and an error (terminal).
* ``"output"``: an OUTPUT with the outputs and an error, then a well-formed DONE with
  outputs of the same size in shared memory (which the controller must drop, acknowledging
  its memory: the request has ended).

Every other request is echoed. Sent through :meth:`Call.emit`, the serve loop's own
packing and framing: only the event's fields are wrong.

Runs inside the worker process: imports only the standard library, numpy,
edge_contracts and the echo worker.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from edge_contracts.requests import EventKind
from edge_contracts.worker import Call
from edge_echo.worker import EchoHandler


class ForgedError(RuntimeError):
    """The error a forged event carries where its kind takes none."""


class ForgedShmEvents(EchoHandler):
    """Echo; ``forge`` answers with a malformed event whose outputs are in shared memory."""

    def submit(self, call: Call) -> Mapping[str, Any] | None:
        """Send the forged event(s) when the request asks; else echo."""
        forge = call.params.get("forge")
        if not forge:
            return super().submit(call)
        size = int(call.params["pad_bytes"])
        error = ForgedError("an error on an event whose kind takes none")
        if forge == "done":
            call.emit(EventKind.DONE, outputs={"pad": np.zeros(size, np.uint8)}, error=error)
        elif forge == "output":
            call.emit(EventKind.OUTPUT, outputs={"pad": np.zeros(size, np.uint8)}, error=error)
            call.done({"pad": np.ones(size, np.uint8)})
        else:
            raise ValueError(f"params.forge: no such forgery: {forge!r}")
        return None


def create() -> ForgedShmEvents:
    """The worker's handler."""
    return ForgedShmEvents()
