"""A local test plugin: a hook wrapper that makes each stage load take a while.

Named by a pipeline file (``plugins = ["slow_open"]``) so that a signal can be sent while
``edge serve`` is still opening; the wait comes from ``EDGE_TEST_SLOW_LOAD_S``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Generator
from typing import Any

from edge_core import hookimpl

EDGE_CONTRACT = "1.0"


@hookimpl(wrapper=True)
def edge_load(stage: Any) -> Generator[None, Any, Any]:
    """Wait, then load as the owner does."""
    time.sleep(float(os.environ.get("EDGE_TEST_SLOW_LOAD_S", "0")))
    return (yield)
