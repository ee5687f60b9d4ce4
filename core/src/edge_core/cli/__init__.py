"""The ``edge`` command line.

Every command accepts ``--json`` and then prints exactly one JSON document on stdout.

Exit codes (the same for every command):

====  ================================================================================
0     success
1     the command ran and the answer is negative: a refusal, a failed verification,
      an unavailable backend that was asked for by name, a conformance run in which
      nothing passed; also an unexpected error
2     usage, input or configuration error (bad arguments, an unreadable input, an
      invalid pipeline file: every problem of the file named at once)
3     plugin loading failed while ``EDGE_STRICT_PLUGINS=1`` is set
====  ================================================================================

Errors are one line on stderr (inside the JSON document with ``--json``); ``--debug`` or
``EDGE_DEBUG=1`` adds the traceback. Output to a closed pipe (``edge probe --json |
head -1``) ends quietly: the rest of the output is dropped and the exit code is the
command's own.
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
    plan_cmd,
    plugins_cmd,
    probe_cmd,
    profile_cmd,
    qualify_cmd,
    run_cmd,
)
from edge_core.cli.pipes import ClosedPipeGuard

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["build_parser", "main"]

_BUILTIN_COMMANDS = (plugins_cmd, probe_cmd, manifest_cmd, run_cmd, plan_cmd, conformance_cmd,
                     profile_cmd, qualify_cmd, matrix_cmd, cleanup_cmd)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with the built-in commands (plugin commands are added by main)."""
    return _parser_and_commands()[0]


def _parser_and_commands() -> tuple[argparse.ArgumentParser,
                                    argparse._SubParsersAction[argparse.ArgumentParser]]:
    """The parser, and the subparsers action its commands (and plugins') are added to."""
    parser = argparse.ArgumentParser(
        prog="edge",
        description="Run ML model stages on the accelerators of this machine.",
        epilog="Exit codes: 0 ok, 1 refused/failed, 2 usage or configuration error, "
        "3 plugin loading failed in strict mode.",
    )
    parser.add_argument("--version", action="version", version=f"edge-core {__version__}")
    common.add_debug_flag(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in _BUILTIN_COMMANDS:
        module.register(sub)
    return parser, sub


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``edge`` command line; returns the process exit code."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser, commands = _parser_and_commands()
    if _wants_plugin_command(args_list, parser):
        status = common.add_plugin_commands(commands)
        if status is not None:
            return status
    args = parser.parse_args(args_list)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return common.EXIT_USAGE
    original = sys.stdout
    sys.stdout = ClosedPipeGuard(original)
    try:
        return int(func(args))
    except KeyboardInterrupt:
        print("edge: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        return common.report_failure(args, common.failure_for(exc))
    finally:
        sys.stdout.flush()
        sys.stdout = original


def _wants_plugin_command(argv: list[str], parser: argparse.ArgumentParser) -> bool:
    """True when the first positional argument is not a built-in command."""
    known = {m.NAME for m in _BUILTIN_COMMANDS}
    for arg in argv:
        if arg.startswith("-"):
            continue
        return arg not in known
    return False
