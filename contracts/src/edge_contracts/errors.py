"""The typed errors of edge-contracts.

Every error raised by this package is a :class:`ContractError`. Each one names the
field that was wrong, the offending value and the reason (which states the limit
that was broken), and renders as ``field: reason: value``. Wire errors form their own
branch under :class:`WireError` so that a frame reader can refuse a peer with one
``except`` clause.
"""

from __future__ import annotations

from edge_contracts.error_copies import whole_reduction

__all__ = [
    "ArchiveRefused",
    "BoolBytesInvalid",
    "BoolInputInvalid",
    "ContractError",
    "DescriptorInvalid",
    "EventTooLarge",
    "FeatureRefused",
    "FrameTruncated",
    "HeaderMalformed",
    "HeaderTooLarge",
    "InvalidValue",
    "PayloadMismatch",
    "PayloadTooLarge",
    "StreamClosed",
    "UnknownRequiredFeature",
    "VersionMismatch",
    "WireError",
]


class ContractError(ValueError):
    """Base class of every error raised by edge-contracts.

    Attributes:
        field: dotted path of the offending field, e.g. ``request.inputs[0].nbytes``.
        value: the offending value, as received.
        reason: what is wrong, naming the limit, e.g. ``must be <= 32 dimensions``.

    """

    field: str
    value: object
    reason: str

    def __init__(self, field: str, value: object, reason: str) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(f"{field}: {reason}: {value!r}")

    def __reduce__(self) -> tuple[object, ...]:
        """Rebuild from ``args`` and the attributes, without calling ``__init__`` again.

        ``copy.copy`` and ``copy.deepcopy`` keep the error whole: its type, ``args`` and
        every attribute, those a subclass or a caller added included
        (:func:`~edge_contracts.error_copies.whole_reduction`).
        """
        return whole_reduction(self)


class InvalidValue(ContractError):
    """A field of a value type holds a value that the contract does not allow."""


class EventTooLarge(InvalidValue):
    """A worker's event too large for its channel: its header or its output tensors.

    Raised by the worker before anything is written (the controller's reader would refuse
    the frame and lose the channel): the request ends with an ERROR event carrying this
    error instead. A header over the channel's ``max_header_bytes``: ``field`` names what
    made it that long (``event.data``, ``event.error``, else ``event``), ``value`` is its
    length in bytes. Output tensors together over the channel's ``max_io_bytes``:
    ``field`` is ``event.outputs``, ``value`` their total bytes.
    """


class WireError(ContractError):
    """A frame on the wire was refused; the base class of every framing error."""


class FrameTruncated(WireError):
    """The stream ended, or the buffer ran out, before the frame was complete."""


class StreamClosed(FrameTruncated):
    """The stream ended cleanly on a frame boundary, before any byte of a new frame."""


class HeaderTooLarge(WireError):
    """The declared header length exceeds the reader's ``max_header_bytes``."""


class HeaderMalformed(WireError, InvalidValue):
    """The prefix or the header could not be parsed, or a header field is invalid."""


class VersionMismatch(WireError):
    """The frame declares a protocol version that this implementation does not speak."""


class UnknownRequiredFeature(WireError):
    """A peer requires a protocol feature that this implementation does not support."""


FeatureRefused = UnknownRequiredFeature
"""Alias of :class:`UnknownRequiredFeature`, for feature negotiation call sites."""


class DescriptorInvalid(WireError, InvalidValue):
    """A tensor entry of a header is invalid (dtype, shape, nbytes, name or shm ref)."""


class BoolBytesInvalid(DescriptorInvalid):
    """A ``bool`` tensor holds a byte other than 0 and 1 (the wire's bool is one byte).

    ``field`` is ``tensors.NAME``, ``value`` the tensor's largest byte. Raised wherever a
    frame's tensors are read: not by itself anyone's fault in particular (a worker that
    reads a request's inputs reports it as the request's own, see
    :func:`edge_contracts.worker_errors.input_fault`; a peer's outputs are the peer's).
    """


class BoolInputInvalid(InvalidValue):
    """A request's ``bool`` input holds a byte other than 0 and 1: the request's own fault.

    ``field`` is ``inputs.NAME``, ``value`` the largest byte. A NumPy bool array made by
    viewing other bytes (``np.array([0, 1, 7], np.uint8).view(bool)``) holds such bytes;
    the wire carries a bool as one byte, 0 or 1. Declared the request's fault with code
    ``invalid_value`` (:mod:`edge_contracts.request_faults`): a front end answers it with a
    4xx naming the input, and the same request fails the same way again.
    """

    request_fault = "invalid_value"


class PayloadTooLarge(WireError):
    """The frame's tensor bytes (inline plus shared memory) exceed ``max_io_bytes``."""


class PayloadMismatch(WireError):
    """The declared payload length differs from the bytes the header's tensors need."""


class ArchiveRefused(InvalidValue):
    """An ``.npz`` archive exceeds a documented bound (see :mod:`edge_contracts.npz_limits`)."""
