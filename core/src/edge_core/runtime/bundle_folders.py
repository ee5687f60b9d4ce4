"""The bundle folders a transform or ``finish`` reads a stage's model assets from.

``bundles`` — stage id → the folder of the verified bundle its worker loaded, ``None`` for
a stage whose loaded stage holds none — is what a transform that takes a third argument
(:func:`edge_core.runtime.chain.with_bundles`) and the pipeline's ``finish`` get: model
assets such as a character table live there. The folder holds the bytes the stage loaded,
never a rewrite since: a staged bundle's is its private copy, the bytes verified when the
stage opened, whatever the bundle on disk holds now; a bundle verified in place is the
bundle itself, checked unchanged since its verification each time it is looked up
(:func:`edge_core.artifacts.pins.loaded_directory`: a ``stat`` per file), and refused with
``BundleChanged`` — naming the manifest, the sha256 the stage loaded and the one now —
once rewritten. Only the stage looked up is checked, once per mapping (one per call), and
listing the stage ids checks none. A ``BundleChanged`` met here is also told to
``on_changed`` (stage id, the error) before it is raised: the pipeline marks the stage,
which cannot serve as it was opened any more (its health says so until the stage loads
again under a new generation; :meth:`StageRuntime.note_bundle_changed
<edge_core.runtime.stage_runtime.StageRuntime.note_bundle_changed>`).

:meth:`BundleFolders.read` is the way to read an asset: the member's bytes read once,
hashed and returned only when their sha256 is the one the verified manifest gives it
(:func:`edge_core.artifacts.pins.read_member`): a rewrite at any time before, between or
after a lookup cannot reach the caller, staged or in place. It costs one read and one
sha256 of the member per call. A reader that opens files of the folder itself (a path
handed to a library) gets no such check: a rewrite between the lookup's check and its
own ``open`` is not caught when the bundle was verified in place.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from edge_core.artifacts.bundle import VerifiedBundle
from edge_core.artifacts.errors import BundleChanged, MemberMissing
from edge_core.artifacts.pins import loaded_directory, read_member

__all__ = ["BundleFolders"]


class BundleFolders(Mapping[str, Path | None]):
    """Stage id → the folder of the verified bundle its worker loaded (or None).

    Args:
        loaded: Stage id → its loaded stage (``None``: not loaded); the folder is that of
            the loaded stage's ``bundle``.
        on_changed: Called with the stage id and the error when a lookup or a read of a
            stage's bundle meets ``BundleChanged`` (then raised), or None.
    """

    def __init__(self, loaded: Mapping[str, Any],
                 on_changed: Callable[[str, BundleChanged], object] | None = None) -> None:
        self._loaded = dict(loaded)
        self._found: dict[str, Path | None] = {}
        self._on_changed = on_changed

    def __getitem__(self, stage_id: str) -> Path | None:
        """The stage's folder, checked first when its bundle was verified in place.

        Raises:
            KeyError: no such stage.
            BundleChanged: verified in place and changed since it loaded.
        """
        if stage_id in self._found:
            return self._found[stage_id]
        bundle = getattr(self._loaded[stage_id], "bundle", None)
        if isinstance(bundle, VerifiedBundle):
            try:
                found: Path | None = loaded_directory(bundle)
            except BundleChanged as changed:
                self._changed(stage_id, changed)
                raise
        else:
            directory = getattr(bundle, "directory", None)
            found = None if directory is None else Path(directory)
        self._found[stage_id] = found
        return found

    def read(self, stage_id: str, member: str) -> bytes:
        """The bytes of ``member`` of the bundle the stage loaded, as verified.

        Read once from the stage's folder (its staged copy, or the bundle verified in
        place), hashed, and returned only when the sha256 is the one the manifest the
        stage verified gives ``member`` (:func:`~edge_core.artifacts.pins.read_member`).

        Raises:
            KeyError: no such stage.
            MemberMissing: the stage's loaded stage holds no verified bundle (none, or a
                backend's own), so nothing says which bytes it loaded.
            MemberPathRefused: ``member`` is not listed in the verified manifest.
            BundleChanged: the bytes read are not those verified: naming the manifest and
                both its sha256s when the bundle was rewritten, else the file, the sha256
                the manifest gives it and the one read.
        """
        bundle = getattr(self._loaded[stage_id], "bundle", None)
        if not isinstance(bundle, VerifiedBundle):
            raise MemberMissing(f"bundles[{stage_id!r}]", "the stage holds no verified bundle "
                                "to read its members from", member)
        try:
            return read_member(bundle, member)
        except BundleChanged as changed:
            self._changed(stage_id, changed)
            raise

    def _changed(self, stage_id: str, error: BundleChanged) -> None:
        """Tell ``on_changed`` that the stage's bundle changed since it loaded."""
        if self._on_changed is not None:
            self._on_changed(stage_id, error)

    def __iter__(self) -> Iterator[str]:
        return iter(self._loaded)

    def __len__(self) -> int:
        return len(self._loaded)

    def __repr__(self) -> str:
        return f"BundleFolders({sorted(self._loaded)})"
