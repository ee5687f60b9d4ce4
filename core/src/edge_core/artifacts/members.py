"""Bundle members on disk: safe relative paths, opening without escaping, listing a bundle.

A member path is checked twice. Syntactically (by ``edge_contracts.manifest``): relative,
``/``-separated, no ``..``/``.``/empty segments, no backslash, no colon. Then on disk: the
fully resolved path (every symlink, including symlinked parent directories) must lie
inside the resolved bundle root, and the file is opened with ``O_NOFOLLOW`` and checked
again *through the open descriptor* (``/proc/self/fd`` on Linux, else device and inode
against the resolved path), so a symlink swapped in between the check and the open is
caught. The open descriptor is what gets hashed.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import attrs

from edge_contracts.errors import InvalidValue
from edge_contracts.manifest import MANIFEST_FILENAME, MAX_FILES, validate_relative_path
from edge_core.artifacts.errors import MemberMissing, MemberPathRefused

__all__ = [
    "Fingerprint",
    "OpenMember",
    "bundle_root",
    "check_member_path",
    "fingerprint",
    "list_bundle_files",
    "member_field",
    "open_member",
    "resolve_member",
]

_OPEN_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_NONBLOCK", 0)  # a FIFO swapped in must not block the open
    | getattr(os, "O_BINARY", 0)
)


@attrs.frozen
class Fingerprint:
    """What identifies one version of a file without reading it.

    ``ctime_ns`` changes on every write and cannot be set back by the user, so a file
    rewritten with the same size and a restored mtime still gets a new fingerprint.
    """

    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int


def fingerprint(result: os.stat_result) -> Fingerprint:
    """The fingerprint of a ``stat``/``fstat`` result."""
    return Fingerprint(
        result.st_dev, result.st_ino, result.st_size, result.st_mtime_ns, result.st_ctime_ns
    )


def member_field(path: str) -> str:
    """The field name used in errors about member ``path``."""
    return f"manifest.files[{json.dumps(path)}]"


def bundle_root(directory: str | os.PathLike[str]) -> Path:
    """The resolved bundle directory; refuses a path that is not an existing directory."""
    root = Path(os.path.realpath(directory))
    if not root.is_dir():
        raise MemberMissing("bundle", "must be an existing directory", str(directory))
    return root


def check_member_path(path: str, field: str) -> str:
    """Apply the syntactic rules of a member path; refusals are :class:`MemberPathRefused`."""
    try:
        return validate_relative_path(path, field)
    except InvalidValue as exc:
        raise MemberPathRefused(exc.field, exc.reason, exc.value) from None


def resolve_member(root: Path, path: str, field: str) -> Path:
    """Check ``path`` and return its fully resolved location, which must be inside ``root``."""
    check_member_path(path, field)
    resolved = Path(os.path.realpath(root.joinpath(*path.split("/"))))
    if not resolved.is_relative_to(root):
        raise MemberPathRefused(
            field, "resolves outside the bundle (symlink escape)", f"{path} -> {resolved}"
        )
    return resolved


@attrs.frozen
class OpenMember:
    """A member opened for reading: its descriptor (owned by the caller) and identity."""

    fd: int
    resolved: Path
    fingerprint: Fingerprint


def _opened_path(fd: int) -> Path | None:
    try:
        return Path(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        return None


def open_member(root: Path, path: str, field: str) -> OpenMember:
    """Open member ``path`` of the bundle at ``root`` for reading, refusing any escape.

    The caller closes ``fd``. Refused: a bad path, a resolved path outside the bundle, a
    missing file, anything but a regular file, and a path changed during the open.
    """
    resolved = resolve_member(root, path, field)
    try:
        fd = os.open(resolved, _OPEN_FLAGS)
    except FileNotFoundError:
        raise MemberMissing(field, "listed in the manifest but not in the bundle", path) from None
    except OSError as exc:
        raise MemberPathRefused(field, f"cannot be opened safely ({exc.strerror})", path) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise MemberPathRefused(field, "must be a regular file", f"{path} -> {resolved}")
        opened = _opened_path(fd)
        if opened is not None:
            if not opened.is_relative_to(root):
                raise MemberPathRefused(
                    field, "opened file lies outside the bundle (symlink escape)",
                    f"{path} -> {opened}",
                )
        else:
            now = os.stat(resolved, follow_symlinks=False)
            if (now.st_dev, now.st_ino) != (info.st_dev, info.st_ino):
                raise MemberPathRefused(field, "changed while it was opened", path)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return OpenMember(fd, resolved, fingerprint(info))


def _relative(root: Path, full: Path) -> str:
    return full.relative_to(root).as_posix()


def list_bundle_files(root: Path, *, strict: bool = True) -> list[str]:
    """Every file of the bundle at ``root`` as a sorted relative path, without the manifest.

    Regular files are listed, and symlinks to regular files inside the bundle (under the
    link's own path). With ``strict`` (what manifest creation uses) anything else is
    refused: a symlink leading outside the bundle, a symlinked directory, a special file,
    a name that is not a valid member path, more than ``MAX_FILES`` files (said so: the
    walk stops at the first file over the limit, it does not count them all). Without
    ``strict`` (used to name the files a manifest does not list), such entries are listed
    too: whatever is in the folder, a manifest cannot list them, so they are never loaded.
    """
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        for name in sorted(dirnames):
            full = here / name
            if full.is_symlink():
                if strict:
                    raise MemberPathRefused(
                        "bundle", "symlinked directories are not supported in a bundle",
                        _relative(root, full),
                    )
                found.append(_relative(root, full))
        for name in sorted(filenames):
            full = here / name
            rel = _relative(root, full)
            if rel == MANIFEST_FILENAME:
                continue
            try:
                _check_listed(root, full, rel)
            except MemberPathRefused:
                if strict:
                    raise
            found.append(rel)
            if strict and len(found) > MAX_FILES:  # the walk stops here: not a total
                raise MemberPathRefused("bundle", f"must hold <= {MAX_FILES} files",
                                        f"more than {MAX_FILES}")
    return sorted(found)


def _check_listed(root: Path, full: Path, rel: str) -> None:
    field = member_field(rel)
    check_member_path(rel, field)
    info = os.lstat(full)
    if stat.S_ISLNK(info.st_mode):
        resolved = resolve_member(root, rel, field)
        try:
            target = os.stat(resolved)
        except OSError:
            raise MemberPathRefused(field, "symlink target does not exist", rel) from None
        if not stat.S_ISREG(target.st_mode):
            raise MemberPathRefused(field, "symlink must lead to a regular file", rel)
    elif not stat.S_ISREG(info.st_mode):
        raise MemberPathRefused(field, "must be a regular file", rel)
