"""``edge cleanup``: remove what edge-core processes that died left behind.

Lists (``--dry-run``) or removes the shared-memory segments and staged directories
(worker packages, verified bundle copies in the system temporary directory) whose owner
process is gone, checked by PID and creation time: a live process's files are never
touched (see :mod:`edge_core.host.leftovers`).

Exit codes: 0 — nothing of a dead owner is left (found nothing, or removed everything it
found); 1 — with ``--dry-run``: there is something to remove; without it: something
could not be removed (it is listed); 2 — usage error.
"""

from __future__ import annotations

import argparse

from edge_core.cli import common

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

NAME = "cleanup"


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add the ``cleanup`` command."""
    parser = common.add_command(
        sub, NAME, "remove shared memory and copies left by dead edge-core processes",
        "Remove (or with --dry-run list) the shared-memory segments and staged folders "
        "(worker packages, verified bundle copies in the temporary folder) whose owner "
        "process is gone, checked by process id and start time: a live process's files are "
        "never touched. Exit 0 when nothing of a dead owner is left; 1 when --dry-run found "
        "something to remove, or something could not be removed (it is listed).",
        "edge cleanup --dry-run", "edge cleanup --json")
    common.add_json_flag(parser)
    parser.add_argument("--dry-run", action="store_true",
                        help="only list what would be removed (exit 1 if anything)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """List or remove a dead owner's leftovers; see the module doc for exit codes."""
    from edge_core.host.leftovers import find_leftovers, remove_leftovers

    if args.dry_run:
        found = find_leftovers()
        removed: list[Any] = []
        left = found
    else:
        removed = remove_leftovers()
        left = find_leftovers()  # what could not be removed, or died meanwhile
    code = common.EXIT_FAILED if left else common.EXIT_OK
    if args.json:
        common.print_json({
            "ok": code == common.EXIT_OK,
            "dry_run": bool(args.dry_run),
            "removed": [item.to_json() for item in removed],
            "left": [item.to_json() for item in left],
        })
        return code
    for item in removed:
        print(f"removed {item.kind} {item.path} (owner pid {item.owner_pid}, gone)")
    for item in left:
        verb = "would remove" if args.dry_run else "could not remove"
        print(f"{verb} {item.kind} {item.path} (owner pid {item.owner_pid}, gone)")
    if not removed and not left:
        print("nothing left behind by dead edge-core processes")
    return code
