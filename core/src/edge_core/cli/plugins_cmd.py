"""``edge plugins``: every plugin found, what it implements, and why any failed to load."""

from __future__ import annotations

import argparse

from edge_core.cli import common

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

NAME = "plugins"


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add the ``plugins`` command."""
    parser = common.add_command(
        sub, NAME, "list the installed plugins: distribution, version, hooks, load errors",
        "List every plugin edge-core finds (entry points of the 'edge' group, and local "
        "modules a configuration names): its distribution and version, hook contract, the "
        "hooks it implements, and why it failed to load if it did. A broken plugin is listed "
        "with its error and never stops the others (exit 0; exit 3 under "
        "EDGE_STRICT_PLUGINS=1).",
        "edge plugins", "edge plugins --backends --json")
    common.add_json_flag(parser)
    parser.add_argument(
        "--backends", action="store_true",
        help="also ask each plugin for its backends (imports each plugin's value types)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """List plugins; exit 0 even when some failed (they are shown with their error).

    Without ``--backends`` this imports the plugin modules but not pluggy, and calls no
    hook, so it stays fast with every plugin installed. In strict mode
    (``EDGE_STRICT_PLUGINS=1``) any failure exits 3.
    """
    from edge_core import __version__, hookspecs

    if args.backends:
        records = common.load_plugins_or_fail().records
    else:
        from edge_core.discovery import discover

        records, _ = discover()
        failed = [r for r in records if r.error]
        if failed and common.strict_plugins():
            detail = "; ".join(f"{r.name}: {r.error}" for r in failed)
            raise common.CommandFailed(
                common.EXIT_PLUGINS, f"plugins: {len(failed)} plugin(s) failed to load: {detail}",
                {"plugins": [r.to_json() for r in records]},
            )
    rows = [record.to_json() for record in records]
    if args.json:
        common.print_json(
            {"edge_core": __version__, "contract": hookspecs.CONTRACT_VERSION, "plugins": rows}
        )
        return common.EXIT_OK
    print(f"edge-core {__version__} (hook contract {hookspecs.CONTRACT_VERSION})")
    if not rows:
        print("no plugins installed")
    for row in rows:
        dist = f"{row['distribution']} {row['version']}" if row["distribution"] else row["source"]
        print(f"\n{row['name']}  [{dist}]  contract {row['contract'] or '?'}")
        print(f"  module:   {row['module']}")
        if row["backends"]:
            print(f"  backends: {', '.join(row['backends'])}")
        if row["hooks"]:
            print(f"  hooks:    {', '.join(row['hooks'])}")
        if row["error"]:
            print(f"  ERROR:    {row['error']}")
    return common.EXIT_OK
