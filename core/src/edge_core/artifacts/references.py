"""Files a bundle refers to must be verified members, and readable without pickle.

Checked here, on a directory whose members have already been hashed (the staged copy,
or the bundle itself):

- ``metadata.validation.expected_outputs``, when present, is a member path;
- every member whose name says it is ONNX (ends in ``.onnx``, any case) — ``metadata.graph``
  and any other, such as a derived bundle's per-bucket graphs — is an ONNX model with a
  graph that has at least one input and one output (:func:`check_onnx_graph`; a graph
  named otherwise is a backend's own format, and only checked as any member is);
- every member that is, or whose bytes parse as, an ONNX model (any name ending in
  ``.onnx`` in any case, and any other file that parses as a model with a graph) has
  its external-data locations among the members, without ``..`` or any other unsafe
  form, and the ``offset``/``length`` they name fit inside the file;
- the example inputs and expected outputs are ``.npz`` archives within the bounds of
  :mod:`edge_contracts.npz_limits` whose arrays all load with ``allow_pickle=False``
  (checked from each member's ``.npy`` header and a streamed read of its data, without
  loading the arrays: :func:`npz_headers`);
- the example inputs of an ONNX graph hold an array for every input of the graph that no
  initializer gives a value (:func:`check_example_feeds`), and its expected outputs
  name only outputs of the graph, so that a bundle whose archives are not its graph's
  inputs and outputs is refused here, not by a stage's warm-up.

The graph and example-inputs paths being members is enforced by ``ArtifactManifest``.
"""

from __future__ import annotations

import contextlib
import posixpath
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from edge_contracts.errors import ArchiveRefused, InvalidValue
from edge_contracts.manifest import ArtifactManifest
from edge_contracts.npz_limits import check_npz_file
from edge_contracts.shapesets import ShapeSet, Spec
from edge_core.artifacts.errors import MemberPathRefused, ReferenceRefused
from edge_core.artifacts.members import check_member_path, member_field
from edge_core.artifacts.npz_headers import ArrayHeader, read_npz_headers
from edge_core.artifacts.onnx_refs import (
    ExternalRef,
    GraphOutline,
    ModelScan,
    model_refs,
    scan_model,
)
from edge_core.shapes import WarmupCase, declared_shapes, specs_of

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = ["EXPECTED_OUTPUTS_KEY", "GRAPH_FIELD", "References", "check_example_feeds",
           "check_onnx_graph", "check_references", "expected_outputs_path", "load_npz",
           "named_onnx", "npz_headers", "specs_of_headers"]

EXPECTED_OUTPUTS_KEY = "expected_outputs"
"""Key of ``metadata.validation`` naming the ``.npz`` of reference outputs."""

ONNX_SUFFIX = ".onnx"

GRAPH_FIELD = "manifest.metadata.graph"
"""The field a refused graph is named by."""


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


def named_onnx(member: str) -> bool:
    """Whether ``member``'s name says it is an ONNX model: it ends in ``.onnx``, any case."""
    return member.casefold().endswith(ONNX_SUFFIX)


def check_onnx_graph(outline: GraphOutline, member: str, field: str = GRAPH_FIELD) -> None:
    """Refuse ``member`` unless it is a usable ONNX model; ``outline`` is what it holds.

    Only a member named as ONNX (:func:`named_onnx`) is checked: a bundle for a backend
    that does not run ONNX names its own file. Such a member must parse as an ONNX model
    (``ModelProto``) with a graph that has at least one input and one output: a protobuf
    parser reads 0 bytes, and many short byte strings, as a model without a graph, which
    no runtime can serve. Nodes are not required: a graph may pass an input straight
    through to an output, and ONNX Runtime runs it.

    Args:
        outline: the member's :func:`~edge_core.artifacts.onnx_refs.graph_outline` (the
            ``outline`` of its :func:`~edge_core.artifacts.onnx_refs.scan_model`, the one
            read that also gives its external-data references).
        member: the member path.
        field: the field a refusal names: ``manifest.metadata.graph`` for the graph, the
            member's own (``manifest.files["sub/x.onnx"]``) for any other member.

    Raises:
        ReferenceRefused: naming ``field``, what is missing, and the member.

    """
    if not named_onnx(member):
        return
    if outline.size == 0:
        missing = "the file is empty (0 bytes)"
    elif outline.problem is not None:
        missing = f"not a readable ONNX model ({outline.problem})"
    elif not outline.graphs:
        missing = "it holds no graph"
    else:
        absent = [name for name, count in (("input", outline.inputs),
                                           ("output", outline.outputs)) if not count]
        if not absent:
            return
        missing = f"its graph has no {' and no '.join(absent)}"
    raise ReferenceRefused(
        field,
        f"named {ONNX_SUFFIX} but {missing}: an ONNX model needs a graph with at least one "
        f"input and one output (a file in another format must not be named {ONNX_SUFFIX})",
        member,
    )


