"""Reading a bundle's ``.npz`` example inputs and reference outputs without ``zipfile``.

``numpy.load`` opens an ``.npz`` through :mod:`zipfile`, whose imports (shutil, bz2,
lzma, ...) cost ~7 ms of a fresh worker's start-up on the 2-vCPU development machine —
more than creating a small session. The archives ``numpy.savez`` and
``numpy.savez_compressed`` write are simple: this reads their central directory with
:mod:`struct` from a read-only memory map, checks each member's local header against it,
its CRC-32 and its ``.npy`` header, and copies each array once into memory of its own.

It handles only what it fully checks; anything else goes to ``numpy.load``, which then
reads or refuses the file exactly as before: zip64 or multi-disk archives, encryption,
compression other than deflate, a member that is not ``.npy`` (or whose bytes are not),
duplicate names, members that overlap or whose local name differs, a size or CRC-32
mismatch, object arrays, truncated files. Pickle is never enabled on either path, and
both apply the bounds of :mod:`edge_contracts.npz_limits` before allocating an array.

Given the sha256 the verified manifest gives the file, the reader reads the file once
into memory, hashes those bytes and parses them (never the file again): bytes other than
those verified are refused with :class:`ArchiveChanged` before any array is read, and a
rewrite after the hash cannot reach the arrays. That costs one more copy of the file's
bytes in memory, and its sha256, per read (the warm-up's, not a request's).

Worker side: imports only numpy and the standard library.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import itertools
import math
import mmap
import os
import struct
import sys
import zlib
from typing import Any, Literal

import numpy as np

from edge_contracts.errors import InvalidValue
from edge_contracts.npz_limits import check_members, check_npz_file

__all__ = ["OWN_SHA256_MAX_BYTES", "ArchiveChanged", "load_npz"]

OWN_SHA256_MAX_BYTES = 256 * 1024
"""Files up to this size are hashed by the interpreter's own sha256 module; larger ones
by :mod:`hashlib`. Importing hashlib loads OpenSSL's libcrypto, which costs a fresh
worker's warm-up more than hashing a small example archive does; OpenSSL's sha256 then
hashes several times faster than the interpreter's own, which pays for that import on
files of about a MiB."""

_OWN_SHA256 = "_sha2" if sys.version_info >= (3, 12) else "_sha256"
_EOCD = struct.Struct("<IHHHHIIH")  # end of central directory record
_EOCD_SIG = 0x06054B50
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")
_CENTRAL_SIG = 0x02014B50
_LOCAL = struct.Struct("<IHHHHHIIIHH")
_LOCAL_SIG = 0x04034B50
_STORED, _DEFLATED = 0, 8
_MAX_COMMENT = 0xFFFF
_NPY_MAGIC = b"\x93NUMPY"
_NPY_HEADER_WINDOW = 65536 + 16  # magic, version, length and the longest v1 header


class _Unsupported(Exception):
    """Not an archive this reader handles: ``numpy.load`` decides."""


class ArchiveChanged(InvalidValue):
    """An archive's bytes are not those its verified manifest gives it (sha256).

    ``field`` is the file's path, ``value`` the sha256 of the bytes read (``none (...)``
    when the file could not be read), ``reason`` names the sha256 the manifest gives it.
    Raised in a worker, the three travel as data with the error
    (:mod:`edge_contracts.error_details`): the controller's refusal reads the path and
    the sha256 there (:func:`edge_ort.controller.archive_refusal`), never in the wording.
    """


def load_npz(path: str, sha256: str | None = None) -> dict[str, np.ndarray[Any, Any]]:
    """The arrays of an ``.npz`` file by name (``.npy`` stripped), as writable copies.

    The same names, dtypes, shapes, memory order and values as ``numpy.load(path,
    allow_pickle=False)``, whose errors it raises for any file it does not handle.

    Args:
        path: The archive.
        sha256: The sha256 its bytes must have (the verified manifest's), or None. Given,
            the file is read once into memory and only bytes with that sha256 are parsed.

    Raises:
        ArchiveRefused: the archive breaks a bound of :mod:`edge_contracts.npz_limits`
            (declared sizes, compression ratio, ``.npy`` header against declared size),
            checked before any array is allocated, on both paths.
        ArchiveChanged: ``sha256`` given and the bytes read have another (or the file
            cannot be read), before any array is read.

    """
    field = os.path.basename(path)
    if sha256 is not None:
        return _load_verified(path, sha256, field)
    with open(path, "rb") as handle:
        arrays = _read_mapped(handle.fileno(), field)
        if arrays is not None:
            return arrays
        check_npz_file(handle, field)  # the same bounds before numpy allocates anything
        handle.seek(0)
        with np.load(handle, allow_pickle=False) as archive:
            return {name: np.array(archive[name]) for name in archive.files}


def _load_verified(path: str, sha256: str, field: str) -> dict[str, np.ndarray[Any, Any]]:
    """The arrays of the bytes of ``path`` read once, when their sha256 is ``sha256``."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
        now = _sha256_hex(data)
    except OSError as error:
        data, now = b"", f"none ({error.strerror or type(error).__name__})"
    if now != sha256:
        raise ArchiveChanged(path, now, f"differs from the sha256 {sha256} that the verified "
                             "manifest gives it (only the bytes verified are read); sha256 "
                             "now")
    arrays = _read_view(data, field) if data else None
    if arrays is not None:
        return arrays
    check_npz_file(io.BytesIO(data), field)  # the same bounds before numpy allocates anything
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        return {name: np.array(archive[name]) for name in archive.files}


def _sha256_hex(data: bytes) -> str:
    """The sha256 of ``data`` (hex), by the cheaper module for its size.

    See :data:`OWN_SHA256_MAX_BYTES`.
    """
    if len(data) <= OWN_SHA256_MAX_BYTES:
        try:  # the interpreter's own module (no search for the other name along sys.path)
            own: Any = importlib.import_module(_OWN_SHA256)
        except ImportError:  # pragma: no cover - an interpreter without it
            pass
        else:
            return str(own.sha256(data).hexdigest())
    import hashlib  # on the warm-up's path only: it costs a fresh worker's start-up time

    return hashlib.sha256(data).hexdigest()


def _read_mapped(fd: int, field: str) -> dict[str, np.ndarray[Any, Any]] | None:
    """The arrays, or None when ``numpy.load`` must decide."""
    if os.fstat(fd).st_size == 0:
        return None
    mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    try:
        return _read_view(mapped, field)
    finally:
        with contextlib.suppress(BufferError):  # a view a traceback holds: closed when freed
            mapped.close()


def _read_view(data: bytes | mmap.mmap, field: str) -> dict[str, np.ndarray[Any, Any]] | None:
    """The arrays of an archive's bytes, or None when ``numpy.load`` must decide."""
    try:
        return _read_all(memoryview(data), field)
    except (_Unsupported, struct.error, zlib.error, UnicodeDecodeError):
        return None


def _read_all(data: memoryview, field: str) -> dict[str, np.ndarray[Any, Any]]:
    try:
        members = _members(data)
        check_members(
            ((name, size, compressed, method == _DEFLATED)
             for name, (method, _, compressed, size, _) in members.items()),
            field,
        )
        return {name: _array(data, *where) for name, where in members.items()}
    finally:
        data.release()


def _end_record(data: memoryview) -> tuple[int, int]:
    """``(entries, central directory offset)`` from the end record."""
    tail_from = max(0, len(data) - _EOCD.size - _MAX_COMMENT)
    start = bytes(data[tail_from:]).rfind(struct.pack("<I", _EOCD_SIG))
    if start < 0:
        raise _Unsupported("no end record")
    start += tail_from
    (_, disk, cd_disk, here, entries, size, offset, comment) = _EOCD.unpack_from(data, start)
    if disk or cd_disk or here != entries or start + _EOCD.size + comment != len(data):
        raise _Unsupported("multi-disk archive or trailing bytes")
    if entries == 0xFFFF or size == 0xFFFFFFFF or offset == 0xFFFFFFFF:
        raise _Unsupported("zip64")
    if offset + size != start:
        raise _Unsupported("central directory not right before the end record")
    return entries, offset


def _members(data: memoryview) -> dict[str, tuple[int, int, int, int, int]]:
    """Name -> (method, data offset, compressed size, size, crc) of every ``.npy`` member."""
    entries, position = _end_record(data)
    directory_start = position
    members: dict[str, tuple[int, int, int, int, int]] = {}
    spans: list[tuple[int, int]] = []
    for _ in range(entries):
        (sig, _made, _needed, flags, method, _time, _date, crc, compressed, size, name_len,
         extra_len, comment_len, disk, _internal, _external, local) = _CENTRAL.unpack_from(
            data, position)
        if sig != _CENTRAL_SIG or disk:
            raise _Unsupported("central directory entry")
        raw_name = bytes(data[position + _CENTRAL.size : position + _CENTRAL.size + name_len])
        position += _CENTRAL.size + name_len + extra_len + comment_len
        if flags & 0x1 or method not in (_STORED, _DEFLATED):
            raise _Unsupported("encrypted, or another compression method")
        if 0xFFFFFFFF in (compressed, size, local):
            raise _Unsupported("zip64 member")
        # zipfile's rule (UTF-8 when flagged, else cp437); ASCII spares the codec import
        encoding = "utf-8" if flags & 0x800 else "ascii" if raw_name.isascii() else "cp437"
        name = raw_name.decode(encoding)
        if not name.endswith(".npy") or name[:-4] in members:
            raise _Unsupported("member name")
        lsig, *_, lname_len, lextra_len = _LOCAL.unpack_from(data, local)
        if lsig != _LOCAL_SIG:
            raise _Unsupported("local header")
        name_at = local + _LOCAL.size
        if bytes(data[name_at : name_at + lname_len]) != raw_name:
            raise _Unsupported("local name differs from the directory's")
        start = name_at + lname_len + lextra_len
        if start + compressed > directory_start:
            raise _Unsupported("member runs into the central directory")
        spans.append((local, start + compressed))
        members[name[:-4]] = (method, start, compressed, size, crc)
    spans.sort()
    for (_, end), (next_start, _) in itertools.pairwise(spans):
        if next_start < end:
            raise _Unsupported("members overlap")
    return members


def _array(
    data: memoryview, method: int, start: int, compressed: int, size: int, crc: int
) -> np.ndarray[Any, Any]:
    raw: bytes | memoryview = data[start : start + compressed]
    if method == _DEFLATED:
        inflater = zlib.decompressobj(-15)
        raw = inflater.decompress(raw, size + 1)  # never more than declared, plus one
        if not inflater.eof or inflater.unconsumed_tail:
            raise _Unsupported("deflate stream")
    if len(raw) != size or zlib.crc32(raw) != crc:
        raise _Unsupported("size or CRC-32 mismatch")
    if bytes(raw[: len(_NPY_MAGIC)]) != _NPY_MAGIC:
        raise _Unsupported("member bytes are not .npy")  # numpy.load returns them raw
    header = io.BytesIO(bytes(raw[:_NPY_HEADER_WINDOW]))
    try:
        version = np.lib.format.read_magic(header)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(header)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(header)
        else:
            raise _Unsupported(f".npy version {version}")
    except ValueError:  # numpy.load words the refusal
        raise _Unsupported(".npy header") from None
    if dtype.hasobject:
        raise _Unsupported("object array")  # numpy.load refuses it without unpickling
    count = math.prod(shape)
    offset = header.tell()
    if offset + count * dtype.itemsize != len(raw):
        raise _Unsupported(".npy data length")
    order: Literal["C", "F"] = "F" if fortran and len(shape) > 1 else "C"
    out = np.empty(shape, dtype, order=order)
    if count:
        flat = np.frombuffer(raw, dtype=dtype, count=count, offset=offset)
        out.reshape(-1, order=order)[...] = flat  # a view of out: filled in place, once
        del flat
    return out
