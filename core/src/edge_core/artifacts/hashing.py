"""Hashing bundle members, optionally copying the very bytes that are hashed.

Each member is read once through the descriptor that :func:`open_member` checked. When a
destination is given, every chunk is written there from the same buffer that was fed to
sha256, so the copy holds exactly the bytes whose digest was computed. The source's
fingerprint is taken before and after reading; a size or fingerprint change in between
is refused as :class:`BundleChanged`.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import attrs

from edge_core.artifacts.errors import BundleChanged
from edge_core.artifacts.members import (
    Fingerprint,
    fingerprint,
    member_field,
    open_member,
)
from edge_core.progress import Progress

__all__ = ["CHUNK_BYTES", "HashedMember", "hash_member", "sha256_path"]

CHUNK_BYTES = 1 << 20
"""Read size for hashing and copying."""

_CREATE_FLAGS = (
    os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
)


@attrs.frozen
class HashedMember:
    """One member after hashing.

    Attributes:
        path: the member's relative path (a key of the manifest's files).
        sha256: lowercase hex digest of its bytes.
        size: its size in bytes.
        source: the fingerprint of the bundle's file when it was read.
        copy: the fingerprint of the copy, when one was written.

    """

    path: str
    sha256: str
    size: int
    source: Fingerprint
    copy: Fingerprint | None = None


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        written = os.write(fd, view)
        view = view[written:]


def hash_member(
    root: Path,
    path: str,
    *,
    copy_to: Path | None = None,
    progress: Progress | None = None,
) -> HashedMember:
    """Hash member ``path`` of the bundle at ``root``; with ``copy_to``, copy it there too.

    ``copy_to`` must not exist (it is created with mode 0600, then made read-only).
    """
    field = member_field(path)
    member = open_member(root, path, field)
    digest = hashlib.sha256()
    buffer = bytearray(CHUNK_BYTES)
    view = memoryview(buffer)
    size = 0
    out = -1
    try:
        if copy_to is not None:
            out = os.open(copy_to, _CREATE_FLAGS, 0o600)
        while True:
            count = os.readv(member.fd, [buffer])
            if count == 0:
                break
            chunk = view[:count]
            digest.update(chunk)
            if out >= 0:
                _write_all(out, chunk)
            size += count
            if progress is not None:
                progress.update(count, note=path)
        after = fingerprint(os.fstat(member.fd))
        copy = None
        if out >= 0:
            os.fchmod(out, 0o400)
            copy = fingerprint(os.fstat(out))
    finally:
        os.close(member.fd)
        if out >= 0:
            os.close(out)
    if after != member.fingerprint or size != member.fingerprint.size:
        raise BundleChanged(field, "changed while it was being hashed", path)
    return HashedMember(path, digest.hexdigest(), size, member.fingerprint, copy)


def sha256_path(path: Path, *, progress: Progress | None = None) -> str:
    """The sha256 hex digest of the file at ``path`` (used to re-hash a staged copy)."""
    digest = hashlib.sha256()
    buffer = bytearray(CHUNK_BYTES)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        while count := handle.readinto(buffer):
            digest.update(view[:count])
            if progress is not None:
                progress.update(count, note=path.name)
    return digest.hexdigest()
