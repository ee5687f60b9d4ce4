"""``edge run``: open a pipeline (admission, load, gates), serve requests, print the plan.

With ``--input`` (repeatable; a directory stands for its files) every input is read and
checked by the pipeline's ``prepare`` before the pipeline opens (see
:mod:`edge_core.cli.run_inputs`): inputs it refuses are named together, one line on
standard error each with its reason, and the run stops there (exit 2, no worker
started). Entries a directory holds that are not read are listed as skipped (on standard
error; ``skipped`` in the JSON document); a directory with nothing to read is refused by
name (exit 2).

Once the pipeline is open, every input is served in turn; one whose request fails (a
stage refuses it, a worker is lost, ``--deadline`` passes, ``finish`` raises) is recorded
with its reason and the next one is served all the same. ``--json`` prints one document
whose ``results`` hold one entry per input, in order, ahead of the plan: ``{"file", "ok":
true, "lines", "placement"}`` (``lines``: the ``finish`` answer) or ``{"file", "ok":
false, "error"}`` (with ``error_detail``, ``{"field", "reason", "value"}``, when a
worker's error sent them: :func:`~edge_core.cli.common.error_fields`); ``failed`` lists
the files that failed and ``ok`` is true only when none did. ``--jsonl`` prints those
entries one line per input as each ends (the summary goes to standard error); the text
output prints each answer, or ``failed (FILE): REASON``, and ends with a line on
standard error naming the files that failed. Exit 0 when every input succeeded, 1 when
some failed (the others' answers are all there).

``--inputs NPZ`` gives the first stage's tensors directly; the archive is read and its
names, dtypes and shapes are checked against the first stage's declared shapes before the
pipeline opens. Without ``--input`` or ``--inputs`` the first stage's bundled example
inputs are read, and the output says so on standard output (a first stage none of whose
candidates' bundles has any is a usage error, exit 2, before anything loads:
:func:`~edge_core.cli.run_inputs.bundled_example` reads every candidate's manifest).

The answer of each input is printed once: as its text lines for an answer that is a list
of items with ``text`` (``no text found`` when the list is empty), as the generated text
for a generate stage, else as one line of JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from edge_core import discovery
from edge_core.cli import common, generated
from edge_core.cli.run_inputs import (
    BufferedInputs,
    PreparedInputs,
    Progress,
    expand_inputs,
    input_options,
    no_inputs,
    read_npz_inputs,
    skipped_line,
    unread_params,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, TextIO

NAME = "run"

MAX_REPEAT = 100_000
"""The most requests ``--repeat`` serves per input (a typo of a few digits is refused by
name, not a run that never ends)."""

WORKLOAD_INPUTS = 4
"""How many ``--input`` files a measured selection times (the first ones)."""


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add the ``run`` command."""
    parser = sub.add_parser(
        NAME, help="open a pipeline, read your inputs with it, print the answers",
        description="Check the pipeline file and every input, then admit, load and gate "
        "every stage, serve one request per input and close. Without --input or --inputs "
        "the first stage's bundled example inputs are read (and the output says so); where "
        "none of its bundles has any, that is refused (exit 2) before anything starts, with "
        "--params too unless a backend of that stage generates (--params alone gives no "
        "tensors). A --params name the final stage's backend does not read is refused by "
        "name (exit 2), as edge serve refuses it.\n\n"
        "--input files are all read by the pipeline's prepare first: the ones it refuses "
        "(and paths that are not regular files) are named together, one line each with "
        "its reason ('refused' in JSON), and nothing runs (exit 2). A directory is read "
        "without its subdirectories; the entries not read are listed as skipped, and one "
        "with nothing to read is refused by name (exit 2). Then each input is served in "
        "turn: one whose request fails is reported with its file and reason ('failed "
        "(FILE): REASON'; in JSON {\"file\", \"ok\": false, \"error\"}, with 'failed' "
        "listing the files) and the others are still served and reported. Exit 0 when "
        "every input succeeded, 1 when some failed, 2 for a usage, input or pipeline-file "
        "problem.",
        epilog=common.examples(
            "edge run build/ocr/pipeline.toml --input page.png",
            "edge run build/ocr/pipeline.toml --input scans/ --jsonl",
            "edge run pipeline.toml --inputs tensors.npz --json",
            "edge run pipeline.toml --repeat 10 --profile profile.json"),
        formatter_class=common.HelpFormatter)
    common.add_json_flag(parser)
    common.add_pipeline_arguments(parser)
    given = parser.add_mutually_exclusive_group()
    given.add_argument("--input", dest="source", action="append", metavar="PATH",
                       help="a file for the pipeline's prepare function to read (an image "
                       "for the OCR example); repeat it, or name a directory to read "
                       "every file in it (not its subdirectories) whose suffix prepare "
                       "reads")
    given.add_argument("--inputs", metavar="NPZ",
                       help="the first stage's input tensors as an .npz file, by input name "
                       "(read with pickle disabled)")
    parser.add_argument("--jsonl", action="store_true",
                        help="print one JSON line per input as it ends (file, ok, and its "
                        "answer or error; not with --json)")
    parser.add_argument("--params", metavar="JSON", type=common.json_object, default=None,
                        help='request parameters for the final stage, e.g. a generate '
                        'stage\'s \'{"prompt": "Hello", "max_tokens": 16}\'')
    parser.add_argument("--repeat", type=common.int_between(1, MAX_REPEAT), default=1,
                        metavar="N",
                        help="serve N sequential requests per input; latency p50 over them "
                        f"(default 1, at most {MAX_REPEAT})")
    parser.add_argument("--profile", metavar="PATH",
                        help="also write a deployment profile (plan, raw samples, answers) "
                        "as JSON to PATH")
    parser.add_argument("--deadline", type=common.positive_seconds, default=None,
                        metavar="SECONDS",
                        help="bound each request from admission to result; past it the "
                        "request fails with DeadlineExceeded (default: no bound)")
    common.add_verbose_flag(parser)
    parser.set_defaults(func=run)


