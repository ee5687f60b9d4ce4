"""The pipeline consecutive conformance checks share while each leaves it whole.

Opening a stage can be the slowest part of a check (a vLLM stage loads its engine on
every open), so the stage checks that only serve, acknowledge and cancel requests share
one open pipeline: :class:`PipelineShare` holds it between two such checks. The runner
says, before each check, whether the next check will share (``keep_open``); the
harness (:func:`edge_core.testing.harness.shared`) keeps the pipeline only then, and
only when the check left it whole (ready, nothing outstanding), and otherwise closes it
with the same checks as a check's own pipeline.
"""

from __future__ import annotations

from typing import Protocol

import attrs

__all__ = ["Held", "PipelineShare"]


class Held(Protocol):
    """An open conformance pipeline, as the share holds it."""

    def close(self) -> None:
        """Close it, failing (``CheckFailed``) on an unverified retire, a charge or a leak."""

    def abandon(self) -> None:
        """Close it without judging the close (after a check already failed or raised)."""


@attrs.define(eq=False)
class PipelineShare:
    """The open pipeline lent from one check to the next, and whether to keep it.

    Attributes:
        held: The pipeline kept open by the last check, or None.
        keep_open: Set by the runner before each check: True when the next check shares
            the pipeline, so the check keeps it open when it leaves it whole.
    """

    held: Held | None = None
    keep_open: bool = False

    def take(self) -> Held | None:
        """The held pipeline, now no longer held (None when there is none)."""
        held, self.held = self.held, None
        return held

    def release(self) -> None:
        """Close the held pipeline, if any, judging its close (``CheckFailed``)."""
        held = self.take()
        if held is not None:
            held.close()

    def abandon(self) -> None:
        """Close the held pipeline, if any, without judging its close."""
        held = self.take()
        if held is not None:
            held.abandon()
