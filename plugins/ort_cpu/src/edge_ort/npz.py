"""Reading a bundle's ``.npz`` example inputs and reference outputs without ``zipfile``.

``numpy.load`` opens an ``.npz`` through :mod:`zipfile`, whose imports (pathlib, shutil,
bz2, lzma, urllib...) cost ~7 ms of a fresh worker's start-up on the 2-vCPU development
machine — more than creating a small session. The files ``numpy.savez`` and
``numpy.savez_compressed`` write are plain archives: this reads their central directory
with :mod:`struct`, checks every member's CRC-32 and parses each ``.npy`` member with
``numpy.lib.format`` (imported with numpy). Anything else (zip64, encryption, another
compression, a member that is not ``.npy``, a duplicate name, a CRC mismatch, a
truncated file) falls back to ``numpy.load``, which then reads or refuses it as it
always did.

Worker side: imports only numpy and the standard library.
"""

from __future__ import annotations

import io
import struct
import zlib
from typing import Any

import numpy as np

__all__ = ["load_npz"]

_EOCD = struct.Struct("<IHHHHIIH")  # end of central directory (no comment after it here)
_EOCD_SIG = 0x06054B50
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")
_CENTRAL_SIG = 0x02014B50
_LOCAL = struct.Struct("<IHHHHHIIIHH")
_LOCAL_SIG = 0x04034B50
_STORED, _DEFLATED = 0, 8
_MAX_COMMENT = 0xFFFF


class _Unsupported(Exception):
    """Not an archive this reader handles: ``numpy.load`` decides."""


def load_npz(path: str) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file, by name (``.npy`` stripped), as writable copies."""
    with open(path, "rb") as handle:
        data = handle.read()
    try:
        members = _members(data)
        return {name: np.array(_array(data, *where)) for name, where in members.items()}
    except (_Unsupported, struct.error, zlib.error, UnicodeDecodeError):
        with np.load(path, allow_pickle=False) as archive:
            return {name: np.array(archive[name]) for name in archive.files}


def _end_record(data: bytes) -> tuple[int, int, int]:
    """``(entries, central directory size, central directory offset)``."""
    start = data.rfind(struct.pack("<I", _EOCD_SIG), max(0, len(data) - _EOCD.size - _MAX_COMMENT))
    if start < 0:
        raise _Unsupported("no end record")
    (_, disk, cd_disk, here, entries, size, offset, comment) = _EOCD.unpack_from(data, start)
    if disk or cd_disk or here != entries or start + _EOCD.size + comment != len(data):
        raise _Unsupported("multi-disk archive or trailing bytes")
    if entries == 0xFFFF or size == 0xFFFFFFFF or offset == 0xFFFFFFFF:
        raise _Unsupported("zip64")
    if offset + size != start:
        raise _Unsupported("central directory not right before the end record")
    return entries, size, offset


def _members(data: bytes) -> dict[str, tuple[int, int, int, int, int]]:
    """Name → (method, data offset, compressed size, size, crc) of every ``.npy`` member."""
    entries, _, position = _end_record(data)
    members: dict[str, tuple[int, int, int, int, int]] = {}
    for _ in range(entries):
        (sig, _made, _needed, flags, method, _time, _date, crc, compressed, size, name_len,
         extra_len, comment_len, disk, _internal, _external, local) = _CENTRAL.unpack_from(
            data, position)
        if sig != _CENTRAL_SIG or disk:
            raise _Unsupported("central directory entry")
        raw_name = data[position + _CENTRAL.size: position + _CENTRAL.size + name_len]
        position += _CENTRAL.size + name_len + extra_len + comment_len
        if flags & 0x1 or method not in (_STORED, _DEFLATED):
            raise _Unsupported("encrypted or compression method")
        if 0xFFFFFFFF in (compressed, size, local):
            raise _Unsupported("zip64 member")
        # zipfile's rule (UTF-8 when flagged, else cp437); ASCII spares the codec import
        encoding = "utf-8" if flags & 0x800 else "ascii" if raw_name.isascii() else "cp437"
        name = raw_name.decode(encoding)
        if not name.endswith(".npy") or name[:-4] in members:
            raise _Unsupported("member name")
        lsig, *_rest, lname_len, lextra_len = _LOCAL.unpack_from(data, local)
        if lsig != _LOCAL_SIG:
            raise _Unsupported("local header")
        start = local + _LOCAL.size + lname_len + lextra_len
        if start + compressed > len(data):
            raise _Unsupported("truncated")
        members[name[:-4]] = (method, start, compressed, size, crc)
    return members


def _array(data: bytes, method: int, start: int, compressed: int, size: int,
           crc: int) -> Any:
    raw = data[start:start + compressed]
    if method == _DEFLATED:
        inflater = zlib.decompressobj(-15)
        raw = inflater.decompress(raw, size + 1)
        if not inflater.eof:
            raise _Unsupported("deflate stream")
    if len(raw) != size or zlib.crc32(raw) != crc:
        raise _Unsupported("size or CRC-32 mismatch")
    return np.lib.format.read_array(io.BytesIO(raw), allow_pickle=False)
