"""Sealed, anonymous shared memory: Linux memfd segments passed over the worker channel.

Standard library only. A *sealed* segment is an anonymous file (``memfd_create``) that is
sized once and then sealed with ``F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL``: nobody —
not its creator either — can change its size again. The consumer checks the seals before
it maps the segment, so a peer cannot shrink memory the other side has mapped (reading a
mapped page past the end of a shrunk file kills the reader with ``SIGBUS``): a segment
without the seals is refused (:class:`~edge_contracts.shm.ShmRefused`).

A memfd has no name in ``/dev/shm``: it vanishes with the last descriptor or mapping that
holds it, so a killed process leaves nothing behind. Its descriptor travels from producer
to consumer over an :class:`FdChannel`, a ``SOCK_SEQPACKET`` socketpair beside the frame
socket: the producer sends ``(name, descriptor)`` when it creates the segment, before any
frame can reference it, so the consumer finds the descriptor waiting when it first maps
the name. Names and references on the wire are unchanged (``edge_<prefix>_<random>``).
"""

from __future__ import annotations

import mmap
import os
import select
import struct
import sys
import threading
import time
from collections import OrderedDict
from typing import Any

from edge_contracts.hugepages import back_with_huge_pages

__all__ = [
    "SEALS",
    "SEALS_AVAILABLE",
    "SEND_TIMEOUT_S",
    "FdChannel",
    "create_sealed",
    "held_sealed_names",
    "open_sealed",
]

try:  # Linux; absent on Windows
    import fcntl

    SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
    _F_ADD_SEALS = fcntl.F_ADD_SEALS
    _F_GET_SEALS = fcntl.F_GET_SEALS
    _NEEDED = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
except (ImportError, AttributeError):  # pragma: no cover - not Linux
    SEALS = 0
    _F_ADD_SEALS = _F_GET_SEALS = _NEEDED = 0

SEALS_AVAILABLE = bool(SEALS) and hasattr(os, "memfd_create") and sys.platform.startswith("linux")
"""True when this interpreter can create and check sealed memfd segments."""

SEND_TIMEOUT_S = 5.0
"""How long sending a descriptor may wait for room in the channel."""

_MAX_PENDING = 512  # descriptors received but not yet mapped; the oldest are closed
_INT = struct.Struct("i")


