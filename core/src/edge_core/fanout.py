"""What a transform may return besides a mapping: a :class:`Fanout` or a :class:`Call`.

**Several calls of one stage within a request.**

A transform normally returns one mapping: the next stage's inputs (plus ``carry:*``
values). To map the next stage over several items — 37 text crops in chunks sized to the
recogniser's buckets, say — it returns a :class:`Fanout` instead::

    from edge_core.runtime import Fanout

    def crops_to_recognize(previous, source):
        chunks = [...]                                  # one {"x": array} per call
        return Fanout(items=chunks, carry={"carry:boxes": boxes})

The runtime submits the items in parallel, up to the stage's in-flight slots summed over
its replicas, and gathers the outputs in item order: the next transform (or ``finish``,
or the caller's result) sees each output name mapped to a **list** of arrays, one per
item, in item order. ``carry`` values pass as they do today (one value each); ``carry:*``
keys inside an item are gathered into lists like outputs.

The request's epoch, cancel and deadline cover every item; a cancelled request delivers
no item's output. Each item's result is copied (only arrays that are views of a worker's
shared memory) and acknowledged as soon as it arrives, so its memory goes back to the
worker at once. This is a map over items of one stage, distinct from a topology fan-out
of one stage into two stages (which stays refused).

**A call with request parameters.** A transform before a generate stage (vLLM) builds the
request's parameters — a prompt from the recognised text, say — and returns
``Call(params={"prompt": text})``: the runtime merges them over the caller's parameters
(the transform's win) for the last stage, or passes them alone to an earlier stage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from edge_core.errors import ConfigError

__all__ = ["CARRY_PREFIX", "Call", "Fanout"]

CARRY_PREFIX = "carry:"
"""Transform outputs named ``carry:*`` travel past the stage to the next transform."""


class Fanout:
    """A transform's request for several calls of the next stage.

    Args:
        items: One input mapping per call, in the order the outputs are gathered.
        carry: Values for the next transform, passed once (names start with ``carry:``).

    Raises:
        ConfigError: an item is not a mapping, or a carry name lacks the prefix.
    """

    __slots__ = ("carry", "items")

    def __init__(self, items: Sequence[Mapping[str, Any]],
                 carry: Mapping[str, Any] | None = None) -> None:
        checked: list[Mapping[str, Any]] = []
        for index, item in enumerate(items):
            if not isinstance(item, Mapping):
                raise ConfigError(f"Fanout.items[{index}]", "must be a mapping of inputs",
                                  type(item).__name__)
            checked.append(item)
        for name in carry or {}:
            if not isinstance(name, str) or not name.startswith(CARRY_PREFIX):
                raise ConfigError(f"Fanout.carry[{name!r}]",
                                  f"carried names start with {CARRY_PREFIX!r}", name)
        self.items: tuple[Mapping[str, Any], ...] = tuple(checked)
        self.carry: dict[str, Any] = dict(carry or {})

    def __len__(self) -> int:
        return len(self.items)

    def __repr__(self) -> str:
        return f"Fanout({len(self.items)} items, carry={sorted(self.carry)})"


class Call:
    """A transform's request for one call of the next stage with request parameters.

    Args:
        inputs: The stage's tensor inputs (a generate stage takes none).
        params: Request parameters (JSON values), merged over the caller's for the last stage.
        carry: Values for the next transform (names start with ``carry:``).

    Raises:
        ConfigError: a carry name lacks the prefix, or params is not a mapping.
    """

    __slots__ = ("carry", "inputs", "params")

    def __init__(self, inputs: Mapping[str, Any] | None = None, *,
                 params: Mapping[str, Any] | None = None,
                 carry: Mapping[str, Any] | None = None) -> None:
        if params is not None and not isinstance(params, Mapping):
            raise ConfigError("Call.params", "must be a mapping of JSON values",
                              type(params).__name__)
        for name in carry or {}:
            if not isinstance(name, str) or not name.startswith(CARRY_PREFIX):
                raise ConfigError(f"Call.carry[{name!r}]",
                                  f"carried names start with {CARRY_PREFIX!r}", name)
        self.inputs: dict[str, Any] = dict(inputs or {})
        self.params: dict[str, Any] = dict(params or {})
        self.carry: dict[str, Any] = dict(carry or {})

    def __repr__(self) -> str:
        return f"Call(inputs={sorted(self.inputs)}, params={sorted(self.params)})"
