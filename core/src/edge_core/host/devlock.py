"""Per-physical-device initialisation lock, shared by the processes of one user on one host.

Some drivers (NPUs especially) misbehave when two processes initialise one device at the
same time. :class:`DeviceLock` serialises that window: hold it while a worker loads and
warms up on the device, then let go. It is an advisory ``flock`` on a file in a private
directory (mode 0700) under the host's temporary directory, so it coordinates processes
of the same user on the same host only: other users, containers with another ``/tmp``,
and other machines are not coordinated. The kernel drops the lock when its holder dies,
so a crashed holder never wedges the device. The holder writes its PID into the file,
which lets a waiter that times out name it.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import tempfile
import time
from pathlib import Path
from types import TracebackType

from edge_core.host.errors import DeviceLockTimeout

__all__ = ["DEFAULT_LOCK_TIMEOUT_S", "DeviceLock", "lock_directory"]

DEFAULT_LOCK_TIMEOUT_S = 60.0
"""Default bound on waiting for a device's initialisation lock."""

_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def lock_directory() -> Path:
    """Return the private per-user directory of the lock files (created 0700 if absent)."""
    path = Path(tempfile.gettempdir()) / f"edge-devlocks-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    if path.stat().st_uid != os.getuid():
        raise PermissionError(f"lock directory: owned by another user: {str(path)!r}")
    return path


def _file_name(device_id: str) -> str:
    digest = hashlib.sha256(device_id.encode()).hexdigest()[:12]
    return f"{_SAFE.sub('_', device_id)[:64]}-{digest}.lock"


class DeviceLock:
    """An exclusive, bounded-wait lock on one physical device id; a context manager.

    Args:
        device_id: the physical identity of the device (e.g. ``pci:0000:01:00.0``).
        timeout_s: how long :meth:`acquire` waits before raising :class:`DeviceLockTimeout`.
        directory: where the lock files live (defaults to :func:`lock_directory`).

    """

    def __init__(
        self,
        device_id: str,
        *,
        timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
        directory: Path | None = None,
    ) -> None:
        self.device_id = device_id
        self.timeout_s = timeout_s
        self.path = (directory or lock_directory()) / _file_name(device_id)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """True while this object holds the lock."""
        return self._fd is not None

    def holder_pid(self) -> int | None:
        """Return the PID recorded by the current (or last) holder, when readable."""
        try:
            text = self.path.read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    def acquire(self) -> None:
        """Take the lock, waiting at most ``timeout_s``; raise :class:`DeviceLockTimeout`."""
        if self._fd is not None:
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        deadline = time.monotonic() + self.timeout_s
        pause = 0.005
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        holder = self.holder_pid()
                        raise DeviceLockTimeout(
                            f"device_lock[{self.device_id}]",
                            f"not acquired within {self.timeout_s} s; held by pid {holder}",
                            str(self.path),
                            holder,
                        ) from None
                    time.sleep(min(pause, max(deadline - time.monotonic(), 0.0)))
                    pause = min(pause * 2, 0.1)
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def release(self) -> None:
        """Let go of the lock. Idempotent."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __enter__(self) -> DeviceLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
