"""One verification of a bundle per open, shared by the replicas that load it.

A stage with ``replicas = N`` loads the same bundle N times while the pipeline opens;
each load used to verify it from scratch (hash every byte, parse the graph, read the
examples). Inside :func:`verification_scope` (the opener holds one around starting its
stages), :func:`verify_once` verifies a bundle the first time it is asked and hands every
later request for the same bundle a handle on that verification
(:meth:`~edge_core.artifacts.bundle.VerifiedBundle.share`) — after checking that nothing
changed since: :meth:`~edge_core.artifacts.bundle.VerifiedBundle.ensure_unchanged`, the
same fingerprint check (device, inode, size, mtime and ctime of the manifest and every
member, and of the staged copy) the loader runs right before each worker starts. On any
change the bundle is verified again in full, so it is refused exactly as a fresh
verification refuses it.

"The same bundle" means the same resolved directory, the same staging choice and the
same staging root. Concurrent requests for one bundle wait for the first verification
rather than repeat it; a verification that fails is not kept (the next request verifies
and fails again by itself). Outside a scope :func:`verify_once` is :func:`verify_bundle`.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from edge_core.artifacts.bundle import VerifiedBundle
from edge_core.artifacts.errors import BundleChanged
from edge_core.artifacts.members import bundle_root
from edge_core.artifacts.pins import observe, reissue
from edge_core.artifacts.verify import verify_bundle
from edge_core.progress import Progress

__all__ = ["SharedVerifications", "verification_scope", "verify_once"]

_Key = tuple[Path, bool, str | None]


class SharedVerifications:
    """Verified bundles by identity, each verified once and shared while held.

    Attributes:
        verified: how many full verifications this object ran.
        shared: how many requests were answered with a handle on an earlier one.

    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._key_locks: dict[_Key, threading.Lock] = {}
        self._held: dict[_Key, VerifiedBundle] = {}
        self.verified = 0
        self.shared = 0

    def verify(
        self,
        directory: str | os.PathLike[str],
        *,
        stage: bool = True,
        staging_root: str | os.PathLike[str] | None = None,
        progress: Progress | None = None,
    ) -> VerifiedBundle:
        """A verified bundle for ``directory``: shared if verified here and unchanged.

        Arguments and errors are :func:`~edge_core.artifacts.verify.verify_bundle`'s; the
        caller cleans up the handle it gets, as it would a fresh verification.
        """
        root = bundle_root(directory)
        key = (root, stage, None if staging_root is None else os.path.realpath(staging_root))
        with self._lock:
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:
            held = self._held.pop(key, None)
            if held is not None:
                handle = self._reuse(held)
                if handle is not None:
                    self._held[key] = held
                    self.shared += 1
                    try:
                        observe(handle)  # verify_bundle observed the first one
                    except BaseException:
                        handle.cleanup()
                        raise
                    return handle
            bundle = verify_bundle(directory, stage=stage, staging_root=staging_root,
                                   progress=progress)
            self.verified += 1
            handle = bundle.share()
            if handle is None:  # cannot happen for a fresh bundle; never hand out a gone copy
                bundle.cleanup()
                raise BundleChanged("bundle", "staged copy vanished after verification",
                                    str(root))
            self._held[key] = bundle
            return handle

    @staticmethod
    def _reuse(held: VerifiedBundle) -> VerifiedBundle | None:
        """A handle on ``held`` if nothing changed since its verification, else None."""
        try:
            held.ensure_unchanged()
        except BundleChanged:
            held.cleanup()
            return None
        handle = held.share()
        if handle is None:
            held.cleanup()
        return handle

    def close(self) -> None:
        """Release this object's own handles (the copies go once their users release)."""
        with self._lock:
            held, self._held = list(self._held.values()), {}
        for bundle in held:
            bundle.cleanup()


class _Scope:
    """The process's active :class:`SharedVerifications`, counted by nested scopes."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.depth = 0
        self.active: SharedVerifications | None = None

    def enter(self) -> SharedVerifications:
        with self.lock:
            if self.active is None:
                self.active = SharedVerifications()
            self.depth += 1
            return self.active

    def leave(self) -> None:
        with self.lock:
            self.depth -= 1
            ending = self.active if self.depth == 0 else None
            if ending is not None:
                self.active = None
        if ending is not None:
            ending.close()


_SCOPE = _Scope()


@contextlib.contextmanager
def verification_scope() -> Iterator[SharedVerifications]:
    """While open (in any thread), :func:`verify_once` shares verifications of a bundle.

    Scopes nest and overlap across threads: the shared verifications end when the last
    open scope closes.
    """
    shared = _SCOPE.enter()
    try:
        yield shared
    finally:
        _SCOPE.leave()


def verify_once(
    directory: str | os.PathLike[str],
    *,
    stage: bool = True,
    staging_root: str | os.PathLike[str] | None = None,
    progress: Progress | None = None,
) -> VerifiedBundle:
    """:func:`verify_bundle`, shared with earlier requests inside a :func:`verification_scope`.

    Inside a stage's restart (:mod:`edge_core.artifacts.pins`) a staged load gets the
    staged copy the stage kept since it opened, checked byte for byte, whatever the
    bundle on disk holds now.
    """
    kept = reissue(directory, stage=stage)
    if kept is not None:
        return kept
    with _SCOPE.lock:
        active = _SCOPE.active
    if active is None:
        return verify_bundle(directory, stage=stage, staging_root=staging_root,
                             progress=progress)
    return active.verify(directory, stage=stage, staging_root=staging_root, progress=progress)
