"""A local test worker: the echo worker, but a malformed event in shared memory when asked.

Named by a stage's route (``entry = "forged_shm_events:create"``, this folder in its
``python_path``). A request's ``forge`` parameter makes the worker answer with an event
whose outputs travel through its shared memory (``pad_bytes`` zero bytes, over the
shared-memory threshold) but whose fields break the protocol, which the controller finds
after the frame (and its segment references) was read:

* ``"done"``: a DONE with the outputs and an error, which its kind takes none of.
* ``"output"``: an OUTPUT with the outputs and an error, then a well-formed DONE with
  outputs of the same size in shared memory (which the controller must drop, acknowledging
  its memory: the request has ended).
* ``"error_not_object"``: a DONE with the outputs whose meta text reads ``{"error": 5}``
  (the serve loop's ``event_meta`` is wrapped here for that; a binary channel's).

Every other request is echoed. Sent through :meth:`Call.emit`, the serve loop's own
packing and framing: only the event's fields are wrong.

Runs inside the worker process: imports only the standard library, numpy,
edge_contracts and the echo worker.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from edge_contracts import worker
from edge_contracts.requests import EventKind
from edge_contracts.worker import Call
from edge_contracts.worker_events import event_meta
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
        elif forge == "error_not_object":  # meta text written over by _forged_meta
            call.emit(EventKind.DONE, outputs={"pad": np.zeros(size, np.uint8)},
                      data={_FORGE_META: True})
        else:
            raise ValueError(f"params.forge: no such forgery: {forge!r}")
        return None


_FORGE_META = "forge_meta"
_event_meta = event_meta


def _forged_meta(*args: Any, **kwargs: Any) -> tuple[bytes, bytes]:
    """The serve loop's event meta (binary channel), but ``{"error": 5}`` where asked."""
    meta, block = _event_meta(*args, **kwargs)
    data = args[2]
    if block and data and data.get(_FORGE_META):
        meta = b'{"error":5}'
    return meta, block


def create() -> ForgedShmEvents:
    """The worker's handler (its serve loop's event meta forged on request)."""
    # the name the serve loop calls it by, in its module (edge_contracts.worker)
    vars(worker)["event_meta"] = _forged_meta
    return ForgedShmEvents()
