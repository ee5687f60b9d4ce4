"""``edge run``: open a pipeline (admission, load, gates), serve requests, print the plan.

With ``--input`` (repeatable; a directory stands for its files) every input is read and
checked by the pipeline's ``prepare`` before the pipeline opens (see
:mod:`edge_core.cli.run_inputs`); ``--json`` then prints one document whose ``results``
hold one entry per input (``file`` and the ``finish`` answer as ``lines``) ahead of the
plan, and ``--jsonl`` prints one line per input as it is read (the summary goes to
standard error). Without ``--input`` or ``--inputs`` the first stage's bundled example
inputs are used, and the command says so.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from edge_core.cli import common, generated
from edge_core.cli.run_inputs import BufferedInputs, PreparedInputs, Progress, expand_inputs

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TextIO

NAME = "run"


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add the ``run`` command."""
    parser = sub.add_parser(NAME, help="run a pipeline and print its plan and answer")
    common.add_json_flag(parser)
    parser.add_argument("pipeline", help="a pipeline file (.toml/.yaml/.json) or pyproject.toml")
    parser.add_argument("--name", help="the pipeline's name in pyproject.toml")
    parser.add_argument("--input", dest="source", action="append", metavar="PATH",
                        help="what the pipeline's prepare function takes (e.g. an image "
                        "path); repeat it, or name a directory to read every file in it")
    parser.add_argument("--jsonl", action="store_true",
                        help="print one JSON line per input (file and answer) as it is read")
    parser.add_argument("--inputs", metavar="NPZ",
                        help="first-stage inputs as an .npz (loaded with pickle disabled)")
    parser.add_argument("--params", metavar="JSON", type=json.loads, default=None,
                        help='request parameters for the final stage, e.g. a generate '
                        'stage\'s {"prompt": "...", "max_tokens": 16}')
    parser.add_argument("--repeat", type=int, default=1, metavar="N",
                        help="serve N sequential requests (latency p50 over them)")
    parser.add_argument("--profile", metavar="PATH",
                        help="write a deployment profile JSON (plan, raw samples, outputs)")
    parser.add_argument("--deadline", type=float, default=None, metavar="SECONDS",
                        help="bound each request, admission to result (DeadlineExceeded)")
    parser.add_argument("--verbose", action="store_true",
                        help="show the workers' output on stderr (default: a log file per "
                        "worker, named in the plan)")
    parser.set_defaults(func=run)


def _health_lines(health: dict[str, Any]) -> list[str]:
    """One line per stage runtime (state, generation, restarts), one per replicated stage.

    The state is that of docs/runtime.md; a replicated stage's line says how many of its
    replicas are live.
    """
    lines = []
    for sid, stage in health["stages"].items():
        reason = f" ({stage['reason']})" if stage.get("reason") else ""
        lines.append(f"  stage {sid}: {stage['state']}{reason}; generation "
                     f"{stage['generation']}, restarts {stage['restarts']} "
                     f"(restart = {stage['policy']['restart']})")
    for sid, replicas in (health.get("replicas") or {}).items():
        if replicas["declared"] > 1:
            lines.append(f"  stage {sid}: {replicas['live']} of {replicas['declared']} "
                         f"replicas live ({replicas['state']})")
    return lines


def _npz_inputs(path: str) -> dict[str, Any]:
    import zipfile

    import numpy as np

    if not os.path.isfile(path):
        raise common.CommandFailed(common.EXIT_USAGE, f"--inputs {path}: no such file")
    if not zipfile.is_zipfile(path):
        raise common.CommandFailed(
            common.EXIT_USAGE, f"--inputs {path}: not an .npz archive (to read an image or "
            "another file through the pipeline's prepare function, use --input)")
    try:
        with np.load(path, allow_pickle=False) as data:
            return {name: np.array(data[name]) for name in data.files}
    except (ValueError, OSError, zipfile.BadZipFile) as exc:
        raise common.CommandFailed(common.EXIT_USAGE, f"--inputs {path}: {exc}") from exc


def _check_inputs(args: argparse.Namespace) -> PreparedInputs | None:
    """Read and check every ``--input`` with the pipeline's prepare, before it opens."""
    if not args.source:
        return None
    from edge_core.config.transforms import resolve_input_transform
    from edge_core.errors import ConfigError
    from edge_core.runtime.pipeline_files import load_config

    try:
        config = load_config(args.pipeline, args.name)
        if config.prepare is None:
            raise common.CommandFailed(common.EXIT_USAGE, "--input: the pipeline names no "
                                       "'prepare' function to read it with")
        prepare = resolve_input_transform(config.prepare, "prepare")
    except ConfigError as exc:
        raise common.CommandFailed(common.EXIT_USAGE, str(exc)) from exc
    files = expand_inputs(args.source, getattr(prepare, "input_suffixes", None))
    return PreparedInputs(prepare, files)


