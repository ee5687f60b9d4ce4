"""``edge plan``: which candidate each stage would get, and why the others would not.

No request is served. By default every stage is opened for real (load, warm-up
placement gate, numerics, memory), the answer is reported, and everything is retired
and released; ``--probe-only`` answers from probes and admission alone, starting no
worker (see :mod:`edge_core.runtime.preview`).

Exit codes: 0 when every stage has a candidate, 1 when some stage has none (or the close
could not verify a retirement), 2 for usage or configuration errors.
"""

from __future__ import annotations

import argparse
import sys

from edge_core.cli import common

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from edge_core.runtime.preview import PlanAnswer

NAME = "plan"


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add the ``plan`` command."""
    parser = sub.add_parser(NAME, help="say which candidate backend each stage would get, "
                            "without serving a request")
    common.add_json_flag(parser)
    parser.add_argument("pipeline", help="a pipeline file (.toml/.yaml/.json) or pyproject.toml")
    parser.add_argument("--name", help="the pipeline's name in pyproject.toml")
    parser.add_argument("--probe-only", action="store_true",
                        help="answer from probes and admission alone (start no worker)")
    parser.add_argument("--verbose", action="store_true",
                        help="show the workers' output on stderr (default: a log file per "
                        "worker)")
    parser.set_defaults(func=run)


def _lines(answer: PlanAnswer) -> list[str]:
    how = ("from probes and admission only (no worker started)" if answer.mode == "probe-only"
           else "opened for real (loaded and gated), then closed; no request served")
    word = "expected" if answer.mode == "probe-only" else "chosen"
    lines = [f"pipeline {answer.pipeline}: {how}"]
    for stage in answer.stages:
        got = stage.to_json()
        head = (f"{word} {got['backend']} (candidate {stage.choice})"
                if stage.choice is not None else "no candidate")
        lines.append(f"  stage {stage.stage_id}: {head}")
        for entry in stage.candidates:
            detail = f" at {entry['layer']}: {entry['reason']}" if entry["layer"] else (
                f": {entry['reason']}" if entry["reason"] else "")
            lines.append(f"    candidate {entry['candidate']} {entry['backend']}: "
                         f"{entry['outcome']}{detail}")
    return lines


def run(args: argparse.Namespace) -> int:
    """Answer for the pipeline's stages; print the answer; exit 0 / 1 / 2."""
    from edge_core.plugins import load_plugins
    from edge_core.runtime.pipeline_files import default_ledger, load_config
    from edge_core.runtime.preview import plan_by_opening, plan_by_probe

    say = None if args.json else (lambda message: print(f"edge: {message}", file=sys.stderr))
    try:
        config = load_config(args.pipeline, args.name)
    except Exception as exc:
        raise common.failure_for(exc, "pipeline") from exc
    plugins = load_plugins(local_modules=config.plugins)
    ledger = default_ledger(config, plugins)
    if args.probe_only:
        answer = plan_by_probe(config, plugins, ledger)
    else:
        logs = common.worker_logs(args.verbose)
        if logs is not None and say is not None:
            say(f"worker logs: {logs}")
        answer = plan_by_opening(config, plugins, ledger, progress=say)
    code = common.EXIT_OK if answer.ok and answer.released else common.EXIT_FAILED
    if args.json:
        common.print_json(answer.to_json())
        return code
    for line in _lines(answer):
        print(line)
    if answer.mode != "probe-only":
        print(f"closed: every worker retired and verified, reservations released: "
              f"{answer.released}")
    if not answer.ok:
        missing = [s.stage_id for s in answer.stages if s.choice is None]
        print(f"edge: no candidate for stage(s) {', '.join(missing)}", file=sys.stderr)
    return code
