"""The validated options of an echo stage (kept apart so that importing the plugin is cheap)."""

from __future__ import annotations

import attrs


@attrs.frozen
class EchoOptions:
    """The validated ``[backend.options]`` of an echo stage."""

    delay_s: float = attrs.field(default=0.0, validator=attrs.validators.ge(0.0))
    scale: float = 2.0
    fail_at: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(
            attrs.validators.in_(("load", "warmup", "call"))))
    allocate_mb: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    provider: str = "numpy"
    wrong_numerics: bool = False
    example_shape: tuple[int, ...] = (2, 2)