class FdChannel:
    """One end of a ``SOCK_SEQPACKET`` socketpair carrying ``(segment name, descriptor)``.

    Thread-safe. Each message is one name and one descriptor. Received descriptors wait,
    by name, until the consumer maps that name (:meth:`take`) or forgets it.
    """

    def __init__(self, fd: int) -> None:
        from _socket import AF_UNIX, SOCK_SEQPACKET
        from _socket import socket as socket_type

        self._sock: Any = socket_type(AF_UNIX, SOCK_SEQPACKET, 0, fd)
        self._send_lock = threading.Lock()
        self._recv_lock = threading.Lock()
        self._pending: OrderedDict[str, int] = OrderedDict()
        self._closed = False

    def fileno(self) -> int:
        """The channel's descriptor."""
        return int(self._sock.fileno())

    def send(self, name: str, fd: int) -> None:
        """Send ``fd`` under ``name`` (the receiver gets its own descriptor)."""
        from _socket import MSG_DONTWAIT, SCM_RIGHTS, SOL_SOCKET

        # A peer that stops taking descriptors must not block a sender for ever (each
        # message waits in the socket until the peer maps that segment): bounded wait.
        message = [name.encode("ascii")]
        rights = [(SOL_SOCKET, SCM_RIGHTS, _INT.pack(fd))]
        deadline = time.monotonic() + SEND_TIMEOUT_S
        with self._send_lock:
            while True:
                try:
                    self._sock.sendmsg(message, rights, MSG_DONTWAIT)
                    return
                except BlockingIOError:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError(f"fd channel full for {SEND_TIMEOUT_S} s") from None
                    select.select([], [self._sock], [], min(left, 0.05))

    def take(self, name: str) -> int | None:
        """The descriptor sent under ``name`` (the caller owns it); None if none came."""
        with self._recv_lock:
            while name not in self._pending:
                if not self._receive_one():
                    return None
            return self._pending.pop(name)

    def _receive_one(self) -> bool:
        """Receive one waiting message into the pending table; False if none (locked)."""
        from _socket import CMSG_SPACE, MSG_CMSG_CLOEXEC, MSG_DONTWAIT, SCM_RIGHTS, SOL_SOCKET

        if self._closed:
            return False
        try:
            data, ancillary, _, _ = self._sock.recvmsg(
                256, CMSG_SPACE(_INT.size), MSG_DONTWAIT | MSG_CMSG_CLOEXEC
            )
        except OSError:  # nothing waiting (EAGAIN), or the channel is gone
            return False
        if not data and not ancillary:
            return False  # the peer closed the channel
        fds = [
            _INT.unpack_from(raw, offset)[0]
            for level, kind, raw in ancillary
            if level == SOL_SOCKET and kind == SCM_RIGHTS
            for offset in range(0, len(raw) - len(raw) % _INT.size, _INT.size)
        ]
        for extra in fds[1:]:  # one descriptor per message: close any other
            os.close(extra)
        if fds:
            key = data.decode("ascii", "replace")
            previous = self._pending.pop(key, None)
            if previous is not None:
                os.close(previous)
            self._pending[key] = fds[0]
            while len(self._pending) > _MAX_PENDING:
                os.close(self._pending.popitem(last=False)[1])
        return True

    def discard(self, names: list[str]) -> None:
        """Close the descriptors of ``names``: segments the producer dropped.

        Messages still in the channel are received first, so a descriptor that has not
        been taken yet is closed too.
        """
        with self._recv_lock:
            while self._receive_one():
                pass
            for name in names:
                fd = self._pending.pop(name, None)
                if fd is not None:
                    os.close(fd)

    def close(self) -> None:
        """Close every waiting descriptor and the channel. Idempotent."""
        with self._recv_lock:
            self._closed = True
            for fd in self._pending.values():
                os.close(fd)
            self._pending.clear()
        with self._send_lock:
            self._sock.close()


def create_sealed(name: str, size: int, channel: FdChannel) -> mmap.mmap:
    """Create a memfd of ``size`` bytes, seal its size, map it and send it; return the map."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        back_with_huge_pages(fd, size)
        import fcntl

        fcntl.fcntl(fd, _F_ADD_SEALS, SEALS)
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        mapping = mmap.mmap(fd, size, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        try:
            channel.send(name, fd)
        except BaseException:
            mapping.close()
            raise
    finally:
        os.close(fd)
    return mapping


def open_sealed(fd: int) -> tuple[mmap.mmap | None, int, str | None]:
    """Map a received descriptor read-only after checking its seals; closes ``fd``.

    Returns ``(mapping, size, None)``, or ``(None, size, reason)`` when it must be refused.
    """
    try:
        import fcntl

        try:
            seals = fcntl.fcntl(fd, _F_GET_SEALS)
        except OSError:
            return None, 0, "not a sealable memfd"
        size = os.fstat(fd).st_size
        if seals & _NEEDED != _NEEDED:
            return None, size, "not sealed against shrinking and growing"
        if size <= 0:
            return None, size, "empty"
        return mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ), size, None
    finally:
        os.close(fd)


def held_sealed_names(prefix: str | None = None) -> list[str]:
    """Names of the sealed edge segments this process maps or holds a descriptor of.

    Read from ``/proc/self/maps`` and ``/proc/self/fd`` (Linux); optionally only those of
    one producer ``prefix``. A sealed segment lives exactly as long as some process holds
    it this way, so this is what a leak check looks at instead of ``/dev/shm``.
    """
    start = "/memfd:edge_" if prefix is None else f"/memfd:edge_{prefix}_"
    held: set[str] = set()
    try:
        with open("/proc/self/maps", encoding="ascii", errors="replace") as maps:
            for line in maps:
                at = line.find(start)
                if at >= 0:
                    held.add(line[at + len("/memfd:") :].split()[0])
        entries = os.listdir("/proc/self/fd")
    except OSError:
        return []
    for entry in entries:
        try:
            link = os.readlink(f"/proc/self/fd/{entry}")
        except OSError:
            continue
        if link.startswith(start):
            held.add(link[len("/memfd:") :].split()[0])
    return sorted(held)
