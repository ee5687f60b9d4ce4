"""Bounds on ``.npz`` archives, checked before a single array byte is allocated.

An ``.npz`` comes from an artifact bundle, which edge-core does not trust. Its zip
directory *declares* each member's size, and a deflated member can declare a thousand
times the bytes it stores: a 2 MB file can ask for 2 GiB. Every reader here (the
verifier's in ``edge_core.artifacts`` and the worker's in ``edge_ort.npz``) applies
the same bounds first, and refuses with :class:`~edge_contracts.errors.ArchiveRefused`:

- each member declares at most :data:`NPZ_MAX_ARRAY_BYTES` (1 GiB) uncompressed;
- all members together at most :data:`NPZ_MAX_TOTAL_BYTES` (2 GiB);
- a deflated member declares at most :data:`NPZ_MAX_RATIO` (128) times the bytes it
  stores, or :data:`NPZ_RATIO_FLOOR` (16 MiB), whichever is more; the deflated members
  of one archive together likewise, with a floor of :data:`NPZ_TOTAL_RATIO_FLOOR`
  (64 MiB). So mostly-zero arrays of a few MiB still load, and a small file inflates
  to at most 64 MiB or 128 times its size;
- each member's ``.npy`` header describes exactly the bytes the member declares
  (``header + prod(shape) * itemsize``), so the array a reader allocates is never
  larger than what the directory declared (:func:`check_npy_header`).

The module imports only the standard library; :func:`check_npz_file` imports
``zipfile`` and numpy when called.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from edge_contracts.errors import ArchiveRefused

__all__ = [
    "NPZ_MAX_ARRAY_BYTES",
    "NPZ_MAX_RATIO",
    "NPZ_MAX_TOTAL_BYTES",
    "NPZ_RATIO_FLOOR",
    "NPZ_TOTAL_RATIO_FLOOR",
    "check_members",
    "check_npy_header",
    "check_npz_file",
]

NPZ_MAX_ARRAY_BYTES = 1 << 30
"""Most uncompressed bytes one member may declare."""

NPZ_MAX_TOTAL_BYTES = 2 << 30
"""Most uncompressed bytes all members of one archive may declare together."""

NPZ_MAX_RATIO = 128
"""Most declared bytes per stored byte of a deflated member (above the floors)."""

NPZ_RATIO_FLOOR = 16 << 20
"""A deflated member may always declare this many bytes, whatever it stores."""

NPZ_TOTAL_RATIO_FLOOR = 64 << 20
"""The deflated members of one archive may always declare this many bytes together."""


def check_members(members: Iterable[tuple[str, int, int, bool]], field: str) -> None:
    """Check ``(name, declared, stored, deflated)`` of every member against the bounds.

    Raises:
        ArchiveRefused: naming ``field[name]``, the declared bytes and the bound broken.

    """
    total = packed_declared = packed_stored = 0
    for name, declared, stored, deflated in members:
        where = f"{field}[{name!r}]"
        if declared > NPZ_MAX_ARRAY_BYTES:
            raise ArchiveRefused(
                where, declared, f"declares more than {NPZ_MAX_ARRAY_BYTES} bytes uncompressed"
            )
        if deflated and declared > max(NPZ_MAX_RATIO * stored, NPZ_RATIO_FLOOR):
            raise ArchiveRefused(
                where, declared,
                f"declares more than {NPZ_MAX_RATIO} x its {stored} stored bytes "
                f"(and more than {NPZ_RATIO_FLOOR})",
            )
        total += declared
        if deflated:
            packed_declared += declared
            packed_stored += stored
    if total > NPZ_MAX_TOTAL_BYTES:
        raise ArchiveRefused(
            field, total, f"members declare more than {NPZ_MAX_TOTAL_BYTES} bytes together"
        )
    if packed_declared > max(NPZ_MAX_RATIO * packed_stored, NPZ_TOTAL_RATIO_FLOOR):
        raise ArchiveRefused(
            field, packed_declared,
            f"deflated members declare more than {NPZ_MAX_RATIO} x their {packed_stored} "
            f"stored bytes (and more than {NPZ_TOTAL_RATIO_FLOOR})",
        )


def check_npy_header(
    shape: tuple[int, ...], itemsize: int, header_bytes: int, declared: int, where: str
) -> None:
    """Refuse an ``.npy`` header whose array is not exactly the member's declared bytes.

    Raises:
        ArchiveRefused: naming ``where``, the array's bytes and the declared size.

    """
    nbytes = math.prod(shape) * itemsize
    if header_bytes + nbytes != declared:
        raise ArchiveRefused(
            where, nbytes,
            f"the .npy header's array must fill the member's declared {declared} bytes "
            f"(after its {header_bytes}-byte header)",
        )


def check_npz_file(path: Any, field: str) -> None:
    """Check the archive at ``path`` (a path or binary file) before ``numpy.load`` reads it.

    Reads the zip directory and each member's ``.npy`` header only (a deflated member
    is inflated just far enough for its header).

    Raises:
        ArchiveRefused: a bound above is broken.
        zipfile.BadZipFile, ValueError, OSError, EOFError: what ``zipfile`` and numpy
            raise for an archive or ``.npy`` header they cannot read (as ``numpy.load``
            would).

    """
    import zipfile

    import numpy as np

    with zipfile.ZipFile(path) as archive:
        infos = archive.infolist()
        check_members(
            ((i.filename, i.file_size, i.compress_size, i.compress_type != 0)
             for i in infos),
            field,
        )
        for info in infos:
            where = f"{field}[{info.filename!r}]"
            with archive.open(info) as member:
                if member.read(6) != b"\x93NUMPY":
                    continue  # not .npy: numpy.load hands back its raw bytes
                member.seek(0)
                version = np.lib.format.read_magic(member)
                if version == (1, 0):
                    shape, _, dtype = np.lib.format.read_array_header_1_0(member)
                elif version == (2, 0):
                    shape, _, dtype = np.lib.format.read_array_header_2_0(member)
                else:
                    raise ArchiveRefused(
                        where, list(version), ".npy version must be 1.0 or 2.0"
                    )
                if not dtype.hasobject:  # object arrays: numpy.load refuses them
                    check_npy_header(
                        shape, dtype.itemsize, member.tell(), info.file_size, where
                    )
