"""The ``edge`` command line.

Every command accepts ``--json`` and then prints exactly one JSON document on stdout.

Exit codes (the same for every command):

====  ================================================================================
0     success
1     the command ran and the answer is negative: a refusal, a failed verification,
      an unavailable backend that was asked for by name
2     usage or configuration error (bad arguments, invalid pipeline file)
3     plugin loading failed while ``EDGE_STRICT_PLUGINS=1`` is set
====  ================================================================================
"""

from __future__ import annotations

import argparse
import sys

from edge_core import __version__
from edge_core.cli import (
    cleanup_cmd,
    common,
    conformance_cmd,
    manifest_cmd,
    matrix_cmd,
    plugins_cmd,
    probe_cmd,
    profile_cmd,
    qualify_cmd,
    run_cmd,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["build_parser", "main"]

_BUILTIN_COMMANDS = (plugins_cmd, probe_cmd, manifest_cmd, run_cmd, conformance_cmd,
                     profile_cmd, qualify_cmd, matrix_cmd, cleanup_cmd)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with the built-in commands (plugin commands are added by main)."""
    parser = argparse.ArgumentParser(
        prog="edge",
        description="Run ML model stages on the accelerators of this machine.",
        epilog="Exit codes: 0 ok, 1 refused/failed, 2 usage or configuration error, "
        "3 plugin loading failed in strict mode.",
    )
    parser.add_argument("--version", action="version", version=f"edge-core {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in _BUILTIN_COMMANDS:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``edge`` command line; returns the process exit code."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if _wants_plugin_command(args_list, parser):
        status = common.add_plugin_commands(parser)
        if status is not None:
            return status
    args = parser.parse_args(args_list)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return common.EXIT_USAGE
    try:
        return int(func(args))
    except common.CommandFailed as failure:
        return common.report_failure(args, failure)


def _wants_plugin_command(argv: list[str], parser: argparse.ArgumentParser) -> bool:
    """True when the first positional argument is not a built-in command."""
    known = {m.NAME for m in _BUILTIN_COMMANDS}
    for arg in argv:
        if arg.startswith("-"):
            continue
        return arg not in known
    return False
