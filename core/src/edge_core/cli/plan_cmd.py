"""``edge plan``: which candidate each stage would get, and why the others would not.

No request is served. By default every stage is opened for real (load, warm-up
placement gate, numerics, memory) — and where the pipeline's selection is measured,
every passing candidate is timed on ``--input`` (else the pipeline's workload, else the
bundles' examples) or the stored decision reused (``--remeasure`` forces a new
measurement) — the answer is reported, and everything is retired and released;
``--probe-only`` answers from probes and admission alone, starting no worker (see
:mod:`edge_core.runtime.preview`). ``--input`` and ``--remeasure`` say what to time and
whether to time again, which only a plan that opens the stages does: with
``--probe-only`` they are refused (exit 2, naming the options), never ignored; so is
``--input`` for a pipeline whose opening times nothing (``selection = "first-passing"``,
or no stage with more than one candidate), once its file is read and before anything
opens.

The workers it starts write their output to a log folder
(:func:`~edge_core.cli.common.worker_logs`), named on stderr before any starts and as
``worker_logs`` in the ``--json`` document (null with ``--probe-only``, which starts none,
and with ``--verbose``, which shows the output on stderr instead).

Exit codes: 0 when every stage has a candidate, 1 when some stage has none (or the close
could not verify a retirement), 2 for usage or configuration errors (``--probe-only`` with
``--input`` or ``--remeasure`` among them, before the file is read, and ``--input`` for a
pipeline that times nothing, after it): the pipeline file is
checked against the installed plugins first (:mod:`edge_core.preflight`), every problem
of every stage named at once, before any worker starts.
"""

from __future__ import annotations

import argparse
import sys

from edge_core import discovery
from edge_core.cli import common

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from edge_core.runtime.preview import PlanAnswer

