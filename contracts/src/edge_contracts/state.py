"""State handles: opaque references to state held inside one worker.

A handle is only good for the exact worker state it was issued by. By default it is
neither replayable (the work that built it cannot be re-run to rebuild it) nor
migratable (it cannot move to another worker), so a restart or a cancel makes every
older handle stale.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from edge_contracts.errors import InvalidValue
from edge_contracts.validation import check_keys, rebase, require_bool, require_id, require_int

__all__ = ["StateHandle"]


@dataclass(frozen=True, slots=True)
class StateHandle:
    """An opaque reference to worker-held state (a KV cache, a session ...).

    Attributes:
        session: id of the session the state belongs to.
        backend: name of the backend that holds it (e.g. ``vllm-cuda``).
        artifact: identity of the loaded artifact (e.g. its manifest digest).
        layout: identity of the state's layout (a version string of the backend).
        epoch: the stage epoch the state was built under.
        instance: id of the worker instance that holds the state.
        generation: that worker's generation.
        replayable: whether the state may be rebuilt by replaying its inputs.
        migratable: whether the state may move to another worker.

    """

    session: str
    backend: str
    artifact: str
    layout: str
    epoch: int
    instance: str
    generation: int
    replayable: bool = False
    migratable: bool = False

    def __post_init__(self) -> None:
        for name in ("session", "backend", "artifact", "layout", "instance"):
            require_id(getattr(self, name), f"state.{name}")
        require_int(self.epoch, "state.epoch")
        require_int(self.generation, "state.generation")
        require_bool(self.replayable, "state.replayable")
        require_bool(self.migratable, "state.migratable")

    def accepts(self, current: StateHandle) -> bool:
        """Whether ``current`` is the very state this handle refers to.

        True only when session, backend, artifact, layout, epoch, instance and
        generation are all equal; the replayable/migratable flags do not matter.
        """
        return (
            self.session == current.session
            and self.backend == current.backend
            and self.artifact == current.artifact
            and self.layout == current.layout
            and self.epoch == current.epoch
            and self.instance == current.instance
            and self.generation == current.generation
        )

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON-ready form."""
        return {
            "session": self.session,
            "backend": self.backend,
            "artifact": self.artifact,
            "layout": self.layout,
            "epoch": self.epoch,
            "instance": self.instance,
            "generation": self.generation,
            "replayable": self.replayable,
            "migratable": self.migratable,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], field: str = "state") -> StateHandle:
        """Build from the JSON form; ``replayable`` and ``migratable`` may be omitted."""
        mapping: Any = check_keys(data, field, _REQUIRED, ("replayable", "migratable"))
        try:
            return cls(**mapping)
        except InvalidValue as exc:
            raise rebase(exc, "state", field) from None


_REQUIRED = frozenset(
    {"session", "backend", "artifact", "layout", "epoch", "instance", "generation"}
)
