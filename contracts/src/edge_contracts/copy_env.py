"""The environment variable that sets how many threads share a large copy.

Standard library only (:mod:`edge_contracts.copying`, which reads it, imports numpy), so
that the controller can name it in a worker's environment allowlist without numpy.
"""

from __future__ import annotations

__all__ = ["COPY_THREADS_ENV"]

COPY_THREADS_ENV = "EDGE_COPY_THREADS"
"""Threads for one large copy (default: the CPUs this process may run on)."""
