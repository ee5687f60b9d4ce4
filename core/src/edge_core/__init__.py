"""edge-core: run ML model stages on the accelerators of one machine.

Plugin authors need two names from here: :data:`hookimpl`, to mark hook
implementations, and :data:`CONTRACT_VERSION`, the hook-contract version this core
implements. Both are loaded lazily so that ``import edge_core`` stays cheap.
"""

# No ``from __future__ import annotations`` (an import, before ``edge`` handles Ctrl-C:
# edge_core.entry): the one annotation that needs it is a string.
TYPE_CHECKING = False  # not typing's: ``edge`` starts without importing typing
if TYPE_CHECKING:
    from typing import Any

    from edge_core.hookspecs import CONTRACT_VERSION, hookimpl

__version__ = "0.1.0"

__all__ = ["CONTRACT_VERSION", "__version__", "hookimpl"]


def __getattr__(name: str) -> "Any":
    if name in {"hookimpl", "CONTRACT_VERSION"}:
        from edge_core import hookspecs

        return getattr(hookspecs, name)
    raise AttributeError(f"module 'edge_core' has no attribute {name!r}")
