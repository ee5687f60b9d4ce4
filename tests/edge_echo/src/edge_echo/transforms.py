"""Input transforms for chaining echo stages (model-owned transforms in real pipelines)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where used: the transforms module stays light
    from edge_core.runtime.bundle_folders import BundleFolders


def passthrough(previous: Mapping[str, Any], source: Mapping[str, Any]) -> dict[str, Any]:
    """The previous stage's outputs, as they are (the runtime copies them apart)."""
    return dict(previous)


def add_source(previous: Mapping[str, Any], source: Mapping[str, Any]) -> dict[str, Any]:
    """Each previous output plus the pipeline input of the same name."""
    return {name: value + source[name] for name, value in previous.items()}


def explode(previous: Mapping[str, Any], source: Mapping[str, Any]) -> dict[str, Any]:
    """Always fail: exercises unwinding from a transform."""
    raise ValueError("transform exploded as configured")


def bad_fanout(previous: Mapping[str, Any], source: Mapping[str, Any]) -> Any:
    """Build a ``Fanout`` wrong (an item that is an array, no mapping): a pipeline's bug.

    Raises:
        ConfigError: from ``Fanout`` itself, naming ``Fanout.items[0]``.

    """
    from edge_core.runtime import Fanout

    return Fanout(items=[previous["x"]])


def refuse_negative_input(previous: Mapping[str, Any],
                          source: Mapping[str, Any]) -> dict[str, Any]:
    """The previous outputs, unless the request's ``x`` holds a negative number.

    A transform's typed refusal of the request's own input: the request's fault.

    Raises:
        InvalidValue: naming the request's field ``inputs['x']`` and the first negative value.

    """
    import numpy as np

    from edge_contracts.errors import InvalidValue

    values = np.asarray(source["x"]).ravel()
    negative = values[values < 0]
    if negative.size:
        raise InvalidValue("inputs['x']", float(negative[0]), "must not be negative")
    return dict(previous)


def slow_passthrough(previous: Mapping[str, Any], source: Mapping[str, Any]) -> dict[str, Any]:
    """The previous outputs after half a second: room to cancel between two stages."""
    import time

    time.sleep(0.5)
    return dict(previous)


def split_rows(previous: Mapping[str, Any], source: Mapping[str, Any]) -> Any:
    """One call of the next stage per row of ``x`` (a fan-out), the row count carried."""
    import numpy as np

    from edge_core.runtime import Fanout

    rows = previous["x"]
    return Fanout(items=[{"x": rows[i:i + 1], "carry:row": np.array([i])}
                         for i in range(rows.shape[0])],
                  carry={"carry:rows": np.array([rows.shape[0]])})


def join_rows(previous: Mapping[str, Any], source: Mapping[str, Any]) -> dict[str, Any]:
    """The rows a fan-out gathered (a list, in item order), stacked again."""
    import numpy as np

    return {"x": np.concatenate(previous["x"], axis=0)}


def call_with_bundles(previous: Mapping[str, Any], source: Mapping[str, Any],
                      bundles: Mapping[str, Any]) -> Any:
    """A ``Call`` of the next stage that carries the stage ids it was given bundles for."""
    from edge_core.fanout import Call

    return Call({"x": previous["x"]}, params={"scale_note": 1},
                carry={"carry:bundles": sorted(bundles)})


def read_tables(previous: Mapping[str, Any], source: Mapping[str, Any],
                bundles: BundleFolders) -> dict[str, Any]:
    """The previous ``y`` as the next ``x``, with each stage's ``table.txt`` carried.

    Each stage's folder is looked up (a bundle verified in place and rewritten since the
    stage opened is refused there, ``BundleChanged``), and the asset read from the bundle
    the stage loaded, as verified
    (:meth:`~edge_core.runtime.bundle_folders.BundleFolders.read`); a stage whose bundle
    lists no ``table.txt``, or that holds no verified bundle, is left out.
    """
    from edge_core.artifacts.errors import MemberMissing, MemberPathRefused

    tables = {}
    for stage_id, folder in sorted(bundles.items()):  # the lookup checks each folder
        if folder is None:
            continue
        try:
            tables[stage_id] = bundles.read(stage_id, "table.txt").decode("utf-8")
        except (MemberMissing, MemberPathRefused):
            continue
    return {"x": previous["y"], "carry:tables": tables}