def _example_inputs(args: argparse.Namespace, pipeline: Any,
                    say: Callable[[str], None] | None) -> tuple[dict[str, Any], str]:
    """The inputs when no ``--input`` is given, and a line saying where they come from."""
    if args.inputs:
        return _npz_inputs(args.inputs), f"--inputs {args.inputs}"
    first = pipeline.stages[0]
    bundle = getattr(first.loaded, "bundle", None)
    if bundle is not None and bundle.example_inputs is not None:
        member = bundle.manifest.metadata.example_inputs
        where = f"the example inputs bundled with stage {first.stage_id!r} ({member})"
        if say is not None:
            say(f"no --input given: reading {where}")
        return dict(bundle.load_example_inputs()), where
    if args.params is not None:  # a prompt-only generate stage takes no tensors
        return {}, "no tensors (--params only)"
    raise common.CommandFailed(common.EXIT_USAGE, "inputs: give --input or --inputs (the first "
                               "stage has no example inputs to fall back on)")


def _answer(pipeline: Any, result: Any, inputs: dict[str, Any]) -> Any:
    from edge_core.config.transforms import resolve_input_transform

    outputs = result.outputs
    text = generated.generated_answer(result)  # a generate stage: its text, ids, reason
    if text is not None:
        return text
    if pipeline.config.finish is not None:
        finish = resolve_input_transform(pipeline.config.finish, "finish")
        return finish(outputs, inputs, pipeline.bundle_directories())
    return {name: {"dtype": str(a.dtype), "shape": list(a.shape)} for name, a in outputs.items()}


def _summary(plan: dict[str, Any]) -> list[str]:
    from edge_core.evidence.memory import PLAN_KEY

    lines = [f"pipeline {plan['pipeline']}"]
    for stage in plan["stages"]:
        placement = stage["placement"] or {}
        split = ", ".join(f"{name} {v['nodes']}"
                          for name, v in (placement.get("providers") or {}).items())
        demands = ", ".join(f"{pool} {n / 2**20:.0f} MiB"
                            for pool, n in stage["reservation"]["demands"].items())
        numerics = stage["numerics"] or {}
        buckets = stage.get("buckets") or []
        counts = stage.get("evidence_buckets") or {}
        gated = (f"; {len(buckets)} shapes gated, {counts.get('compared', 0)} of "
                 f"{counts.get('declared', 0)} buckets compared with expected outputs"
                 if len(buckets) > 1 else "")
        replica = f" replica {stage['replica']}" if stage.get("replica") else ""
        lines.append(
            f"  stage {stage['id']}{replica}: {stage['backend']} on {placement.get('target')} "
            f"[{split}] ({placement.get('method')}); reserved {demands}; "
            f"numerics {numerics.get('reference')} max_abs {numerics.get('max_abs_error')}; "
            f"evidence {stage['evidence']}{gated}"
        )
        for pool, row in (stage.get(PLAN_KEY) or {}).items():
            if row.get("over_demand"):
                lines.append(f"    memory: {pool} peak {row['observed_peak_bytes'] / 2**20:.0f}"
                             f" MiB after the requests is over the declared demand "
                             f"{row['demand_bytes'] / 2**20:.0f} MiB")
        for tried in stage.get("candidates") or ():
            if tried["outcome"] != "chosen":
                lines.append(f"    candidate {tried['backend']} refused at {tried['layer']}: "
                             f"{tried['reason']}")
    return lines


def _serve(pipeline: Any, inputs: dict[str, Any], args: argparse.Namespace,
           samples: list[dict[str, Any]]) -> Any:
    """Serve ``--repeat`` requests of one input; returns the first one's answer."""
    answer: Any = None
    for index in range(max(1, args.repeat)):
        t0 = time.perf_counter()
        with pipeline.run(inputs, params=args.params, deadline_s=args.deadline) as result:
            total = time.perf_counter() - t0
            if index == 0:
                answer = _answer(pipeline, result, inputs)
        samples.append({"request": len(samples), "total_s": total,
                        "stages_s": dict(result.latencies)})
    return answer


