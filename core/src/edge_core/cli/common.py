"""Helpers shared by the ``edge`` commands: exit codes, JSON output, plugin loading."""

from __future__ import annotations

import argparse
import json
import sys

from edge_core.errors import EdgeError, PluginError

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
    """Give a command the ``--json`` flag every command has."""
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")


def print_json(data: object) -> None:
    """Write one JSON document to stdout."""
    json.dump(data, sys.stdout, indent=2, sort_keys=False, default=str)
    sys.stdout.write("\n")


def report_failure(args: argparse.Namespace, failure: CommandFailed) -> int:
    """Print a failure (as JSON when ``--json`` was given) and return its exit code."""
    if getattr(args, "json", False):
        print_json({"ok": False, "error": failure.message, **failure.body})
    else:
        print(f"edge: {failure.message}", file=sys.stderr)
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


def add_plugin_commands(parser: argparse.ArgumentParser) -> int | None:
    """Let plugins add their subcommands; returns an exit code when loading failed."""
    from edge_core.plugins import load_plugins

    try:
        plugins = load_plugins()
    except PluginError as exc:
        print(f"edge: {exc}", file=sys.stderr)
        return EXIT_PLUGINS
    sub = next(
        (a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None
    )
    if sub is None:  # pragma: no cover - build_parser always adds one
        return None
    for answer in plugins.call_each("edge_register_commands", subparsers=sub):
        if answer.error:
            print(f"edge: plugin {answer.plugin!r} failed to add commands: {answer.error}",
                  file=sys.stderr)
    return None
