"""How a worker was started: forked by the warm pool's zygote, or spawned, and why.

See :mod:`edge_core.host.warm_pool`; a client's ``start_path`` holds its worker's.
"""

from __future__ import annotations

import attrs

__all__ = ["FORKED", "SPAWNED", "StartPath"]

FORKED = "forked"
"""A start path: forked by a warm pool's zygote."""

SPAWNED = "spawned"
"""A start path: a new interpreter, spawned by the controller."""


@attrs.frozen
class StartPath:
    """How a worker was started, and why.

    Attributes:
        kind: :data:`FORKED` or :data:`SPAWNED`.
        reason: why it was spawned (None when forked).
        zygote: the PID of the zygote that forked it (None when spawned).
        forks: how many starts that zygote had served, this one included.

    """

    kind: str
    reason: str | None = None
    zygote: int | None = None
    forks: int | None = None

    def to_dict(self) -> dict[str, object]:
        """Plain form for reports."""
        return {"kind": self.kind, "reason": self.reason, "zygote": self.zygote,
                "forks": self.forks}