def run(args: argparse.Namespace) -> int:
    """Check the inputs, open the pipeline, serve them, print plan, answers and latencies."""
    from edge_core.evidence.memory import annotate_plan
    from edge_core.runtime.pipeline_files import open_pipeline

    quiet = args.json or args.jsonl
    say = None if quiet else (lambda message: print(f"edge: {message}", file=sys.stderr))
    prepared = _check_inputs(args)  # before any worker starts: bad input is exit 2
    logs = common.worker_logs(args.verbose)
    started = time.perf_counter()
    try:
        pipeline = open_pipeline(args.pipeline, name=args.name, progress=say)
    except Exception as exc:
        raise common.failure_for(exc, "pipeline") from exc
    open_s = time.perf_counter() - started
    samples: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    answer: Any = None
    source = ""
    buffered = BufferedInputs(pipeline)
    try:
        if prepared is None:
            inputs, source = _example_inputs(args, pipeline, say)
            if not quiet and sys.stdout.isatty() and generated.is_generate(pipeline):
                generated.stream_text(pipeline, inputs, args.params)
            answer = _serve(pipeline, buffered.stage(inputs), args, samples)
        else:
            progress = Progress(len(prepared.files), enabled=not quiet)
            for index, file in enumerate(prepared.files):
                progress.update(index, file)
                lines = _serve(pipeline, buffered.stage(prepared.get(index)), args, samples)
                results.append({"file": file, "lines": lines})
                if args.jsonl:
                    print(json.dumps(results[-1], default=str), flush=True)
            progress.update(len(prepared.files), "")
            progress.close()
        plan = pipeline.execution_plan()
        annotate_plan(plan, pipeline)  # each stage's peak after the requests vs its demand
        health = pipeline.health()
        buffers = buffered.counts()
    except common.CommandFailed:
        pipeline.close()
        raise
    except Exception as exc:
        states = [line.strip() for line in _health_lines(pipeline.health())]
        pipeline.close()
        failure = common.failure_for(exc, "request")
        failure.body["health"] = states  # still one line on stderr: states after a ';'
        failure.message = "; ".join([failure.message, "health: " + "; ".join(states)])
        raise failure from exc
    closing = pipeline.close()
    stage_ids = [s["id"] for s in plan["stages"]]
    p50_ms = {sid: statistics.median(s["stages_s"][sid] for s in samples) * 1e3
              for sid in stage_ids}
    p50_ms["total"] = statistics.median(s["total_s"] for s in samples) * 1e3
    head: dict[str, Any] = {"results": results} if prepared is not None else \
        {"input": source, "answer": answer}
    report = {
        **head, "ok": True, "pipeline": plan["pipeline"], "open_s": open_s,
        "requests": len(samples), "latency_p50_ms": p50_ms, "input_buffers": buffers,
        "plan": plan, "health": health,
        "closed": closing, "ledger_after_close": pipeline.ledger.snapshot(),
        "worker_logs": str(logs) if logs is not None else None,
    }
    if args.profile:
        profile = {**report, "samples": samples}
        with open(args.profile, "w", encoding="utf-8") as handle:
            json.dump(profile, handle, indent=2, default=str)
    if args.json:
        common.print_json(report)
        return common.EXIT_OK
    out = sys.stderr if args.jsonl else sys.stdout
    for line in _summary(plan):
        print(line, file=out)
    print(f"health: {health['state']}", file=out)
    for line in _health_lines(health):
        print(line, file=out)
    if logs is not None:
        print(f"worker logs: {logs}", file=sys.stderr)
    if prepared is None:
        _print_answer(answer, None, out)
    elif not args.jsonl:
        for result in results:
            _print_answer(result["lines"], result["file"], out)
    if buffers["copied"]:
        print(f"input buffers: {buffers['copied']} tensor(s) copied in once, "
              f"{buffers['sent_by_reference']} request(s) sent them by reference", file=out)
    latency = ", ".join(f"{k} {v:.2f} ms" for k, v in p50_ms.items())
    print(f"latency p50 over {len(samples)} request(s): {latency}", file=out)
    released = all(v.get("release") == "released" for v in closing.values())
    print(f"closed: every worker retired and verified, reservations released: {released}",
          file=out)
    if args.profile:
        print(f"profile written to {args.profile}", file=out)
    return common.EXIT_OK


def _print_answer(answer: Any, file: str | None, out: TextIO) -> None:
    texts = [item["text"] for item in answer if isinstance(item, dict) and "text" in item] \
        if isinstance(answer, list) else []
    if texts:
        print(f"recognised text{f' in {file}' if file else ''}:", file=out)
        for text in texts:
            print(f"  {text}", file=out)
    label = f"answer ({file})" if file else "answer"
    print(f"{label}: {json.dumps(answer, default=str)}", file=out)
