"""Writing malformed frames onto a running worker's channel, in either direction.

*From the worker*: the kit takes a duplicate of the worker's own end of the socketpair
with ``pidfd_getfd(2)`` (Linux >= 5.6; the worker is this process's child, so the
ptrace-mode check passes) and writes the bytes there, so the controller reads them exactly
as if the worker had sent them. *To the worker*: the bytes are written on the
controller's end, under the client's send lock, so they never interleave with a frame.

The frames are refused by the framing checks before any payload byte is read: the prefix
announces a header longer than the header cap.
"""

from __future__ import annotations

import ctypes
import os
import socket
import sys

import psutil

from edge_contracts.headers import Limits
from edge_contracts.wire import MAGIC, PREFIX
from edge_core.errors import EdgeError
from edge_core.host.client import WorkerClient
from edge_core.host.start_path import FORKED
from edge_core.host.zygote import CHANNEL_FD

__all__ = ["InjectionUnavailable", "inject_from_worker", "inject_to_worker", "oversized_header"]

_SYS_PIDFD_GETFD = 438  # the same number in every architecture's generic syscall table


class InjectionUnavailable(EdgeError):
    """The worker's end of the channel cannot be reached from here."""


def oversized_header() -> bytes:
    """A frame prefix whose header length exceeds the cap (refused before allocation)."""
    return PREFIX.pack(MAGIC, Limits(max_io_bytes=1).max_header_bytes + 1, 0) + b"{"


def _worker_fd_number(client: WorkerClient) -> int:
    if client.start_path.kind == FORKED:  # forked by the warm pool: its zygote's command line
        return CHANNEL_FD
    try:
        argv = psutil.Process(client.identity.pid).cmdline()
    except psutil.Error as exc:
        raise InjectionUnavailable(f"worker.cmdline: cannot be read: {exc}") from None
    if not argv or not argv[-1].isdigit():
        raise InjectionUnavailable(f"worker.cmdline: no channel descriptor as last argument: "
                                   f"{argv!r}")
    return int(argv[-1])


def _worker_end(client: WorkerClient) -> socket.socket:
    if not sys.platform.startswith("linux") or not hasattr(os, "pidfd_open"):
        raise InjectionUnavailable(f"platform: pidfd_getfd is Linux-only: {sys.platform!r}")
    number = _worker_fd_number(client)
    pidfd = os.pidfd_open(client.identity.pid)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = int(libc.syscall(_SYS_PIDFD_GETFD, pidfd, number, 0))
        if fd < 0:
            error = ctypes.get_errno()
            raise InjectionUnavailable(f"pidfd_getfd: refused ({os.strerror(error)}): "
                                       f"pid {client.identity.pid} fd {number}")
    finally:
        os.close(pidfd)
    return socket.socket(fileno=fd)


def inject_from_worker(client: WorkerClient, data: bytes) -> None:
    """Write ``data`` on the worker's end of its channel, as the worker would."""
    with _worker_end(client) as end:
        end.sendall(data)


def inject_to_worker(client: WorkerClient, data: bytes) -> None:
    """Write ``data`` on the controller's end, towards the worker."""
    client.send_bytes(data)

