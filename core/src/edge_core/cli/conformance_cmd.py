"""``edge conformance``: run the conformance kit's checks on installed backends.

Exit 0 when no check failed and at least one passed; 1 when a check failed, when a
backend asked for by name is unavailable (its checks are reported skipped), or when
nothing passed at all (skipped checks are shown as skipped and never count as passed);
2 for an unknown check name or a backend name no installed plugin provides (with the
closest installed names), before any check runs.

The workers the checks start write their output to a log folder, as ``edge run``'s and
``edge plan``'s do (:func:`~edge_core.cli.common.worker_logs`): a check that makes a
worker refuse something (a malformed frame) passes without the worker's own message
showing on the terminal as if it were an error. The folder is named on stderr before
any worker starts and again after the summary when the run is not ok, and as
``worker_logs`` in the ``--json`` document; ``--verbose`` shows the workers' output on
stderr instead (``worker_logs`` is then null). A run that is not ok keeps the folder it
names, even where every log in it stayed empty or no worker started
(:func:`~edge_core.cli.common.end_worker_logs`).
"""

from __future__ import annotations

import argparse
import sys

from edge_core.cli import common

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

NAME = "conformance"


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add the ``conformance`` command."""
    parser = sub.add_parser(
        NAME, help="run the conformance kit: do backends keep the lifecycle contract?",
        description="Run the conformance kit's checks (load, gate, calls, cancel, retire, "
        "leaks) on the named backends (default: every installed backend). An unavailable "
        "backend reports every check skipped, and skipped never counts as passed. Exit 0 "
        "when no check failed and one passed, 1 otherwise, 2 for an unknown backend or "
        "check name. The workers' output goes to a log folder, named on stderr (again "
        "after the summary when the run is not ok) and as worker_logs under --json; "
        "--verbose shows it on stderr instead.",
        epilog=common.examples("edge conformance ort-cpu",
                               "edge conformance ort-cpu --check cancel_running_call --json"),
        formatter_class=common.HelpFormatter,
    )
    common.add_json_flag(parser)
    common.add_verbose_flag(parser)
    parser.add_argument("backends", nargs="*", metavar="BACKEND",
                        help="backend names (default: every installed backend)")
    parser.add_argument("--check", action="append", default=None, metavar="CHECK",
                        help="run only this check (repeatable; default: every check)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the checks and print one line per check (or a JSON report)."""
    from edge_core.errors import BackendUnavailable
    from edge_core.testing.checks import CHECKS
    from edge_core.testing.results import report_document
    from edge_core.testing.runner import installed_backends, run_backend

    unknown = [name for name in args.check or () if name not in CHECKS]
    if unknown:
        raise common.CommandFailed(common.EXIT_USAGE,
                                   f"--check: unknown check (known: {list(CHECKS)}): {unknown}")
    plugins = common.load_plugins_or_fail()
    installed = installed_backends(plugins)
    missing = [name for name in args.backends if name not in installed]
    if missing:
        from edge_core.preflight import unknown_backend

        failed = [f"{r.name} ({r.error})" for r in plugins.records if r.error]
        problems = [f"backends: {unknown_backend(name, installed, failed)}: {name!r}"
                    for name in missing]
        raise common.CommandFailed(common.EXIT_USAGE, "; ".join(problems),
                                   {"problems": problems})
    names = args.backends or installed
    logs = common.worker_logs(args.verbose, None if args.json else common.say)
    reports = []
    for backend in names:
        try:
            reports.append(run_backend(plugins, backend, args.check))
        except BackendUnavailable as exc:
            raise common.CommandFailed(common.EXIT_FAILED, str(exc)) from exc
        if not args.json:
            _print_backend(reports[-1])
    document = report_document(reports)
    problems = _negative(reports, requested=bool(args.backends),
                         passed=document["summary"]["passed"])
    if args.json:
        common.print_json({"ok": not problems, **document,
                           "worker_logs": str(logs) if logs is not None else None,
                           **({"error": "; ".join(problems)} if problems else {})})
    else:
        totals = document["summary"]
        print(f"\n{totals['passed']} passed, {totals['failed']} failed, "
              f"{totals['skipped']} skipped (skipped is not passed)")
        for problem in problems:
            print(f"edge: {problem}", file=sys.stderr)
        if problems and logs is not None:
            print(f"edge: worker logs: {logs}", file=sys.stderr)
    return common.EXIT_FAILED if problems else common.EXIT_OK


def _negative(reports: list[Any], *, requested: bool, passed: int) -> list[str]:
    """Why the run is not ok: failed checks, requested backends unavailable, no pass."""
    problems = [f"{r.backend}: {sum(1 for x in r.results if x.status.value == 'failed')} "
                "check(s) failed" for r in reports if r.failed]
    if requested:
        problems += [f"{r.backend}: requested backend unavailable: {r.reason}"
                     for r in reports if not r.available]
    if passed == 0:
        problems.append("no check passed (every check was skipped or failed)")
    return problems


def _print_backend(report: Any) -> None:
    state = "available" if report.available else f"unavailable: {report.reason}"
    print(f"{report.backend}  [{report.plugin}]  {state}")
    for result in report.results:
        print(f"  {result.status.value.upper():8} {result.check}: {result.detail}")
