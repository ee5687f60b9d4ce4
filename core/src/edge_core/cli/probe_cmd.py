"""``edge probe``: every backend's availability (with the reason), devices and pools."""

from __future__ import annotations

import argparse

from edge_core.cli import common

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

NAME = "probe"
DEFAULT_TIMEOUT_S = 10.0
KEPT_NOTE = "probe answer kept since"
"""How each backend's note of a kept answer begins (``--json``; the text output says it
once)."""


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add the ``probe`` command."""
    parser = sub.add_parser(
        NAME, help="say which backends can run here, on which devices, and why not",
        description="Ask every installed backend, each isolated with a timeout, whether it "
        "can run on this machine: 'available', 'available (LIMITATION)' when it runs only "
        "in a reduced form (the HTP simulator, CPU only), or 'unavailable: REASON'; with "
        "its devices, memory pools and runtime versions. The answer is kept until the next "
        "boot or a change of the installed packages, the plugins' code or the environment "
        "(each backend's notes say since when); --fresh asks again. Each backend's "
        "placement targets are the placement.target values a stage of it may name. With "
        "--json: {host, pools, backends: [{plugin, backend, available, reason, limitation, "
        "devices, runtime, notes, pool_totals, targets}], plugin_errors}, 'targets' being "
        "those placement targets (empty when the backend declares none). Exit 0, or 1 "
        "when --backend names an unavailable backend.",
        epilog=common.examples("edge probe", "edge probe --backend qnn --json"),
        formatter_class=common.HelpFormatter)
    common.add_json_flag(parser)
    parser.add_argument(
        "--timeout", type=common.positive_seconds, default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help=f"per-plugin probe timeout in seconds (default {DEFAULT_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--backend", metavar="NAME",
        help="probe only this backend; exit 1 when it is unavailable",
    )
    parser.add_argument(
        "--fresh", action="store_true",
        help="ask every backend now instead of reusing the answer kept since the last boot "
        "or install (the new answer is kept)",
    )
    parser.set_defaults(func=run)


def _kept() -> dict[str, Any] | None:
    """The kept whole answer, each backend noting when it was kept; ``None`` if none holds."""
    from edge_core.host.probe_answers import PROBE_CACHE_ENV, kept_answer

    kept = kept_answer()
    if kept is None:
        return None
    result, cached_at = kept
    note = (f"{KEPT_NOTE} {cached_at} (same interpreter, installed packages, plugin code, "
            f"environment and boot; edge probe --fresh or {PROBE_CACHE_ENV}=off asks afresh)")
    for row in result.get("backends", []):
        row["notes"] = [*row.get("notes", []), note]
    return result


def _probed(timeout_s: float) -> dict[str, Any]:
    """Ask every plugin now; keep the answer when every plugin loaded and answered."""
    from edge_core.host.probe_answers import keep_answer
    from edge_core.host.probe_process import observed_probes
    from edge_core.probe import probe_all

    with observed_probes() as programs:
        plugins = common.load_plugins_or_fail()
        result = probe_all(plugins, timeout_s=timeout_s)
    if not result["plugin_errors"] and not any(record.error for record in plugins.records):
        keep_answer(result, programs)
    return result


def run(args: argparse.Namespace) -> int:
    """Probe every plugin, isolated with a timeout, and print the reports.

    The whole answer is kept per boot and installed stack
    (:mod:`edge_core.host.probe_answers`) and reused while nothing it depends on has
    moved: then no plugin is imported and nothing is asked. ``--fresh``,
    ``EDGE_PROBE_CACHE=off`` and hook tracing (``EDGE_TRACE_HOOKS``) ask every plugin.
    """
    result = None if args.fresh or common.env_true("EDGE_TRACE_HOOKS") else _kept()
    if result is None:
        result = _probed(args.timeout)
    backends = every = result["backends"]
    if args.backend:
        backends = [b for b in backends if b["backend"] == args.backend]
        result["backends"] = backends
        if not backends:
            from edge_core.preflight import unknown_backend

            known = sorted(row["backend"] for row in every)
            failed = [f"{r['plugin']} ({r['error']})" for r in result["plugin_errors"]]
            raise common.CommandFailed(
                common.EXIT_USAGE,
                f"--backend: {unknown_backend(args.backend, known, failed)}: {args.backend!r}",
                {"backends": []},
            )
    exit_code = common.EXIT_OK
    if args.backend and not all(b["available"] for b in backends):
        exit_code = common.EXIT_FAILED
    if args.json:
        common.print_json(result)
        return exit_code
    _print_human(result)
    return exit_code


def state_words(row: dict[str, Any]) -> str:
    """What ``edge probe`` says of a backend: available, limited or unavailable.

    ``available``; ``available (HTP simulator: ...)`` when it runs here only in a reduced
    form (the report's ``limitation``); or ``unavailable: reason``.
    """
    if not row["available"]:
        return f"unavailable: {row['reason']}"
    limitation = row.get("limitation")
    return f"available ({limitation})" if limitation else "available"


def target_words(targets: list[str]) -> str:
    """The line that names a backend's placement targets (``placement.target`` values)."""
    if not targets:
        return "placement targets: none declared (a placement.target is not checked before load)"
    return f"placement targets: {', '.join(targets)}"


def _print_human(result: dict[str, Any]) -> None:
    host = result.get("host", {})
    if host:
        print(f"host: {host.get('domain')}, {host.get('logical_cpus')} logical CPUs")
    for pool in result.get("pools", []):
        total = pool.get("observed_total")
        shown = f"{total / 2**30:.1f} GiB" if isinstance(total, int) else "unknown"
        print(f"pool {pool['name']}: {shown}")
    kept = {note for row in result["backends"] for note in row.get("notes", [])
            if note.startswith(KEPT_NOTE)}
    for note in sorted(kept):
        print(note)
    for row in result["backends"]:
        state = state_words(row)
        print(f"\n{row['backend']}  [{row['plugin']}]  {state}")
        for device in row.get("devices", []):
            print(f"  device {device['physical_id']}: {device['kind']} {device['name']} "
                  f"pools={','.join(device['pools'])}")
        print(f"  {target_words(row.get('targets') or [])}")
        for key, value in sorted(row.get("runtime", {}).items()):
            print(f"  {key} {value}")
        for note in row.get("notes", []):
            if note not in kept:
                print(f"  note: {note}")
    for failure in result.get("plugin_errors", []):
        print(f"\nplugin {failure['plugin']}: ERROR {failure['error']}")
