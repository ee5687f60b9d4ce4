"""An entry whose import starts a thread: a warm pool's zygote must not fork after it."""

from __future__ import annotations

import threading

from edge_test_workers import echo

__all__ = ["echo"]

_never = threading.Event()
threading.Thread(target=_never.wait, name="edge-test-import-thread", daemon=True).start()
