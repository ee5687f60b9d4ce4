"""Files a bundle refers to must be verified members, and readable without pickle.

Checked here, on a directory whose members have already been hashed (the staged copy,
or the bundle itself):

- ``metadata.validation.expected_outputs``, when present, is a member path;
- every member that is, or whose bytes parse as, an ONNX model (any name ending in
  ``.onnx`` in any case, and any other file that parses as a model with a graph) has
  its external-data locations among the members, without ``..`` or any other unsafe
  form, and the ``offset``/``length`` they name fit inside the file;
- the example inputs and expected outputs are ``.npz`` archives within the bounds of
  :mod:`edge_contracts.npz_limits` whose arrays all load with ``allow_pickle=False``.

The graph and example-inputs paths being members is enforced by ``ArtifactManifest``.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from edge_contracts.errors import ArchiveRefused, InvalidValue
from edge_contracts.manifest import ArtifactManifest
from edge_contracts.npz_limits import check_npz_file
from edge_contracts.shapesets import ShapeSet, Spec
from edge_core.artifacts.errors import MemberPathRefused, ReferenceRefused
from edge_core.artifacts.members import check_member_path, member_field
from edge_core.artifacts.onnx_refs import ExternalRef, external_refs
from edge_core.shapes import WarmupCase, declared_shapes

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = ["EXPECTED_OUTPUTS_KEY", "References", "check_references", "expected_outputs_path",
           "load_npz"]

EXPECTED_OUTPUTS_KEY = "expected_outputs"
"""Key of ``metadata.validation`` naming the ``.npz`` of reference outputs."""

ONNX_SUFFIX = ".onnx"


@attrs.frozen
class References:
    """What a bundle's files refer to, after checking.

    Attributes:
        external_data: ONNX member -> the member paths its tensors' data lives in.
        expected_outputs: the member holding reference outputs, if declared.
        arrays: ``.npz`` member -> its array names, in archive order.

    """

    external_data: Mapping[str, tuple[str, ...]]
    expected_outputs: str | None
    arrays: Mapping[str, tuple[str, ...]]
    shapes: ShapeSet | None = None
    """The served shape set (:mod:`edge_core.shapes`), when the bundle has examples."""
    warmup_cases: tuple[WarmupCase, ...] = ()
    """Every example the load warms up and gates, one or more per entry of ``shapes``."""


def expected_outputs_path(manifest: ArtifactManifest) -> str | None:
    """The member named by ``metadata.validation.expected_outputs``; refused unless listed."""
    validation = manifest.metadata.validation
    if validation is None or EXPECTED_OUTPUTS_KEY not in validation:
        return None
    field = f"manifest.metadata.validation.{EXPECTED_OUTPUTS_KEY}"
    value = validation[EXPECTED_OUTPUTS_KEY]
    if not isinstance(value, str):
        raise ReferenceRefused(field, "must be a member path (a string)", value)
    try:
        check_member_path(value, field)
    except MemberPathRefused as exc:
        raise ReferenceRefused(exc.field, exc.reason, exc.value) from None
    if value not in manifest.files:
        raise ReferenceRefused(field, "must be a key of files (not in the verified set)", value)
    return value


def _check_external(
    ref: ExternalRef, graph: str, field: str, sizes: Mapping[str, int]
) -> str:
    where = f"{field}.{ref.where}.external_data.location"
    if ref.location is None:
        raise ReferenceRefused(where, "tensor is marked external but names no location",
                               ref.tensor)
    try:
        check_member_path(ref.location, where)
    except MemberPathRefused as exc:
        raise ReferenceRefused(exc.field, exc.reason, exc.value) from None
    member = posixpath.join(posixpath.dirname(graph), ref.location)
    if member not in sizes:
        raise ReferenceRefused(
            where, "external data file is not in the verified set (add it to the manifest)",
            member,
        )
    end = ref.offset + (ref.length if ref.length is not None else 0)
    if end > sizes[member]:
        raise ReferenceRefused(
            f"{field}.{ref.where}.external_data",
            f"offset + length must be <= the size of {member} ({sizes[member]} bytes)", end,
        )
    return member


def load_npz(path: Path, field: str) -> dict[str, npt.NDArray[Any]]:
    """Every array of the ``.npz`` at ``path``, loaded with pickle disabled.

    Refused (naming ``field``): not an ``.npz`` archive, an unreadable member, an
    object array (which would need pickle), and — before any array is allocated — an
    archive beyond the bounds of :mod:`edge_contracts.npz_limits` (declared sizes,
    compression ratio, ``.npy`` headers that disagree with the declared sizes).
    """
    import zipfile

    import numpy as np

    try:
        with open(path, "rb") as handle:  # one open file: checked, then read
            check_npz_file(handle, field)
            handle.seek(0)
            loaded = np.load(handle, allow_pickle=False)
            if not isinstance(loaded, np.lib.npyio.NpzFile):
                raise ReferenceRefused(field, "must be an .npz archive of named arrays",
                                       path.name)
            with loaded as archive:
                return {name: archive[name] for name in archive.files}
    except ArchiveRefused as exc:
        raise ReferenceRefused(exc.field, exc.reason, exc.value) from None
    except MemoryError as exc:  # a bound above should make this unreachable
        raise ReferenceRefused(field, f"does not fit in memory ({type(exc).__name__})",
                               path.name) from None
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        raise ReferenceRefused(
            field, f"must be an .npz archive loadable without pickle ({exc})", path.name
        ) from None


def check_references(
    directory: Path, manifest: ArtifactManifest, sizes: Mapping[str, int]
) -> References:
    """Check what the members at ``directory`` refer to; ``sizes`` maps member -> bytes."""
    expected = expected_outputs_path(manifest)
    external: dict[str, tuple[str, ...]] = {}
    for member in sorted(manifest.files):
        # A *.onnx (any case) must parse; every other member (the graph of a backend
        # that is not ONNX, weights, data) is scanned too, and checked as a model when its
        # bytes parse as one, whatever its name.
        named = member.casefold().endswith(ONNX_SUFFIX)
        field = member_field(member)
        refs = external_refs(directory.joinpath(*member.split("/")), field,
                             any_file=not named)
        if refs:
            external[member] = tuple(dict.fromkeys(
                _check_external(ref, member, field, sizes) for ref in refs
            ))
    arrays: dict[str, tuple[str, ...]] = {}
    for name, npz in (("metadata.example_inputs", manifest.metadata.example_inputs),
                      (f"metadata.validation.{EXPECTED_OUTPUTS_KEY}", expected)):
        if npz is not None:
            loaded = load_npz(directory.joinpath(*npz.split("/")), f"manifest.{name}")
            arrays[npz] = tuple(loaded)
    specs: dict[str, dict[str, Spec]] = {}

    def npz_specs(member: str, field: str) -> Mapping[str, Spec]:
        if member not in specs:
            from edge_core.shapes import specs_of

            loaded = load_npz(directory.joinpath(*member.split("/")), field)
            arrays[member] = tuple(loaded)
            specs[member] = specs_of(loaded)
        return specs[member]

    try:
        served = declared_shapes(manifest.metadata.validation,
                                 manifest.metadata.example_inputs, expected, npz_specs,
                                 manifest.files)
    except InvalidValue as exc:
        raise ReferenceRefused(exc.field, exc.reason, exc.value) from None
    shapes, cases = served if served is not None else (None, ())
    return References(external, expected, arrays, shapes, cases)