def _health_lines(health: dict[str, Any]) -> list[str]:
    """One line per stage runtime (state, generation, restarts), one per replicated stage.

    The state is that of docs/health.md, with the ``BundleChanged`` a ``finish`` or
    transform met reading the stage's bundle folder; a replicated stage's line says how
    many of its replicas are live.
    """
    lines = []
    for sid, stage in health["stages"].items():
        reason = f" ({stage['reason']})" if stage.get("reason") else ""
        if stage.get("bundle_changed"):  # its worker serves; requests reading its folder fail
            reason += f" (bundle changed: {stage['bundle_changed']['message']})"
        lines.append(f"  stage {sid}: {stage['state']}{reason}; generation "
                     f"{stage['generation']}, restarts {stage['restarts']} "
                     f"(restart = {stage['policy']['restart']})")
    for sid, replicas in (health.get("replicas") or {}).items():
        if replicas["declared"] > 1:
            lines.append(f"  stage {sid}: {replicas['live']} of {replicas['declared']} "
                         f"replicas live ({replicas['state']})")
    return lines


def _check_inputs(args: argparse.Namespace, config: Any) -> PreparedInputs | None:
    """Read and check every ``--input`` with the pipeline's prepare, before it opens."""
    if not args.source:
        return None
    from edge_core.config.transforms import resolve_input_transform
    from edge_core.errors import ConfigError

    if config.prepare is None:
        raise common.CommandFailed(common.EXIT_USAGE, "--input: the pipeline names no "
                                   "'prepare' function to read it with (give its first "
                                   "stage's tensors with --inputs NPZ)")
    try:
        prepare = resolve_input_transform(config.prepare, "prepare")
    except ConfigError as exc:
        raise common.CommandFailed(common.EXIT_USAGE, str(exc)) from exc
    expanded = expand_inputs(args.source, getattr(prepare, "input_suffixes", None))
    return PreparedInputs(prepare, expanded.files, skipped=expanded.skipped)