def check_example_feeds(feeds: Sequence[str], given: Sequence[str], graph: str,
                        example: str) -> None:
    """Refuse example inputs that lack an input the ONNX graph must be fed.

    ``feeds`` are the graph's inputs without an initializer
    (:attr:`~edge_core.artifacts.onnx_refs.GraphOutline.feeds`; empty for a graph that is
    not ONNX, which is not checked); ``given`` the arrays of the example inputs. Without
    this, the bundle was refused only by a stage's warm-up, after its worker started.

    Raises:
        ReferenceRefused: naming ``manifest.metadata.example_inputs``, the inputs missing,
            the arrays it holds and the graph's inputs.

    """
    missing = [name for name in feeds if name not in given]
    if missing:
        raise ReferenceRefused(
            "manifest.metadata.example_inputs",
            f"lacks the graph's input(s) {missing}: {graph} takes {list(feeds)}, the archive "
            f"holds {sorted(given)} (example inputs are the arrays the graph is fed, by "
            "input name)", example)


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


def load_npz(source: Path | bytes, field: str, name: str = "") -> dict[str, npt.NDArray[Any]]:
    """Every array of the ``.npz`` at ``source``, loaded with pickle disabled.

    ``source`` is the file, or its bytes read already (``name`` then names it in
    refusals). Refused (naming ``field``): not an ``.npz`` archive, an unreadable member,
    an object array (which would need pickle), and — before any array is allocated — an
    archive beyond the bounds of :mod:`edge_contracts.npz_limits` (declared sizes,
    compression ratio, ``.npy`` headers that disagree with the declared sizes).
    """
    import io

    import numpy as np

    shown = source.name if isinstance(source, Path) else name
    with (_npz_refusals(shown, field),  # one file: checked, read
          open(source, "rb") if isinstance(source, Path) else io.BytesIO(source) as handle):
        check_npz_file(handle, field)
        handle.seek(0)
        loaded = np.load(handle, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise ReferenceRefused(field, "must be an .npz archive of named arrays", shown)
        with loaded as archive:
            return {key: archive[key] for key in archive.files}


@contextlib.contextmanager
def _npz_refusals(name: str, field: str) -> Iterator[None]:
    """Raise what reading the ``.npz`` named ``name`` raised as :class:`ReferenceRefused`."""
    import zipfile

    try:
        yield
    except ArchiveRefused as exc:
        raise ReferenceRefused(exc.field, exc.reason, exc.value) from None
    except MemoryError as exc:  # a bound above should make this unreachable
        raise ReferenceRefused(field, f"does not fit in memory ({type(exc).__name__})",
                               name) from None
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        raise ReferenceRefused(
            field, f"must be an .npz archive loadable without pickle ({exc})", name
        ) from None


_ZIP_PREFIXES = (b"PK\x03\x04", b"PK\x05\x06")
"""How an archive that ``numpy.load`` reads as an ``.npz`` begins."""


def npz_headers(path: Path, field: str) -> Mapping[str, ArrayHeader]:
    """The arrays of the ``.npz`` at ``path`` as their headers, none loaded.

    Refuses, naming ``field``, exactly what :func:`load_npz` refuses (bounds, object
    arrays, unreadable or cut-short members, CRC mismatches, a file ``numpy.load`` would
    not read as an archive), but reads only each member's ``.npy`` header and streams the
    rest (:mod:`edge_core.artifacts.npz_headers`).
    """
    with _npz_refusals(path.name, field), open(path, "rb") as handle:
        if handle.read(4) not in _ZIP_PREFIXES:  # numpy.load's own refusal, unchanged
            return {name: ArrayHeader(array.dtype, tuple(array.shape))
                    for name, array in load_npz(path, field).items()}
        return read_npz_headers(handle, field)


def specs_of_headers(headers: Mapping[str, ArrayHeader]) -> dict[str, Spec]:
    """``{name: (dtype spelling, shape)}`` as :func:`edge_core.shapes.specs_of` gives it.

    Raises:
        InvalidValue: a dtype the wire does not carry (a non-array member's bytes too).

    """
    from edge_contracts.tensors import dtype_of

    return {name: (specs_of({name: header.raw})[name] if header.raw is not None
                   else (dtype_of(header.dtype).value, header.shape))
            for name, header in headers.items()}


def check_references(
    directory: Path, manifest: ArtifactManifest, sizes: Mapping[str, int]
) -> References:
    """Check what the members at ``directory`` refer to; ``sizes`` maps member -> bytes."""
    expected = expected_outputs_path(manifest)
    graph = manifest.metadata.graph
    # Every member is read and walked once (scan_model): the graph first, so its own
    # refusal comes before any other member's, and its scan is kept for the loop.
    scans: dict[str, ModelScan] = {}
    feeds: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    if named_onnx(graph):
        scans[graph] = scan_model(directory.joinpath(*graph.split("/")))
        check_onnx_graph(scans[graph].outline, graph)
        feeds = scans[graph].outline.feeds
        outputs = scans[graph].outline.output_names
    external: dict[str, tuple[str, ...]] = {}
    for member in sorted(manifest.files):
        # A *.onnx (any case) must be a model with a graph, as the graph must; every other
        # member (the graph of a backend that is not ONNX, weights, data) is scanned too,
        # and checked as a model when its bytes parse as one, whatever its name.
        named = named_onnx(member)
        field = member_field(member)
        path = directory.joinpath(*member.split("/"))
        scan = scans.pop(member) if member in scans else scan_model(path)
        if named and member != graph:
            check_onnx_graph(scan.outline, member, field)
        refs = model_refs(scan, path.name, field, any_file=not named)
        if refs:
            external[member] = tuple(dict.fromkeys(
                _check_external(ref, member, field, sizes) for ref in refs
            ))
    arrays: dict[str, tuple[str, ...]] = {}
    headers: dict[str, Mapping[str, ArrayHeader]] = {}
    for name, npz in (("metadata.example_inputs", manifest.metadata.example_inputs),
                      (f"metadata.validation.{EXPECTED_OUTPUTS_KEY}", expected)):
        if npz is not None:
            headers[npz] = npz_headers(directory.joinpath(*npz.split("/")),
                                       f"manifest.{name}")
            arrays[npz] = tuple(headers[npz])
    example = manifest.metadata.example_inputs
    if example is not None:
        check_example_feeds(feeds, tuple(headers[example]), graph, example)
    if expected is not None and outputs:
        unknown = [name for name in headers[expected] if name not in outputs]
        if unknown:
            raise ReferenceRefused(
                f"manifest.metadata.validation.{EXPECTED_OUTPUTS_KEY}",
                f"names no output of the graph: {unknown}: {graph} gives {list(outputs)}, "
                f"the archive holds {sorted(headers[expected])} (expected outputs are the "
                "graph's outputs for the example inputs, by output name)", expected)
    specs: dict[str, dict[str, Spec]] = {}

    def member_specs(member: str, field: str) -> Mapping[str, Spec]:
        if member not in specs:
            if member not in headers:
                headers[member] = npz_headers(directory.joinpath(*member.split("/")), field)
                arrays[member] = tuple(headers[member])
            specs[member] = specs_of_headers(headers[member])
        return specs[member]

    try:
        served = declared_shapes(manifest.metadata.validation,
                                 manifest.metadata.example_inputs, expected, member_specs,
                                 manifest.files)
    except InvalidValue as exc:
        raise ReferenceRefused(exc.field, exc.reason, exc.value) from None
    shapes, cases = served if served is not None else (None, ())
    return References(external, expected, arrays, shapes, cases)
