"""The ``meta`` of a worker's event on a binary channel, written as JSON text.

:class:`~edge_contracts.worker._Server` answers every request with events. On a channel
that negotiated the binary header, their ``meta`` is written here as text directly, in
the mapping form's key order, instead of frozen as a mapping only for the header encoder
to thaw and encode it again. Handler ``data`` is checked exactly as
:class:`~edge_contracts.headers.FrameHeader` checks ``meta`` (and refused with the same
error); everything else is the worker's own. With the ``event-fields`` feature, ``seq``,
``kind`` and ``created_ns`` go in the header's event block instead
(:data:`~edge_contracts.binary_header.EVENT_BLOCK`) and the text holds only what is set.

An event whose header would be longer than the channel's ``max_header_bytes`` is not
sent (the controller's reader would refuse the frame and lose the channel): the worker
ends its request with the :func:`too_large` error instead, on either kind of channel. An
event whose output tensors together are more than the channel's ``max_io_bytes`` (which
the controller's reader holds each frame's tensors to) ends its request the same way,
with :func:`outputs_too_large`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from edge_contracts.binary_header import EVENT_BLOCK, KIND_CODES, ack_pairs_text
from edge_contracts.errors import EventTooLarge, HeaderMalformed
from edge_contracts.events import EventKind
from edge_contracts.jsonvalues import freeze_object, thaw_json
from edge_contracts.worker_errors import error_info

__all__ = ["EXCERPT_CHARS", "KIND_TEXT", "event_meta", "outputs_too_large", "too_large"]

_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
KIND_TEXT: dict[EventKind, str] = {kind: kind.value for kind in EventKind}
"""Each kind's wire text, looked up without the enum's (Python-level) value property."""
EXCERPT_CHARS = 100
"""Most characters of a refused error's message quoted in the :func:`too_large` error."""


def event_meta(
    kind: EventKind,
    seq: int,
    data: Mapping[str, Any] | None,
    error: BaseException | None,
    acks: list[list[Any]] | None,
    gone: list[str],
    *,
    block: bool,
) -> tuple[bytes, bytes]:
    """Return an event's ``(meta JSON bytes, event block)`` (the block ``b""`` without it).

    ``acks`` is ``None`` on a non-terminal event (the key is left out), ``gone`` the
    segments this side unlinked.

    Raises:
        HeaderMalformed: ``data`` is not a JSON object (field ``header.meta.data``...).

    """
    text = "{}" if not data else _ENCODER.encode(
        thaw_json(freeze_object(dict(data), "header.meta.data", error=HeaderMalformed, depth=1))
    )
    problem = None if error is None else _ENCODER.encode(error_info(error))
    if block:  # the block carries three fields; the text only what is set
        parts = ["{"]
        if data:
            parts += ('"data":', text, ",")
        if problem is not None:
            parts += ('"error":', problem, ",")
        if acks:
            parts += ('"acks":', ack_pairs_text(acks), ",")
        if gone:
            parts += ('"gone":', _ENCODER.encode(gone), ",")
        meta = b"" if len(parts) == 1 else ("".join(parts)[:-1] + "}").encode()
        return meta, EVENT_BLOCK.pack(seq, time.monotonic_ns(), KIND_CODES[kind])
    parts = [
        '{"seq":', str(seq), ',"kind":"', KIND_TEXT[kind], '","data":', text,
        ',"error":', "null" if problem is None else problem,
        ',"created_ns":', str(time.monotonic_ns()),
    ]
    if acks is not None:
        parts += (',"acks":', ack_pairs_text(acks) if acks else "[]")
    if gone:
        parts += (',"gone":', _ENCODER.encode(gone))
    parts.append("}")
    return "".join(parts).encode(), b""


def too_large(
    kind: EventKind,
    data: Mapping[str, Any] | None,
    error: BaseException | None,
    size: int,
    cap: int,
) -> EventTooLarge:
    """The error that ends a request whose event's header would be ``size`` bytes, over ``cap``.

    Its field names what is long: ``event.data`` or ``event.error`` (whichever is the
    longer as JSON), else ``event`` (tensor entries, acknowledgements). Its message says
    the sizes, the longest value of ``data`` or the start of the error's own message, and
    what to do. ``data`` must be JSON (the event was encoded before it was measured).
    """
    thawed: Mapping[str, Any] = {} if not data else thaw_json(  # type: ignore[assignment]
        freeze_object(dict(data), "header.meta.data", error=HeaderMalformed, depth=1))
    data_bytes = len(_ENCODER.encode(thawed)) if thawed else 0
    error_bytes = 0 if error is None else len(_ENCODER.encode(error_info(error)))
    start = (f"the {KIND_TEXT[kind]} event's header would be {size} bytes, over the "
             f"channel's max_header_bytes {cap}")
    if error is not None and error_bytes > data_bytes:
        message = str(error)
        excerpt = message[:EXCERPT_CHARS] + ("..." if len(message) > EXCERPT_CHARS else "")
        traced = " with its traceback" if error.__traceback__ is not None else ""
        return EventTooLarge("event.error", size, (
            f"{start}; its error ({type(error).__name__}: {excerpt!r}) is {error_bytes} "
            f"bytes as JSON{traced}: raise it with a shorter message"))
    if data_bytes:
        longest = max(thawed, key=lambda key: len(_ENCODER.encode(thawed[key])))
        longest_bytes = len(_ENCODER.encode(thawed[longest]))
        return EventTooLarge("event.data", size, (
            f"{start}; its data is {data_bytes} bytes as JSON, {longest_bytes} of them in "
            f"data[{longest!r}]: put large values in output tensors"))
    return EventTooLarge("event", size, (
        f"{start}: its tensor entries and acknowledgements alone; send fewer outputs "
        "in one event"))


def outputs_too_large(kind: EventKind, sizes: Mapping[str, int], cap: int) -> EventTooLarge:
    """The error that ends a request whose event's outputs are more than ``cap`` bytes.

    ``sizes``: the bytes of each output, by name; ``cap``: the channel's ``max_io_bytes``,
    which the controller's reader holds every frame's tensors to, inline and shared
    memory together. Its field is ``event.outputs``, its value the outputs' total bytes;
    its message says both sizes, the largest output and what to do.
    """
    total = sum(sizes.values())
    largest = max(sizes, key=lambda name: sizes[name])
    return EventTooLarge("event.outputs", total, (
        f"the {KIND_TEXT[kind]} event's output tensors are {total} bytes, over the "
        f"channel's max_io_bytes {cap}; the largest is outputs[{largest!r}], "
        f"{sizes[largest]} bytes: raise the stage's max_io_bytes or send fewer bytes in "
        "one event"))
