"""An entry whose import starts a thread and says so on stderr (see test_warm_pool)."""

from __future__ import annotations

import sys
import threading

from edge_test_workers import echo

__all__ = ["echo"]

_never = threading.Event()
threading.Thread(target=_never.wait, name="edge-test-import-thread", daemon=True).start()
print("edge_test_threaded imported", file=sys.stderr, flush=True)
