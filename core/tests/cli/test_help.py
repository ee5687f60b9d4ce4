"""``--help`` explains every command: a description, examples, defaults, one metavar style.

The walk covers the built-in commands and the commands the installed plugins add
(``serve`` from edge-serve, ``derive`` and ``hub`` from edge-qnn), down to every
subcommand.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

import pytest

from edge_core.cli import common, parser_and_commands
from edge_core.cli.reference import commands

METAVAR = re.compile(r"^[A-Z][A-Z0-9_]*(:[A-Z][A-Z0-9_]*)?$")


def _full_parser() -> argparse.ArgumentParser:
    parser, sub = parser_and_commands()
    assert common.add_plugin_commands(parser, sub) is None
    return parser


COMMANDS = dict(commands(_full_parser()))


def test_the_plugin_commands_are_there() -> None:
    assert {"edge serve", "edge derive", "edge hub", "edge derive qnn-static",
            "edge hub infer"} <= set(COMMANDS)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_command_has_a_description_and_examples(command: str) -> None:
    parser = COMMANDS[command]
    assert parser.description and len(parser.description) > 40, command
    assert parser.epilog and parser.epilog.startswith("examples:\n  "), command
    for line in parser.epilog.splitlines()[1:]:
        assert line.startswith(("  edge ", "  curl ")), line
    text = parser.format_help()
    assert "``" not in text and ":mod:" not in text and ":class:" not in text, command


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_option_says_its_default_in_one_metavar_style(command: str) -> None:
    for action in COMMANDS[command]._actions:
        if isinstance(action, argparse._SubParsersAction | argparse._HelpAction):
            continue
        name = "/".join(action.option_strings) or action.dest
        assert action.help, f"{command} {name}: no help"
        if action.nargs != 0:
            metavar = action.metavar or (action.dest.upper() if action.option_strings
                                         else action.dest)
            assert isinstance(metavar, str) and METAVAR.match(metavar), (command, name, metavar)
        default = action.default
        if action.nargs != 0 and default not in (None, [], "", argparse.SUPPRESS):
            assert "default" in action.help, f"{command} {name}: default {default!r} unsaid"


def test_edge_help_lists_plugin_commands_under_their_distribution() -> None:
    env = {k: v for k, v in os.environ.items() if k != "EDGE_PLUGINS"}
    done = subprocess.run([sys.executable, "-m", "edge_core.cli", "--help"], env=env,
                          capture_output=True, text=True, timeout=120, check=True)
    text = done.stdout
    head, _, plugins = text.partition("commands added by installed plugins:\n")
    assert plugins, text
    assert re.search(r"  from edge-serve [0-9.]+:\n    serve ", plugins), plugins
    assert re.search(r"  from edge-qnn [0-9.]+:\n(    .*\n|                 .*\n)*    derive ",
                     plugins) or re.search(r"from edge-qnn [0-9.]+:\n    hub ", plugins)
    assert "derive" in plugins and "hub" in plugins
    for builtin in ("run", "plan", "probe", "plugins", "manifest", "conformance", "cleanup"):
        assert re.search(rf"\n    {builtin} ", head), builtin
    assert "edge run PIPELINE --input FILE" in text
    assert max(len(line) for line in text.splitlines()) <= common.HELP_WIDTH


def test_no_command_given_prints_the_help_and_exits_2() -> None:
    done = subprocess.run([sys.executable, "-m", "edge_core.cli"], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 2
    assert "commands added by installed plugins:" in done.stdout


def test_the_command_line_reference_page_is_current() -> None:
    from pathlib import Path

    from edge_core.cli.reference import render

    page = Path(__file__).resolve().parents[3] / "docs" / "cli.md"
    assert page.read_text(encoding="utf-8") == render(), (
        "docs/cli.md is out of date: run python -m edge_core.cli.reference docs/cli.md")
