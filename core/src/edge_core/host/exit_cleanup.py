"""Workers of a controller that exits without closing them are retired at exit.

:func:`track` is called for every started worker; an ``atexit`` hook (registered on the
first call) retires each one still alive, with a short deadline, when the interpreter
exits normally — an unhandled exception or ``sys.exit`` without ``close()`` included.
Clients are held weakly: tracking never keeps a worker alive; a forked child that exits
does not retire its parent's workers. A controller killed by a
signal runs no ``atexit`` hook; its supervisors clean up instead
(:mod:`edge_core.host.supervisor`), and the next edge-core process removes whatever
remains (:mod:`edge_core.host.leftovers`).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import weakref
from typing import Protocol

__all__ = ["EXIT_RETIRE_DEADLINE_S", "retire_all", "track"]

EXIT_RETIRE_DEADLINE_S = 2.0
"""Retirement deadline of each worker still alive at interpreter exit."""


class _Retirable(Protocol):
    def retire(self, deadline_s: float = ...) -> object: ...


_clients: weakref.WeakSet[_Retirable] = weakref.WeakSet()
_lock = threading.Lock()
_registered = False
_owner = os.getpid()  # a forked child inherits the set: its exit must not retire them


def track(client: _Retirable) -> None:
    """Retire ``client`` at interpreter exit unless it was retired (idempotent) before."""
    global _registered, _owner
    with _lock:
        if _owner != os.getpid():  # tracking starts afresh in a forked child
            _clients.clear()
            _owner = os.getpid()
        if not _registered:
            atexit.register(retire_all)
            _registered = True
        _clients.add(client)


def retire_all() -> None:
    """Retire every tracked worker (what the ``atexit`` hook runs) of this very process."""
    with _lock:
        clients = list(_clients) if _owner == os.getpid() else []
    for client in clients:
        with contextlib.suppress(Exception):
            client.retire(EXIT_RETIRE_DEADLINE_S)