def refuse_negative(previous: Mapping[str, Any], source: Mapping[str, Any]) -> dict[str, Any]:
    """The previous outputs, unless ``x`` holds a negative number: a data-dependent failure.

    Raises:
        ValueError: naming the first negative value (one request fails, the next may not).

    """
    import numpy as np

    values = np.asarray(previous["x"]).ravel()
    negative = values[values < 0]
    if negative.size:
        raise ValueError(f"x: negative values are refused: {float(negative[0])}")
    return dict(previous)


def returns_carried(previous: Mapping[str, Any], source: Mapping[str, Any],
                    bundles: Mapping[str, Any]) -> Any:
    """What the pipeline input ``carry:returns`` (a callable) makes of the previous outputs.

    A test's way of having a transform return anything (a mapping with a key that is no
    ``str``, ``None``, a ``Fanout`` or ``Call`` built wrong). It takes ``bundles``, so the
    runtime calls it through the wrapper that binds them.
    """
    return source["carry:returns"](previous)


def unsendable(previous: Mapping[str, Any], source: Mapping[str, Any]) -> dict[str, Any]:
    """The previous ``x`` as an array of Python objects: a pipeline's bug.

    No stage is sent such an array: the next stage refuses it before sending
    (``InvalidValue`` naming ``inputs.x.dtype``), as it refuses a client's.
    """
    import numpy as np

    return {"x": np.array(previous["x"], dtype=object)}


def out_of_range_bools(previous: Mapping[str, Any], source: Mapping[str, Any]) -> dict[str, Any]:
    """``x`` as a bool array holding a byte other than 0 and 1 (7): a pipeline's bug.

    The next stage's worker refuses it as it refuses a client's (``BoolInputInvalid``,
    declared a request fault, naming ``inputs.x``).
    """
    import numpy as np

    return {"x": np.array([0, 1, 7], np.uint8).view(bool)}


def ask_refusal(previous: Mapping[str, Any], source: Mapping[str, Any]) -> Any:
    """A ``Call`` of the next stage with the previous ``x`` and the parameter ``refuse``.

    An echo stage refuses ``refuse`` as a request fault naming it: here the pipeline's
    transform asked for it, not the client.
    """
    from edge_core.fanout import Call

    return Call({"x": previous["x"]}, params={"refuse": "asked by the transform"})


def ask_unnamed_refusal(previous: Mapping[str, Any], source: Mapping[str, Any]) -> Any:
    """A ``Call`` of the next stage asking ``refuse_unnamed``: a refusal naming no field
    that the pipeline's transform, not the client, asked for."""
    from edge_core.fanout import Call

    return Call({"x": previous["x"]}, params={"refuse_unnamed": "asked by the transform"})


def y_as_float64(previous: Mapping[str, Any], source: Mapping[str, Any]) -> dict[str, Any]:
    """The previous ``y`` as the next ``x``, in float64: a pipeline's bug before a stage
    that serves float32 (an ort-cpu stage refuses it, ``ShapeRefused`` naming ``inputs.x``)."""
    import numpy as np

    return {"x": np.asarray(previous["y"], dtype=np.float64)}


def returns_pairs(previous: Mapping[str, Any], source: Mapping[str, Any]) -> Any:
    """The previous outputs as a list of ``(name, array)`` pairs, not a mapping: a
    pipeline's bug (the request fails with ``TransformReturnInvalid`` naming the list)."""
    return list(previous.items())
