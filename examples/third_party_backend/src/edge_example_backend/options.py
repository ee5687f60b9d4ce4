"""The validated ``[backend.options]`` of an ``example-numpy`` stage (cheap to import)."""

from __future__ import annotations

import attrs


@attrs.frozen
class ExampleOptions:
    """Options of an ``example-numpy`` stage.

    Attributes:
        threads: Requests computed at once inside the worker (each on its own thread).
    """

    threads: int = attrs.field(default=2, validator=[attrs.validators.ge(1),
                                                     attrs.validators.le(4)])
