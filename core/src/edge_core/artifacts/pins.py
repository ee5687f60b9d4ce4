"""Bundle pins: a stage restarts on the bundle it opened with, never silently another.

A stage's bundle is verified when the pipeline opens (:func:`verify_bundle`, or
:func:`verify_once` shared by its replicas). A restart loads again — and an operator may
have rewritten the bundle in place meanwhile, files and manifest consistently, so that a
fresh verification would pass. The restarted worker would then serve another model than
the execution plan, the stored decision and the other replicas describe.

The opener makes one :class:`BundleIdentities` per stage (shared by its replicas and its
candidates; a stage with candidates has every candidate's manifest sha256 read when it
opens, :meth:`BundleIdentities.expect`) and one :class:`BundlePin` per replica, and runs
every load of the replica inside :meth:`BundlePin.active`, naming the stage's bundle
directory. The pin follows the load, not the thread: while it is active, a verification
answers to it when it runs in the load's own thread (whatever bundle it verifies), or in
any other thread — a plugin that verifies its bundle on a thread of its own, a worker
pool's — when it verifies the bundle that stage is loading. Where several stages (not
replicas of one) load the same bundle at once and the verification runs outside their
threads, it cannot tell which stage it serves: it is checked against each of them
(refused when any opened with another manifest) and reissues no kept copy. While a pin
is active:

* every verification of a bundle (:func:`observe`, called by :func:`verify_bundle` and
  by :func:`verify_once` for a shared handle) records the manifest's sha256 the first
  time the stage verifies that bundle, and refuses with ``BundleChanged`` — naming the
  manifest, the sha256 the stage opened with and the one found now — when a later one
  differs: a restart after a rewrite, a replica that opened on a bundle rewritten
  while its sibling was opening, or a restart that falls back to a candidate whose bundle
  was rewritten since the stage opened;
* :func:`verify_once` first asks the pin for the replica's kept staged copy
  (:func:`reissue`): the pin keeps a handle on the copy its loaded stage verified
  (:meth:`BundlePin.keep`, the loaded stage's ``bundle`` attribute, as ``edge_ort``'s),
  for the replica's whole life, so that the restart loads those very bytes (hashed once
  more, :meth:`VerifiedBundle.reissue`) whatever is on disk — the copy of each
  candidate's bundle the replica has loaded, at open or at a restart. A bundle verified
  in place, a backend that removes its copy once the worker loaded, a copy that is gone,
  or a candidate the replica never loaded: the restart verifies the disk afresh, which is
  refused as above when it was rewritten.

A load from a bundle verified in place is checked once its worker has loaded
(:func:`check_loaded`: the pre-load fingerprint check made again), so that a rewrite
between the check before the load and the worker's own ``open`` is refused too.

What edge-core reads of the bundle once the stage is open (its example inputs) is read
through the pin too (:meth:`BundlePin.read`): from the kept copy, else from the bundle on
disk checked against the manifest the stage verified, refused with ``BundleChanged``
when the bytes differ — never other bytes than those loaded.

The kept copy costs no disk beyond what the loaded stage already held while serving (the
same directory, shared); it is released when the replica's runtime closes
(:meth:`BundlePin.release`), at garbage collection, or at exit, and a copy of a process
that died without cleaning up is removed by the next edge-core process
(:mod:`edge_core.host.leftovers`).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from edge_contracts.manifest import MANIFEST_FILENAME, ArtifactManifest
from edge_core.artifacts.bundle import VerifiedBundle
from edge_core.artifacts.errors import BundleChanged, BundleRefused, MemberPathRefused
from edge_core.artifacts.members import member_field, open_member

__all__ = ["BundleIdentities", "BundlePin", "check_loaded", "loaded_directory",
           "member_changed", "observe", "read_member", "reissue"]

_ACTIVE: contextvars.ContextVar[BundlePin | None] = contextvars.ContextVar(
    "edge_bundle_pin", default=None)

_LOADS_LOCK = threading.Lock()
_LOADS: dict[Path, list[BundlePin]] = {}
"""Bundle directory → the pins of the loads running on it now (in any thread)."""


def _root(directory: str | os.PathLike[str]) -> Path:
    return Path(os.path.realpath(directory))


_UNREADABLE = "none (its manifest could not be read when the stage opened)"
"""What :meth:`BundleIdentities.expect` records for a manifest it could not read."""

_RESTART = "a restart loads only the bundle the stage opened with"
_READ = "what the stage reads of it is only what it verified then"
_LOAD = "a worker loads only the bundle its stage verified"


def _rewritten(root: str | os.PathLike[str], opened: str, now: str,
              why: str = _READ) -> BundleChanged:
    """The refusal of a bundle rewritten since its stage opened with it.

    Names the manifest file (the field), the sha256 the stage opened with (in the
    reason, after ``why``: what is refused) and the one found now (the value).
    """
    return BundleChanged(
        str(Path(root) / MANIFEST_FILENAME),
        f"rewritten since the stage opened with manifest sha256 {opened}; {why} (open "
        "the pipeline again to serve the new one); manifest sha256 now", now)


def _manifest_now(root: str | os.PathLike[str]) -> str:
    """The sha256 of the manifest file in ``root`` now, or why it cannot be read."""
    try:
        with open(Path(root) / MANIFEST_FILENAME, "rb") as handle:
            return hashlib.file_digest(handle, "sha256").hexdigest()
    except OSError as error:
        return f"none ({error.strerror or type(error).__name__})"


def _member_changed(root: str | os.PathLike[str], path: Path, expected: str,
                    opened: str | None, now: str) -> BundleChanged:
    """The refusal of a member read as ``now`` where the verified manifest says ``expected``.

    Names the manifest and both its sha256s when the bundle was rewritten since (its
    manifest's sha256 is not ``opened``, the one the stage opened with); else the file
    (``path``), the sha256 the manifest gives it and the one read.
    """
    manifest_now = _manifest_now(root)
    if opened is not None and manifest_now != opened:
        return _rewritten(root, opened, manifest_now)
    return BundleChanged(
        str(path),
        f"differs from the sha256 {expected} that the manifest the stage opened with "
        f"(sha256 {opened}) gives it; what the stage reads of its bundle is only what it "
        "verified then; sha256 now", now)


def _read_once(where: Path, member: str, field: str) -> tuple[bytes, str]:
    """The bytes of ``member`` of the bundle at ``where`` read once, and their sha256.

    Through the checked descriptor (:func:`~edge_core.artifacts.members.open_member`);
    a member that cannot be read gives no bytes and ``none (why)`` as its sha256.
    """
    try:
        opened = open_member(where, member, field)
        with os.fdopen(opened.fd, "rb") as handle:
            data = handle.read()
        return data, hashlib.sha256(data).hexdigest()
    except (OSError, BundleRefused) as error:
        return b"", f"none ({error})"


def read_member(bundle: VerifiedBundle, member: str) -> bytes:
    """The bytes of ``member`` of ``bundle`` as verified: read once, hashed, compared.

    Read from ``bundle.directory`` (its staged copy, or the bundle itself when verified in
    place) once, through the checked descriptor, and returned only when their sha256 is
    the one ``bundle``'s manifest gives ``member``: never other bytes than those verified,
    whatever happens to the file before or after (the bytes returned are those hashed).
    Costs one read and one sha256 of the member per call.

    Raises:
        MemberPathRefused: ``member`` is not listed in ``bundle``'s manifest.
        BundleChanged: the bytes read differ (or cannot be read): see
            :func:`member_changed`.
    """
    field = member_field(member)
    expected = bundle.manifest.files.get(member)
    if expected is None:
        raise MemberPathRefused(field, "is not a verified member", member)
    data, now = _read_once(bundle.directory, member, field)
    if now != expected:
        raise member_changed(bundle, member, now)
    return data


def member_changed(bundle: VerifiedBundle, member: str, now: str) -> BundleChanged:
    """The refusal of ``member`` of ``bundle`` read with sha256 ``now``, not the verified one.

    For a reader that hashes what it read against ``bundle``'s manifest itself (a worker
    reading its warm-up's examples): when the bundle's manifest was rewritten since it was
    verified, naming the manifest, the sha256 verified and the one now; else naming the
    file read (``bundle.path(member)``), the sha256 the manifest gives it and ``now``.

    Raises:
        MemberPathRefused: ``member`` is not listed in ``bundle``'s manifest.
    """
    return _member_changed(bundle.source, bundle.path(member), bundle.manifest.files[member],
                           bundle.manifest_sha256, now)


def _ensure_in_place_unchanged(bundle: VerifiedBundle, why: str) -> None:
    """Refuse ``bundle``, verified in place, when it changed since (a ``stat`` per file).

    Rewritten (its manifest's sha256 differs): naming the manifest, both sha256s and
    ``why``; else the first file that changed. A staged bundle is not checked.
    """
    if bundle.staged:
        return
    try:
        bundle.ensure_unchanged()
    except BundleChanged as changed:
        now = _manifest_now(bundle.source)
        if now != bundle.manifest_sha256:
            raise _rewritten(bundle.source, bundle.manifest_sha256, now, why) from changed
        raise


def check_loaded(bundle: VerifiedBundle) -> None:
    """Refuse ``bundle``, verified in place, when it changed before a worker's load ended.

    Called once the worker has loaded (its sessions made). The check before the worker
    starts (:meth:`VerifiedBundle.ensure_unchanged`) cannot see a file rewritten between
    it and the worker's own ``open`` of the graph and its weights; any write moves the
    file's ``ctime`` (which nobody can set back), so the same check made again once the
    load ended tells that what the worker opened is what was verified, to the resolution
    of that check (a ``stat`` per file: a same-size rewrite stamped within the tick of
    the file's last change before verification, or stores through a writable ``mmap``
    of it, are not seen, as before the load; docs/artifacts.md, "What a file-status
    check sees"). A staged bundle is not
    checked: the worker loaded the private copy, checked before it started. Costs a
    ``stat`` per file of the bundle, once per load.

    Raises:
        BundleChanged: verified in place and changed since. Rewritten (its manifest's
            sha256 differs): naming the manifest, the sha256 verified and the one now;
            else the first file that changed.
    """
    _ensure_in_place_unchanged(bundle, _LOAD)


def loaded_directory(bundle: VerifiedBundle) -> Path:
    """Where ``bundle``'s verified bytes are, for a read of one of its files (an asset).

    Its staged copy (the bytes hashed at verification, whatever the bundle on disk holds
    since); verified in place, the bundle itself, checked unchanged since the
    verification first (:meth:`VerifiedBundle.ensure_unchanged`: a ``stat`` per file).

    Raises:
        BundleChanged: verified in place and changed since. Rewritten (its manifest's
            sha256 differs): naming the manifest, the sha256 the stage loaded and the one
            now; else the first file that changed.
    """
    _ensure_in_place_unchanged(bundle, _READ)
    return bundle.directory


class BundleIdentities:
    """Bundle directory → the manifest sha256 a stage opened with, and that manifest.

    Shared by the stage's replicas and by its candidates (a restart that falls back to
    another candidate loads that candidate's bundle as the stage opened with it).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sha256: dict[Path, str] = {}
        self._manifests: dict[Path, ArtifactManifest] = {}

    def opened(self, root: str | os.PathLike[str]) -> str | None:
        """The manifest sha256 the stage opened ``root`` with, or None."""
        with self._lock:
            found = self._sha256.get(_root(root))
        return None if found == _UNREADABLE else found

    def manifest(self, root: str | os.PathLike[str]) -> ArtifactManifest | None:
        """The manifest the stage verified for ``root`` (its files' sha256s), or None.

        What loaded, whatever the bundle on disk holds now: the execution plan judges the
        stage's evidence on it (:func:`edge_core.runtime.evidence.evidence_of`). None
        until a verification of ``root`` passed inside the stage's pin.
        """
        with self._lock:
            return self._manifests.get(_root(root))

    def expect(self, directory: str | os.PathLike[str], sha256: str | None) -> None:
        """Take ``sha256`` as the manifest the stage opened ``directory`` with, unless set.

        For a bundle read, not verified, when the stage opened (a candidate its open did
        not try): a later verification of it passes only with that manifest. ``None``:
        the manifest could not be read then; every later verification is refused.
        """
        with self._lock:
            self._sha256.setdefault(_root(directory),
                                    _UNREADABLE if sha256 is None else sha256)

    def observe(self, bundle: VerifiedBundle) -> None:
        """Record ``bundle``'s manifest sha256 the first time; refuse a different one.

        Raises:
            BundleChanged: naming the manifest file, the sha256 the stage opened with
                (in the reason) and the one verified now (the value).
        """
        with self._lock:
            opened = self._sha256.setdefault(bundle.source, bundle.manifest_sha256)
            if opened == bundle.manifest_sha256:
                self._manifests.setdefault(bundle.source, bundle.manifest)
        if opened != bundle.manifest_sha256:
            raise _rewritten(bundle.source, opened, bundle.manifest_sha256, _RESTART)


class BundlePin:
    """One stage replica's pin: the stage's identities and the staged copies it keeps.

    Args:
        identities: The stage's :class:`BundleIdentities` (shared by its replicas).
    """

    def __init__(self, identities: BundleIdentities | None = None) -> None:
        self.identities = identities if identities is not None else BundleIdentities()
        self._lock = threading.Lock()
        self._kept: dict[Path, VerifiedBundle] = {}

    @contextlib.contextmanager
    def active(self, bundle: str | os.PathLike[str] | None = None) -> Iterator[BundlePin]:
        """While open, verifications observe and reissue through the pin.

        Those in this thread, of any bundle; and those of ``bundle`` (the stage's bundle
        directory, when it has one) in any thread (see the module's docstring).
        """
        token = _ACTIVE.set(self)
        root = None if bundle is None else _root(bundle)
        if root is not None:
            with _LOADS_LOCK:
                _LOADS.setdefault(root, []).append(self)
        try:
            yield self
        finally:
            if root is not None:
                with _LOADS_LOCK:
                    loads = _LOADS[root]
                    loads.remove(self)
                    if not loads:
                        del _LOADS[root]
            _ACTIVE.reset(token)

    def keep(self, loaded: object) -> None:
        """Keep a handle on ``loaded``'s staged copy (its ``bundle``), if it has one.

        Only a staged :class:`VerifiedBundle` whose manifest is the one the stage opened
        with, and only one per bundle directory (the first).
        """
        bundle = getattr(loaded, "bundle", None)
        if not isinstance(bundle, VerifiedBundle) or not bundle.staged or bundle.cleaned_up:
            return
        if self.identities.opened(bundle.source) != bundle.manifest_sha256:
            return
        with self._lock:
            if bundle.source in self._kept:
                return
            handle = bundle.share()
            if handle is not None:
                self._kept[bundle.source] = handle

    def kept(self) -> dict[str, str]:
        """Bundle directory → where its kept staged copy is (for reports and tests)."""
        with self._lock:
            return {str(root): str(b.directory) for root, b in self._kept.items()}

    def directory(self, bundle: str | os.PathLike[str]) -> Path | None:
        """Where the kept copy of ``bundle`` is (its verified manifest and members), or None.

        What a report reads for the bundle that serves: the bundle on disk may have been
        rewritten since the stage opened.
        """
        with self._lock:
            held = self._kept.get(Path(os.path.realpath(bundle)))
        return None if held is None else held.directory

    def read(self, bundle: str | os.PathLike[str], member: str) -> bytes | None:
        """The bytes of ``member`` of ``bundle`` as the stage verified them when it loaded.

        Read from the copy the pin keeps, else from the bundle on disk (verified in place,
        or a backend that keeps no copy), and checked either way against the sha256 that
        the manifest the stage verified gives ``member``
        (:meth:`BundleIdentities.manifest`): never other bytes than those loaded.
        ``None`` when no verification of ``bundle`` is recorded (a backend that verifies
        nothing through edge-core): nothing says what loaded.

        Raises:
            BundleChanged: the bytes differ (or cannot be read): when the bundle was
                rewritten since (its manifest's sha256 differs), naming the manifest,
                the sha256 the stage opened with and the one now; else naming the file,
                the sha256 the verified manifest gives it and the one read now.
            MemberPathRefused: ``member`` is not listed in the verified manifest.
        """
        root = _root(bundle)
        manifest = self.identities.manifest(root)
        if manifest is None:
            return None
        field = member_field(member)
        expected = manifest.files.get(member)
        if expected is None:
            raise MemberPathRefused(field, "is not a verified member", member)
        where = self.directory(root) or root
        data, now = _read_once(where, member, field)
        if now == expected:
            return data
        raise _member_changed(root, where.joinpath(*member.split("/")), expected,
                              self.identities.opened(root), now)

    def reissue(self, root: Path) -> VerifiedBundle | None:
        """A handle on the kept copy of ``root`` (checked byte for byte), else None.

        A kept copy that no longer holds the verified bytes is released.
        """
        with self._lock:
            held = self._kept.get(root)
        if held is None:
            return None
        handle = held.reissue()
        if handle is None:
            with self._lock:
                if self._kept.get(root) is held:
                    del self._kept[root]
            held.cleanup()
        return handle

    def release(self) -> None:
        """Release every kept copy (idempotent); each is removed once no handle uses it."""
        with self._lock:
            kept, self._kept = list(self._kept.values()), {}
        for bundle in kept:
            bundle.cleanup()


def _pins(root: Path) -> list[BundlePin]:
    """The pins a verification of ``root`` answers to.

    This thread's active pin, else the pins of every load running on ``root`` now (in any
    thread).
    """
    pin = _ACTIVE.get()
    if pin is not None:
        return [pin]
    with _LOADS_LOCK:
        return list(_LOADS.get(root, ()))


def observe(bundle: VerifiedBundle) -> None:
    """Check ``bundle`` against the identities of the pins it answers to (none: nothing).

    Raises:
        BundleChanged: a stage opened with another manifest (see :class:`BundlePin`).
    """
    seen: list[BundleIdentities] = []
    for pin in _pins(bundle.source):
        if not any(pin.identities is other for other in seen):
            seen.append(pin.identities)
            pin.identities.observe(bundle)


def reissue(directory: str | os.PathLike[str], *, stage: bool) -> VerifiedBundle | None:
    """The kept copy of ``directory`` for a staged load, else None.

    From the pin the verification answers to; none when it answers to the pins of
    several stages (which one it serves cannot be told), so that it is verified afresh.
    """
    if not stage:
        return None
    root = _root(directory)  # a copy is kept even if the bundle is gone
    pins = _pins(root)
    if not pins or any(pin.identities is not pins[0].identities for pin in pins):
        return None
    for pin in pins:
        handle = pin.reissue(root)
        if handle is not None:
            return handle
    return None
