"""The names, dtypes and shapes of an ``.npz`` archive's arrays, read without loading them.

The verifier needs only what each array *is* (to build the served shape set), not its
values, so :func:`read_npz_headers` reads each member's ``.npy`` header with
``numpy.lib.format`` and streams the rest of the member through ``zipfile`` in bounded
chunks without keeping it: nothing the size of an array is allocated, yet every check a
full ``numpy.load(..., allow_pickle=False)`` made is still made, with the same errors:

- first the bounds of :mod:`edge_contracts.npz_limits` (:func:`check_npz_file`), on the
  same open file that is read afterwards;
- an object dtype (anywhere in the dtype) is refused with numpy's own ``ValueError``
  ("Object arrays cannot be loaded when allow_pickle=False"): pickle is never involved;
- a member whose data ends early is refused (``EOFError``), and one whose bytes do not
  match their CRC-32 (``zipfile.BadZipFile``), because every member is read to its end;
- a member that does not start with the ``.npy`` magic is read as raw bytes, as
  ``numpy.load`` hands it back; one that does is an array, whatever its name.

Names follow ``numpy.load``: a member ``x.npy`` is the array ``x``, in archive order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import IO, Any

import attrs

__all__ = ["ArrayHeader", "read_npz_headers"]

_CHUNK = 1 << 20
"""Bytes read at a time while streaming a member's data to its end (its CRC check)."""

_NPY_MAGIC = b"\x93NUMPY"


@attrs.frozen
class ArrayHeader:
    """One member of an ``.npz``: its ``.npy`` dtype and shape, or its raw bytes.

    Attributes:
        dtype: the array's dtype as the header declares it (never an object dtype);
            ``None`` for a member that is not ``.npy``.
        shape: the array's shape as the header declares it (``()`` when not ``.npy``).
        raw: the member's bytes when it is not an ``.npy`` file (else ``None``).

    """

    dtype: Any
    shape: tuple[int, ...]
    raw: bytes | None = None


def _drain(member: IO[bytes]) -> None:
    """Read ``member`` to its end in bounded chunks (``zipfile`` checks length and CRC)."""
    while member.read(_CHUNK):
        pass


def _header(member: IO[bytes], where: str) -> tuple[tuple[int, ...], Any]:
    import numpy as np

    from edge_contracts.errors import ArchiveRefused

    version = np.lib.format.read_magic(member)
    if version == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(member)
    elif version == (2, 0):
        shape, _, dtype = np.lib.format.read_array_header_2_0(member)
    else:  # check_npz_file refuses these first; kept so this reader stands alone
        raise ArchiveRefused(where, list(version), ".npy version must be 1.0 or 2.0")
    if dtype.hasobject:
        raise ValueError("Object arrays cannot be loaded when allow_pickle=False")
    return tuple(int(d) for d in shape), dtype


def read_npz_headers(handle: IO[bytes], field: str) -> Mapping[str, ArrayHeader]:
    """Every array of the ``.npz`` open as ``handle``: name -> :class:`ArrayHeader`.

    ``handle`` is a seekable binary file positioned anywhere; it is read from the start.

    Raises:
        ArchiveRefused: a bound of :mod:`edge_contracts.npz_limits` is broken.
        ValueError: an object dtype (pickle stays off), or a header numpy cannot read.
        zipfile.BadZipFile, OSError, EOFError: not a zip archive, a member whose bytes
            fail their CRC-32, a member cut short (as ``numpy.load`` would raise them).

    """
    import zipfile

    from edge_contracts.npz_limits import check_npz_file

    handle.seek(0)
    check_npz_file(handle, field)
    handle.seek(0)
    found: dict[str, ArrayHeader] = {}
    with zipfile.ZipFile(handle) as archive:
        for info in archive.infolist():
            name = info.filename
            with archive.open(info) as member:
                key = name[:-4] if name.endswith(".npy") else name
                if member.read(len(_NPY_MAGIC)) == _NPY_MAGIC:
                    member.seek(0)
                    shape, dtype = _header(member, f"{field}[{name!r}]")
                    _drain(member)
                    found[key] = ArrayHeader(dtype, shape)
                else:  # numpy.load hands back the raw bytes
                    member.seek(0)
                    found[key] = ArrayHeader(None, (), member.read())
    return found
