"""``edge plugins``: every plugin found, what it implements, and why any failed to load."""

from __future__ import annotations

import argparse

from edge_core.cli import common
from edge_core.cli.probe_cmd import target_words

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
        "EDGE_STRICT_PLUGINS=1). A listing in which every plugin loaded is kept, as edge "
        "probe's answer is, until the next boot or a change of the installed packages, the "
        "plugins' code or the environment. With --json: {edge_core, contract, plugins: "
        "[{name, module, source, distribution, version, contract, hooks, backends, targets, "
        "loaded, error}]}; 'backends' (the backend names) and 'targets' (each backend's "
        "placement targets, the placement.target values a stage of it may name) are filled "
        "with --backends only.",
        "edge plugins", "edge plugins --backends --json")
    common.add_json_flag(parser)
    parser.add_argument(
        "--backends", action="store_true",
        help="also ask each plugin for its backends (imports each plugin's value types)",
    )
    parser.set_defaults(func=run)


def _listed() -> tuple[str, list[dict[str, Any]]]:
    """The hook contract and every plugin's row, kept per boot and stack or found now.

    A listing is kept (:mod:`edge_core.host.probe_answers`) only when every plugin loaded;
    one with a failure is found again on every run. A kept one imports neither the plugins
    nor the hook specifications (whose file is stamped with it).
    """
    from edge_core.host.probe_answers import keep_answer, kept_answer

    kept = kept_answer(kind="plugins")
    if kept is not None:
        contract, rows = kept[0].get("contract"), kept[0].get("plugins")
        if isinstance(contract, str) and isinstance(rows, list):
            return contract, rows
    from edge_core.discovery import discover
    from edge_core.hookspecs import CONTRACT_VERSION

    records, _ = discover()
    rows = [record.to_json() for record in records]
    if not any(record.error for record in records):
        keep_answer({"contract": CONTRACT_VERSION, "plugins": rows}, kind="plugins")
    return CONTRACT_VERSION, rows


def run(args: argparse.Namespace) -> int:
    """List plugins; exit 0 even when some failed (they are shown with their error).

    Without ``--backends`` this imports the plugin modules but not pluggy, and calls no
    hook, so it stays fast with every plugin installed; while nothing it was made from has
    moved, the kept listing is given back instead (no plugin imported). In strict mode
    (``EDGE_STRICT_PLUGINS=1``) any failure exits 3.
    """
    from edge_core import __version__

    if args.backends:
        from edge_core.hookspecs import CONTRACT_VERSION

        contract = CONTRACT_VERSION
        rows = [record.to_json() for record in common.load_plugins_or_fail().records]
    else:
        contract, rows = _listed()
        failed = [row for row in rows if row["error"]]
        if failed and common.strict_plugins():
            detail = "; ".join(f"{row['name']}: {row['error']}" for row in failed)
            raise common.CommandFailed(
                common.EXIT_PLUGINS, f"plugins: {len(failed)} plugin(s) failed to load: {detail}",
                {"plugins": rows},
            )
        common.warn_named_plugins(rows)
    if args.json:
        common.print_json(
            {"edge_core": __version__, "contract": contract, "plugins": rows}
        )
        return common.EXIT_OK
    print(f"edge-core {__version__} (hook contract {contract})")
    if not rows:
        print("no plugins installed")
    for row in rows:
        dist = f"{row['distribution']} {row['version']}" if row["distribution"] else row["source"]
        print(f"\n{row['name']}  [{dist}]  contract {row['contract'] or '?'}")
        if row["module"]:
            print(f"  module:   {row['module']}")
        if row["backends"]:
            print(f"  backends: {', '.join(row['backends'])}")
        for backend, targets in (row.get("targets") or {}).items():
            print(f"  {backend}: {target_words(targets)}")
        if row["hooks"]:
            print(f"  hooks:    {', '.join(row['hooks'])}")
        if row["error"]:
            print(f"  ERROR:    {row['error']}")
    return common.EXIT_OK