NAME = "plan"


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add the ``plan`` command."""
    parser = sub.add_parser(
        NAME, help="say which backend each stage would get, and why the others would not",
        description="Answer, without serving a request, which candidate backend each stage "
        "gets: by default every stage is opened for real (admitted, loaded, gated) and "
        "closed again; with --probe-only from probes and admission alone, starting no "
        "worker. A measured selection times the candidates that pass while they are open "
        "(--input, --remeasure); --probe-only times nothing, so it refuses those two "
        "options rather than ignore them, and a pipeline without a measured choice "
        "(selection = \"first-passing\", or no stage with several candidates) refuses "
        "--input. Exit 0 when every stage has a candidate, 1 when some stage has none, 2 "
        "for a usage problem (--probe-only with --input or --remeasure, an --input that is "
        "missing or not a readable file, or that the pipeline would not time) or a problem "
        "in the pipeline file (every one named at once). The workers' output goes to a log "
        "folder, named on stderr and as worker_logs under --json; --verbose shows it on "
        "stderr instead.",
        epilog=common.examples("edge plan build/ocr/pipeline-auto.toml",
                               "edge plan build/ocr/pipeline-auto.toml --probe-only --json"),
        formatter_class=common.HelpFormatter)
    common.add_json_flag(parser)
    common.add_pipeline_arguments(parser)
    parser.add_argument("--probe-only", action="store_true",
                        help="answer from probes and admission alone (start no worker, "
                        "time nothing: not with --input or --remeasure)")
    common.add_verbose_flag(parser)
    parser.add_argument("--input", dest="source", action="append", metavar="PATH",
                        help="what a measured selection times (through the pipeline's "
                        "prepare, or an .npz of first-stage inputs); repeatable; default: "
                        "the pipeline's workload, else the bundles' examples; not with "
                        "--probe-only, nor for a pipeline without a measured choice")
    parser.add_argument("--remeasure", action="store_true",
                        help="measure the candidates even when a stored decision matches "
                        "(and store the new one); not with --probe-only")
    parser.set_defaults(func=run)


def _figures(measured: Any) -> str:
    if not isinstance(measured, dict) or measured.get("p50_s") is None:
        return ""
    samples = measured.get("samples", 0)
    return (f" [p50 {measured['p50_s'] * 1e3:.1f} ms, p95 {measured['p95_s'] * 1e3:.1f} ms "
            f"over {samples} sample{'s' if samples != 1 else ''}]")


def _lines(answer: PlanAnswer) -> list[str]:
    how = ("from probes and admission only (no worker started)" if answer.mode == "probe-only"
           else "opened for real (loaded and gated), then closed; no request served")
    word = "expected" if answer.mode == "probe-only" else "chosen"
    lines = [f"pipeline {answer.pipeline}: {how}"]
    selection = (answer.plan or {}).get("selection") or {}
    if selection.get("decision") in ("measured", "reused", "not-measured"):
        lines.append(f"  selection: {selection['objective']}; {selection['note']}")
        if selection.get("warning"):  # a stored file not used, or the decision not stored
            lines.append(f"  warning: {selection['warning']}")
        if selection.get("workload"):
            lines.append(f"  timed: {selection['workload']['note']}")
        if selection.get("schedule"):
            lines.append(f"  {selection['schedule']['note']}")
        if selection.get("split"):
            lines.append(f"  split: {selection['split']['reason']}")
    for stage in answer.stages:
        got = stage.to_json()
        head = (f"{word} {got['backend']} (candidate {stage.choice})"
                if stage.choice is not None else "no candidate")
        lines.append(f"  stage {stage.stage_id}: {head}")
        gate = next((s.get("gate") for s in (answer.plan or {}).get("stages") or ()
                     if s.get("id") == stage.stage_id and s.get("gate")), None)
        if gate:
            lines.append(f"    gate: {gate['note']}")
            if str(gate.get("stored", "")).startswith("not stored"):
                lines.append(f"    gate {gate['stored']}")
        for entry in stage.candidates:
            detail = f" at {entry['layer']}: {entry['reason']}" if entry["layer"] else (
                f": {entry['reason']}" if entry["reason"] else "")
            lines.append(f"    candidate {entry['candidate']} {entry['backend']}: "
                         f"{entry['outcome']}{detail}{_figures(entry.get('measured'))}")
    return lines


def refuse_timing_without_workers(args: argparse.Namespace) -> None:
    """Refuse ``--probe-only`` with ``--input`` or ``--remeasure`` (exit 2, naming them).

    Both options are about timing candidates, which needs the workers ``--probe-only``
    never starts; ignoring them would answer a question that was not asked.

    Raises:
        common.CommandFailed: (exit 2) the options given together, in ``options``.

    """
    if not args.probe_only:
        return
    given = [option for option, value in (("--input", args.source),
                                          ("--remeasure", args.remeasure)) if value]
    if given:
        raise common.CommandFailed(
            common.EXIT_USAGE,
            f"--probe-only: not with {' or '.join(given)} (timing the candidates needs the "
            f"workers --probe-only never starts; drop --probe-only to time them)",
            {"options": ["--probe-only", *given]})


def refuse_untimed_input(args: argparse.Namespace, config: Any) -> None:
    """Refuse ``--input`` for a pipeline whose opening times nothing (exit 2, naming it).

    ``--input`` is what a measured selection times; a first-passing pipeline, or one
    where no stage has a choice of candidates, never reads it: the plan would be the one
    without it, and the option ignored in silence.

    Raises:
        common.CommandFailed: (exit 2) naming ``--input`` and why nothing is timed, in
            ``options``.

    """
    from edge_core.runtime.preview import times_candidates

    if not args.source or times_candidates(config):
        return
    why = (f"its selection is {config.selection!r}: each stage takes the first candidate "
           "that passes" if config.selection != "measured"
           else "no stage lists more than one candidate: there is no choice to time")
    raise common.CommandFailed(
        common.EXIT_USAGE,
        f"--input: pipeline {config.name!r} times nothing to read it with ({why}); drop "
        "--input", {"options": ["--input"]})


def run(args: argparse.Namespace) -> int:
    """Answer for the pipeline's stages; print the answer; exit 0 / 1 / 2.

    The JSON document (and a failure's, once the file is checked) holds
    ``plugin_errors``: every plugin that did not load
    (:func:`edge_core.discovery.plugin_errors`).
    """
    from edge_core.cli.run_inputs import check_readable

    refuse_timing_without_workers(args)  # before the file is read: a usage error
    for file in args.source or ():  # a missing or unreadable file: exit 2, naming the option
        check_readable("--input", file)
    checked = common.checked_pipeline(args)  # every problem of the file: exit 2
    errors = discovery.plugin_errors(record.to_json() for record in checked.plugins.records)
    with common.PluginErrorsOnFailure(errors):
        refuse_untimed_input(args, checked.config)  # before anything reads or opens
        return _plan(args, checked, errors)


def _plan(args: argparse.Namespace, checked: Any, plugin_errors: list[dict[str, Any]]) -> int:
    """Answer for the checked pipeline; print the answer; exit 0 / 1."""
    from edge_core.errors import ConfigError
    from edge_core.runtime.pipeline_files import default_ledger, refuse_unknown_pools
    from edge_core.runtime.preview import plan_by_opening, plan_by_probe

    say = None if args.json else common.say
    config, plugins = checked.config, checked.plugins
    workload = None
    if args.source:
        from edge_core.selection.workload import load_workload

        try:
            workload = load_workload(config, args.source)
        except Exception as exc:
            raise common.failure_for(exc, "input") from exc
    ledger = default_ledger(config, plugins)
    try:  # a stage without candidates demanding an unknown pool: the file's, exit 2
        refuse_unknown_pools(config, ledger)
    except ConfigError as exc:
        raise common.config_failure(exc, args.pipeline) from exc
    logs = None  # --probe-only starts no worker
    if args.probe_only:
        answer = plan_by_probe(config, plugins, ledger)
    else:
        logs = common.worker_logs(args.verbose, say)
        answer = plan_by_opening(config, plugins, ledger, progress=say, workload=workload,
                                 remeasure=args.remeasure)
    code = common.EXIT_OK if answer.ok and answer.released else common.EXIT_FAILED
    if args.json:
        common.print_json({**answer.to_json(), "plugin_errors": plugin_errors,
                           "worker_logs": str(logs) if logs is not None else None})
        return code
    for line in _lines(answer):
        print(line)
    several = [s.stage_id for s in answer.stages
               if sum(c["outcome"] == "would-try" for c in s.candidates) > 1]
    if answer.mode == "probe-only" and config.selection == "measured" and several:
        print(f"note: selection is measured: which would-try candidate of "
              f"{', '.join(several)} serves is decided by timing them when the pipeline "
              f"opens (edge plan without --probe-only); 'expected' is the first listed")
    if answer.mode != "probe-only":
        print(f"closed: every worker retired and verified, reservations released: "
              f"{answer.released}")
    if not answer.ok:
        missing = [s.stage_id for s in answer.stages if s.choice is None]
        print(f"edge: no candidate for stage(s) {', '.join(missing)}", file=sys.stderr)
    return code