def _example_inputs(pipeline: Any, args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """The inputs when neither ``--input`` nor ``--inputs`` is given, and where from."""
    found = pipeline.example_inputs()  # as the stage loaded them, else BundleChanged
    if found is not None:
        where = (f"the example inputs bundled with stage {pipeline.stages[0].stage_id!r} "
                 f"({found.member})")
        return dict(found.arrays), where
    if args.params is not None:  # a prompt-only generate stage takes no tensors
        return {}, "no tensors (--params only)"
    options = input_options(pipeline.config)  # --input only with a prepare function
    raise common.CommandFailed(common.EXIT_USAGE, f"inputs: give {options} (the first "
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
        if (stage.get("gate") or {}).get("mode") == "reused":
            lines.append(f"    gate: {stage['gate']['note']}")
        for pool, row in (stage.get(PLAN_KEY) or {}).items():
            if row.get("over_demand"):
                lines.append(f"    memory: {pool} peak {row['observed_peak_bytes'] / 2**20:.0f}"
                             f" MiB after the requests is over the declared demand "
                             f"{row['demand_bytes'] / 2**20:.0f} MiB")
        for tried in stage.get("candidates") or ():
            if tried["outcome"] == "refused":
                lines.append(f"    candidate {tried['backend']} refused at {tried['layer']}: "
                             f"{tried['reason']}")
            elif tried["outcome"] != "chosen":
                lines.append(f"    candidate {tried['backend']} {tried['outcome']}: "
                             f"{tried['reason']}")
    selection = plan.get("selection") or {}
    if selection.get("decision") in ("measured", "reused", "not-measured", "first-ready"):
        lines.append(f"  selection ({selection['objective']}): {selection['note']}")
        if selection.get("warning"):  # a stored file not used, or the decision not stored
            lines.append(f"  warning: {selection['warning']}")
        if selection.get("split"):
            lines.append(f"  split: {selection['split']['reason']}")
        for switch in selection.get("switches") or ():
            lines.append(f"  switched stage {switch['stage']} from {switch['from']} to "
                         f"{switch['to']} ({switch['decision']})")
    return lines


def _serve(pipeline: Any, inputs: dict[str, Any], args: argparse.Namespace,
           samples: list[dict[str, Any]]) -> tuple[Any, list[dict[str, Any]]]:
    """Serve ``--repeat`` requests of one input; the first one's answer and receipt."""
    answer: Any = None
    receipt: list[dict[str, Any]] = []
    for index in range(max(1, args.repeat)):
        t0 = time.perf_counter()
        with pipeline.run(inputs, params=args.params, deadline_s=args.deadline) as result:
            total = time.perf_counter() - t0
            if index == 0:
                answer = _answer(pipeline, result, inputs)
                receipt = result.placement
        samples.append({"request": len(samples), "total_s": total,
                        "stages_s": dict(result.latencies), "placement": result.placement})
    return answer, receipt


def _workload(args: argparse.Namespace, prepared: PreparedInputs | None,
              tensors: dict[str, Any] | None) -> Any:
    """What a measured selection times: the first ``--input`` files, or ``--inputs``."""
    from edge_core.selection.workload import Workload

    if prepared is None:
        if tensors is not None:
            return Workload(inputs=(tensors,), sources=(args.inputs,), origin="--input",
                            note=f"--inputs {args.inputs}", params=args.params)
        return None
    count = min(len(prepared.files), WORKLOAD_INPUTS)
    names = ", ".join(Path(f).name for f in prepared.files[:count])
    return Workload(inputs=tuple(prepared.peek(i) for i in range(count)),
                    sources=tuple(prepared.files[:count]), origin="--input",
                    note=f"--input: {names}", params=args.params)


def _receipt_line(receipt: list[dict[str, Any]]) -> str:
    return "; ".join(
        f"{s['stage']} on {s['backend']} ({s['provider']}, candidate {s['candidate']}, "
        f"{s['decision']}{' ' + s['measured_at'] if s.get('measured_at') else ''})"
        for s in receipt)


def run(args: argparse.Namespace) -> int:
    """Check the inputs, open the pipeline, serve them, print plan, answers and latencies.

    The JSON document (and a failure's, once the file is checked) holds
    ``plugin_errors``: every plugin that did not load
    (:func:`edge_core.discovery.plugin_errors`).
    """
    from edge_contracts.heap import apply_heap_policy

    apply_heap_policy()  # before any thread allocates: one heap, given back at rest
    if args.json and args.jsonl:
        raise common.CommandFailed(common.EXIT_USAGE, "--jsonl: not with --json (one JSON "
                                   "document, or one JSON line per input)")
    if args.profile:
        common.check_output(args.profile, "--profile")
    checked = common.checked_pipeline(args)  # every problem of the file: exit 2
    errors = discovery.plugin_errors(record.to_json() for record in checked.plugins.records)
    with common.PluginErrorsOnFailure(errors):
        return _run(args, checked, errors)


def _run(args: argparse.Namespace, checked: Any, plugin_errors: list[dict[str, Any]]) -> int:
    """Check the inputs, open the checked pipeline, serve them, report; the exit code."""
    from edge_core.errors import ConfigError
    from edge_core.evidence.memory import annotate_plan
    from edge_core.runtime import Pipeline
    from edge_core.runtime.pipeline_files import default_ledger

    quiet = args.json or args.jsonl
    say = None if quiet else common.say
    config = checked.config
    unread = unread_params(config, checked.plugins, args.params)
    if unread is not None:  # a misspelt parameter is named, not ignored
        raise unread
    prepared = _check_inputs(args, config)  # before any worker starts: bad input is exit 2
    tensors = read_npz_inputs(args.inputs, config) if args.inputs and prepared is None else None
    if prepared is None and tensors is None:  # exit 2 now, not after loading
        refused = no_inputs(config, checked.plugins, args.params is not None)
        if refused is not None:
            raise refused
    if prepared is not None and prepared.skipped and not args.json:
        print(f"edge: {skipped_line(prepared.skipped)}", file=sys.stderr)
    logs = common.worker_logs(args.verbose, say)
    started = time.perf_counter()
    try:
        pipeline = Pipeline.open(config, checked.plugins, default_ledger(config, checked.plugins),
                                 progress=say, workload=_workload(args, prepared, tensors))
    except ConfigError as exc:  # found as it opens (a demand on a pool no probe reports)
        raise common.config_failure(exc, args.pipeline) from exc
    except Exception as exc:
        raise common.failure_for(exc, "pipeline") from exc
    try:  # from here on the pipeline is closed however the command ends (Ctrl-C too)
        open_s = time.perf_counter() - started
        samples: list[dict[str, Any]] = []
        results: list[dict[str, Any]] = []
        answer: Any = None
        receipt: list[dict[str, Any]] = []
        source = ""
        streamed = False  # a generated text already shown as it arrived
        buffered = BufferedInputs(pipeline)
        if prepared is None:
            if tensors is not None:
                inputs, source = tensors, f"--inputs {args.inputs}"
            else:
                inputs, source = _example_inputs(pipeline, args)
            if not quiet and sys.stdout.isatty() and generated.is_generate(pipeline):
                generated.stream_text(pipeline, inputs, args.params)
                streamed = True
            answer, receipt = _serve(pipeline, buffered.stage(inputs), args, samples)
        else:
            progress = Progress(len(prepared.files), enabled=not quiet)
            try:  # the bar's line is ended however the loop ends (Ctrl-C included)
                for index, file in enumerate(prepared.files):
                    progress.update(index, file)
                    try:  # one input's failure is its own: the next one is still served
                        lines, placement = _serve(pipeline,
                                                  buffered.stage(prepared.get(index)),
                                                  args, samples)
                    except Exception as exc:
                        results.append({"file": file, "ok": False, "error": _reason(exc),
                                        **common.error_fields(exc)})
                        if common.debug_enabled(args):
                            import traceback

                            traceback.print_exception(exc, file=sys.stderr)
                    else:
                        results.append({"file": file, "ok": True, "lines": lines,
                                        "placement": placement})
                    if args.jsonl:
                        print(json.dumps(results[-1], default=str), flush=True)
                progress.update(len(prepared.files), "")
            finally:
                progress.close()
        plan = pipeline.execution_plan()
        annotate_plan(plan)  # each stage's peak after the requests vs its demand
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
    except BaseException:  # Ctrl-C, SIGTERM: closed before the command says it ended so
        pipeline.close()
        raise
    closing = pipeline.close()
    import statistics  # where used: the command's start-up does not pay for it

    stage_ids = [s["id"] for s in plan["stages"]]
    p50_ms: dict[str, float | None] = {  # None: no request succeeded
        sid: statistics.median(s["stages_s"][sid] for s in samples) * 1e3 if samples else None
        for sid in stage_ids}
    p50_ms["total"] = statistics.median(s["total_s"] for s in samples) * 1e3 if samples \
        else None
    failed = [result["file"] for result in results if not result["ok"]]
    head: dict[str, Any] = {"results": results, "failed": failed} if prepared is not None \
        else {"input": source, "answer": answer, "placement": receipt}
    if prepared is not None and prepared.skipped:
        head["skipped"] = prepared.skipped
    code = common.EXIT_FAILED if failed else common.EXIT_OK
    report = {
        **head, "ok": not failed, "pipeline": plan["pipeline"], "open_s": open_s,
        "requests": len(samples), "latency_p50_ms": p50_ms, "input_buffers": buffers,
        "plan": plan, "health": health,
        "closed": closing, "ledger_after_close": pipeline.ledger.snapshot(),
        "worker_logs": str(logs) if logs is not None else None,
        "plugin_errors": plugin_errors,
    }
    unwritten = None  # why --profile could not be written: the answers are reported still
    if args.profile:
        profile = {**report, "samples": samples}
        try:
            Path(args.profile).absolute().parent.mkdir(parents=True, exist_ok=True)
            with open(args.profile, "w", encoding="utf-8") as handle:
                json.dump(profile, handle, indent=2, default=str)
        except OSError as exc:  # checked before the run; the disk filled meanwhile, say
            unwritten = f"--profile {args.profile}: not written: {exc.strerror or exc}"
            report.update(ok=False, profile_error=unwritten)
            code = common.EXIT_FAILED
    if args.json:
        common.print_json(report)
        return code
    out = sys.stderr if args.jsonl else sys.stdout
    for line in _summary(plan):
        print(line, file=out)
    print(f"health: {health['state']}", file=out)
    for line in _health_lines(health):
        print(line, file=out)
    if prepared is None:
        if source.startswith("the example") and config.prepare is not None:
            print(f"input: no --input given, so this read {source}; to read your own "
                  f"file: edge run {args.pipeline} --input FILE", file=out)
        elif source.startswith("the example"):  # no prepare: --input would be refused
            print(f"input: no --inputs given, so this read {source}; to give your own "
                  f"tensors (an .npz by input name): edge run {args.pipeline} --inputs NPZ",
                  file=out)
        if not streamed:
            print_answer(answer, None, out)
        print(f"placement: {_receipt_line(receipt)}", file=out)
    elif not args.jsonl:
        for result in results:
            if not result["ok"]:
                print(f"failed ({result['file']}): {result['error']}", file=out)
                continue
            print_answer(result["lines"], result["file"], out)
            print(f"placement: {_receipt_line(result['placement'])}", file=out)
    if buffers["copied"]:
        print(f"input buffers: {buffers['copied']} tensor(s) copied in once, "
              f"{buffers['sent_by_reference']} request(s) sent them by reference", file=out)
    if samples:
        latency = ", ".join(f"{k} {v:.2f} ms" for k, v in p50_ms.items())
        print(f"latency p50 over {len(samples)} request(s): {latency}", file=out)
    else:
        print("latency: no request succeeded", file=out)
    released = all(v.get("release") == "released" for v in closing.values())
    print(f"closed: every worker retired and verified, reservations released: {released}",
          file=out)
    if args.profile and unwritten is None:
        print(f"profile written to {args.profile}", file=out)
    if unwritten is not None:
        print(f"edge: {unwritten}", file=sys.stderr)
    if failed:
        more = f" and {len(failed) - 10} more" if len(failed) > 10 else ""
        print(f"edge: {len(failed)} of {len(results)} input(s) failed (each with its reason "
              f"in the output): {', '.join(failed[:10])}{more}", file=sys.stderr)
    return code


def _reason(exc: BaseException) -> str:
    """Why one input's request failed, in one line: ``TYPE: message`` (or the refusal)."""
    if isinstance(exc, common.CommandFailed):
        return exc.message
    return common.error_line(exc)


def print_answer(answer: Any, file: str | None, out: TextIO) -> None:
    """Print one answer once: its text lines, "no text found", or its JSON.

    An answer that is a list of items with ``text`` (the OCR example's) prints as those
    lines; an empty list prints ``no text found``; a generated answer prints its text;
    anything else prints as one line of JSON.
    """
    where = f" in {file}" if file else ""
    if isinstance(answer, list) and not answer:
        print(f"no text found{where}", file=out)
        return
    if isinstance(answer, list) and all(isinstance(i, dict) and "text" in i for i in answer):
        print(f"recognised text{where}:", file=out)
        for item in answer:
            print(f"  {item['text']}", file=out)
        return
    if isinstance(answer, dict) and isinstance(answer.get("text"), str):
        print(f"generated text{where} ({answer.get('finish_reason')}):", file=out)
        print(answer["text"], file=out)
        return
    label = f"answer ({file})" if file else "answer"
    print(f"{label}: {json.dumps(answer, default=str)}", file=out)
