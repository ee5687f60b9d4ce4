"""Helpers shared by the ``edge`` commands: exit codes, errors, JSON output, plugins.

How an error ends a command (:func:`failure_for`, applied by :func:`edge_core.cli.main`):

* a usage, input or configuration error — :class:`~edge_core.errors.ConfigError` (every
  problem of the file named at once), a ``ValueError`` from checking a request's input —
  exits 2 with one line on stderr;
* any other :class:`~edge_core.errors.EdgeError` (a refusal, a lost worker) exits 1 with
  one line;
* an unexpected exception exits 1 with one line naming it.

The traceback is printed only with ``--debug`` or ``EDGE_DEBUG=1``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

from edge_core.errors import ConfigError, EdgeError, PluginError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_PLUGINS = 3


class CommandFailed(EdgeError):
    """Raised by a command to end with an exit code and a message (and a JSON body)."""

    def __init__(self, code: int, message: str, body: dict[str, Any] | None = None) -> None:
        self.code = code
        self.message = message
        self.body = body or {}
        super().__init__(message)


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    """Give a command the ``--json`` and ``--debug`` flags every command has."""
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    add_debug_flag(parser, default=argparse.SUPPRESS)


def add_debug_flag(parser: argparse.ArgumentParser, default: Any = False) -> None:
    """``--debug``: print the traceback of an error (also ``EDGE_DEBUG=1``)."""
    parser.add_argument("--debug", action="store_true", default=default,
                        help="print the traceback of an error (also EDGE_DEBUG=1)")


def debug_enabled(args: argparse.Namespace | None) -> bool:
    """True when ``--debug`` was given or ``EDGE_DEBUG`` is set to a true value."""
    if args is not None and getattr(args, "debug", False):
        return True
    return os.environ.get("EDGE_DEBUG", "").strip().lower() in {"1", "true", "yes", "on"}


def config_problems(exc: ConfigError) -> list[str]:
    """Every problem a configuration error carries (one for a plain ``ConfigError``)."""
    problems = getattr(exc, "problems", None) or (exc,)
    return [str(problem) for problem in problems]


def failure_for(exc: BaseException, what: str = "") -> CommandFailed:
    """The exit code and one-line message for ``exc`` (see the module docstring).

    ``what`` names the input being handled (``--input``, ``--params``) for input errors.
    """
    if isinstance(exc, CommandFailed):
        return exc
    if isinstance(exc, ConfigError):
        problems = config_problems(exc)
        message = problems[0] if len(problems) == 1 else (
            f"{len(problems)} configuration problems: " + "; ".join(problems))
        return CommandFailed(EXIT_USAGE, message, {"problems": problems})
    if isinstance(exc, EdgeError):
        return CommandFailed(EXIT_FAILED, f"{type(exc).__name__}: {exc}")
    if isinstance(exc, ValueError):
        prefix = f"{what}: " if what else ""
        problems = [str(p) for p in getattr(exc, "problems", ())] or [str(exc)]
        return CommandFailed(EXIT_USAGE, f"{prefix}{exc}", {"problems": problems})
    return CommandFailed(EXIT_FAILED, f"internal error: {type(exc).__name__}: {exc} "
                         "(--debug or EDGE_DEBUG=1 prints the traceback)")


def print_json(data: object) -> None:
    """Write one JSON document to stdout."""
    json.dump(data, sys.stdout, indent=2, sort_keys=False, default=str)
    sys.stdout.write("\n")


def report_failure(args: argparse.Namespace | None, failure: CommandFailed) -> int:
    """Print a failure (as JSON when ``--json`` was given) and return its exit code.

    The message is one line; with ``--debug`` / ``EDGE_DEBUG=1`` the traceback of what
    caused it follows on stderr.
    """
    if debug_enabled(args):
        cause = failure.__cause__ or failure
        traceback.print_exception(cause, file=sys.stderr)
    message = " ".join(failure.message.split("\n"))
    if getattr(args, "json", False):
        print_json({"ok": False, "error": message, **failure.body})
    else:
        print(f"edge: {message}", file=sys.stderr)
    return failure.code


def strict_plugins() -> bool:
    """True when ``EDGE_STRICT_PLUGINS`` asks for plugin failures to be fatal."""
    import os

    return os.environ.get("EDGE_STRICT_PLUGINS", "").strip().lower() in {"1", "true", "yes", "on"}


def load_plugins_or_fail() -> Any:
    """Load plugins; a strict-mode failure becomes exit code 3."""
    from edge_core.plugins import load_plugins

    try:
        return load_plugins()
    except PluginError as exc:
        raise CommandFailed(EXIT_PLUGINS, str(exc)) from exc


def add_plugin_commands(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
) -> int | None:
    """Let plugins add their subcommands to ``sub``; an exit code when loading failed."""
    from edge_core.plugins import load_plugins

    try:
        plugins = load_plugins()
    except PluginError as exc:
        print(f"edge: {exc}", file=sys.stderr)
        return EXIT_PLUGINS
    for answer in plugins.call_each("edge_register_commands", subparsers=sub):
        if answer.error:
            print(f"edge: plugin {answer.plugin!r} failed to add commands: {answer.error}",
                  file=sys.stderr)
    return None


def worker_logs(verbose: bool) -> Any:
    """Send workers' output to a fresh log directory (returned), or to stderr when verbose.

    Either way it never reaches this process's stdout (see ``edge_core.host.worker_logs``).
    """
    import tempfile
    from pathlib import Path

    from edge_core.host.worker_logs import LOG_DIR_ENV, log_directory, set_log_directory

    if verbose:
        os.environ.pop(LOG_DIR_ENV, None)
        set_log_directory(None)
        return None
    directory = log_directory() or Path(tempfile.mkdtemp(prefix="edge-worker-logs-"))
    set_log_directory(directory)
    return directory
