"""The ``edge`` command line (:mod:`edge_core.cli.command_line`), one module per command.

This package imports nothing: ``python -m edge_core.cli`` imports it before its
``__main__`` runs, and its ``__main__`` goes through :mod:`edge_core.entry`, as the
``edge`` script does, so that Ctrl-C and SIGTERM are handled before the command line's
own imports (argparse, the commands' shared code). The command line's names are the
package's too, loaded when first asked for: ``from edge_core.cli import main``.
"""

TYPE_CHECKING = False  # not typing's: nothing is imported before the handlers are set
if TYPE_CHECKING:
    from typing import Any

__all__ = ["BUILTIN_COMMANDS", "PLUGIN_FREE_COMMANDS", "build_parser", "main",
           "parser_and_commands"]


def __getattr__(name: str) -> "Any":
    if name in __all__:
        from edge_core.cli import command_line

        return getattr(command_line, name)
    raise AttributeError(f"module 'edge_core.cli' has no attribute {name!r}")
