"""The validated options of an echo stage (kept apart so that importing the plugin is cheap)."""

from __future__ import annotations

import attrs


@attrs.frozen
class EchoOptions:
    """The validated ``[backend.options]`` of an echo stage.

    Streaming mode (``stream_chunks`` > 0): each request sends that many TOKEN events
    before its DONE — ``chunk_rate_hz`` of them per second (0: as fast as it can), each
    with ``tokens_per_chunk`` token ids and, with ``chunk_seconds``, the media seconds it
    stands for (``duration_s``: a speech stage's audio chunk). A request's params may set
    ``stream_chunks``, ``chunk_rate_hz``, ``tokens_per_chunk``, and ``stall_after`` /
    ``stall_s`` (a pause after that many chunks) for itself.
    """

    delay_s: float = attrs.field(default=0.0, validator=attrs.validators.ge(0.0))
    scale: float = 2.0
    fail_at: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(
            attrs.validators.in_(("load", "warmup", "call"))))
    allocate_mb: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    provider: str = "numpy"
    wrong_numerics: bool = False
    example_shape: tuple[int, ...] = (2, 2)
    load_delay_s: float = attrs.field(default=0.0, validator=attrs.validators.ge(0.0))
    stream_chunks: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    chunk_rate_hz: float = attrs.field(default=0.0, validator=attrs.validators.ge(0.0))
    tokens_per_chunk: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    chunk_seconds: float | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.gt(0.0)))
