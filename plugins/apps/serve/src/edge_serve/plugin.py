"""The ``serve`` plugin: adds ``edge serve`` to the command line, nothing else.

Importing this module is cheap: the web stack is imported only when the command runs.
"""

from __future__ import annotations

from typing import Any

from edge_core import hookimpl

#: The hook-contract version this plugin was written against.
EDGE_CONTRACT = "1.0"


@hookimpl
def edge_register_commands(subparsers: Any) -> None:
    """Add ``edge serve PIPELINE...``."""
    from edge_serve.command import register

    register(subparsers)
