"""``edge profile``: measure a pipeline's start-up, requests, streams and memory into a profile.

Exit status: 0 when the run completed, 1 when it failed (the profile is written either
way, naming the step and the error), 2 for a usage error (bad option, unreadable
workload, targets or params) before anything was opened.

The workers' output (a runtime's warnings, a traceback) goes to a log folder, as
``edge run``'s does (:func:`~edge_core.cli.common.worker_logs`), not to the terminal
between the command's own lines: the folder is named on stderr before any worker starts,
again after the summary when the run failed, and as ``worker_logs`` in the ``--json``
document; ``--verbose`` shows the output on stderr instead (``worker_logs`` is then null).
A failed run keeps the folder it names, even where every log in it stayed empty
(:func:`~edge_core.cli.common.end_worker_logs`). Each stage's own log file is named in
the profile's execution plans (``worker.log``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from collections.abc import Callable

from edge_core import discovery
from edge_core.cli import common
from edge_core.evidence.profile_limits import (
    DEFAULT_WINDOW_S,
    MAX_DURATION_S,
    MAX_PROCESS_STARTS,
    MAX_REQUESTS,
    MAX_STARTUP_SAMPLES,
    MAX_WINDOW_S,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from edge_core.evidence.profiling import ProfileSettings

NAME = "profile"

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h)?\s*$")
_UNITS = {None: 1.0, "ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def _levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--concurrency: not a list of integers: {text!r}") from None
    if not levels or any(level < 1 for level in levels):
        raise argparse.ArgumentTypeError(f"--concurrency: levels must be >= 1: {text!r}")
    return levels


def duration(text: str) -> float:
    """Seconds of a duration: ``30m``, ``90s``, ``1.5h``, ``500ms`` or plain seconds."""
    found = _DURATION.match(text)
    seconds = 0.0 if found is None else float(found.group(1)) * _UNITS[found.group(2)]
    if not 0 < seconds < math.inf:  # a run of digits too long for a float is infinite
        raise argparse.ArgumentTypeError(
            f"not a positive duration (30m, 90s, 1h, 500ms, or seconds): {text!r}")
    return seconds


def duration_up_to(high: float, shown: str) -> Callable[[str], float]:
    """An argparse type: a :func:`duration` of at most ``high`` seconds (``shown``: 7d)."""

    def parse(text: str) -> float:
        seconds = duration(text)
        if seconds > high:
            raise argparse.ArgumentTypeError(f"must be at most {shown} ({high:g} s): "
                                             f"{text!r}")
        return seconds

    parse.__name__ = f"duration up to {shown}"
    return parse


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add the ``profile`` command."""
    parser = sub.add_parser(
        NAME, help="profile a pipeline: start-up, latency, token streams, memory",
        description="Open the pipeline, serve warm-up and measured requests (or a "
        "workload, or a sustained run) at each concurrency level, and write a JSON "
        "profile: start-up phases, p50/p95 with sample counts, token streams, worker "
        "memory peaks, placement, operating conditions, raw samples, the plugins that did "
        "not load (plugin_errors). Exit 0 when the run "
        "completed, 1 when it failed (the profile says where), 2 for a usage problem, an "
        "--input/--inputs file that is missing, unreadable or unfit, no input at all where "
        "the first stage bundles no example inputs, a --sysfs that is not a directory, or a "
        "problem in the pipeline file (every one named at once), each before anything "
        "opens. The workers' output goes to a log folder, named on stderr (again after the "
        "summary when the run failed) and as worker_logs under --json; --verbose shows it "
        "on stderr instead.",
        epilog=common.examples(
            "edge profile build/ocr/pipeline.toml --input build/ocr/page.png --requests 5",
            "edge profile pipeline.toml --inputs x.npz --concurrency 1,2 --out p.json "
            "--records qualification/"),
        formatter_class=common.HelpFormatter)
    common.add_json_flag(parser)
    common.add_pipeline_arguments(parser)
    common.add_verbose_flag(parser)
    parser.add_argument("--input", dest="sources", action="append", default=[],
                        metavar="PATH",
                        help="an input for the pipeline's prepare function; one group each "
                        "(repeatable)")
    parser.add_argument("--inputs", dest="npz", action="append", default=[], metavar="NPZ",
                        help="first-stage inputs as an .npz; one group each (repeatable)")
    parser.add_argument("--workload", metavar="FILE",
                        help="request classes for the final stage, JSONL: one request per "
                        'line, {"class": ..., "prompt"|"messages"|"prompt_token_ids": ..., '
                        '"params": {...}}')
    parser.add_argument("--params", type=common.json_object, metavar="JSON",
                        help="the final stage's params for a single request class "
                        "(e.g. a prompt and sampling parameters)")
    parser.add_argument("--requests", type=common.int_between(1, MAX_REQUESTS), default=20,
                        metavar="N",
                        help="measured requests per class (or input group) and concurrency "
                        "level (default 20, the protocol's minimum; fewer is flagged; at "
                        f"most {MAX_REQUESTS})")
    parser.add_argument("--warmup", type=common.int_between(0, MAX_REQUESTS), default=2,
                        metavar="N",
                        help=f"unmeasured warm-up requests per group (default 2, at most "
                        f"{MAX_REQUESTS})")
    parser.add_argument("--concurrency", type=_levels, default=(1, 2, 4), metavar="LEVELS",
                        help="comma-separated concurrency levels (default 1,2,4; levels "
                        "above the pipeline's admission are skipped and say so)")
    parser.add_argument("--process-starts", type=common.int_between(1, MAX_PROCESS_STARTS),
                        default=3, metavar="N",
                        help="bare worker starts per route to time process start (default 3, "
                        f"at most {MAX_PROCESS_STARTS})")
    parser.add_argument("--startup-samples", type=common.int_between(0, MAX_STARTUP_SAMPLES),
                        default=1, metavar="N",
                        help="traced start-ups, each between two untraced ones (default 1: "
                        "untraced, traced, untraced; 0: the measuring run alone, with no "
                        f"start-up phases and no tracer overhead; at most "
                        f"{MAX_STARTUP_SAMPLES})")
    parser.add_argument("--matched-requests", type=common.int_between(1, MAX_REQUESTS),
                        default=5, metavar="N",
                        help="requests every run serves alike, to compare traced and untraced "
                        f"runs (default 5, at most {MAX_REQUESTS})")
    parser.add_argument("--no-warm-restart", action="store_true",
                        help="skip restarting every stage in the first runs")
    parser.add_argument("--duration", type=duration_up_to(MAX_DURATION_S, "168h"),
                        metavar="DURATION",
                        help="also run a sustained load this long (30m, 90s, 1h) at the "
                        "highest admitted --concurrency level: per-window p50/p95, memory, "
                        "frequency, temperature and their trends (at most 168h)")
    parser.add_argument("--window", type=duration_up_to(MAX_WINDOW_S, "24h"), default=None,
                        metavar="DURATION",
                        help="the sustained run's window, with --duration and no longer "
                        "than it (default 1m, at most 24h)")
    parser.add_argument("--chunk-seconds", type=common.positive_seconds, metavar="SECONDS",
                        help="media seconds each streamed event carries, where the stage "
                        "does not say (duration_s): enables the real-time measures")
    parser.add_argument("--slow-consumer-pause", type=common.non_negative_seconds, default=1.0,
                        metavar="SECONDS",
                        help="how long the slow consumer stops reading (default 1)")
    parser.add_argument("--targets", metavar="FILE",
                        help="product targets (TOML or JSON: targets = [\"ttft_p95_ms <= "
                        "800\", ...]) recorded with the profile, beside the pipeline's own")
    parser.add_argument("--sysfs", metavar="DIR",
                        help="read CPU frequency, thermal zones and power from this sysfs "
                        "root instead of /sys (also EDGE_SYSFS_ROOT)")
    parser.add_argument("--out", default="profile.json", metavar="PATH",
                        help="where to write the JSON profile (default profile.json)")
    parser.add_argument("--records", metavar="DIR",
                        help="also write its qualification records into DIR (as 'edge "
                        "qualify --profile' would): one per stage and tried candidate")
    parser.set_defaults(func=run)


def _stream_lines(name: str, level: dict[str, Any]) -> list[str]:
    stream = level["stream"]
    ttft, gap = stream["ttft_ms"], stream["inter_token_ms"]
    decode = stream["decode_tokens_per_s"].get("pooled")
    prefill = stream["prefill_tokens_per_s"].get("pooled")
    line = (f"  {name} @ concurrency {level['concurrency']}: n={stream['n']}")
    if ttft.get("n"):
        line += f", ttft p50 {ttft['p50_ms']:.1f} ms p95 {ttft['p95_ms']:.1f} ms"
    if gap.get("n"):
        line += f", inter-token p50 {gap['p50_ms']:.2f} ms p95 {gap['p95_ms']:.2f} ms"
    if decode:
        line += f", decode {decode:.1f} tok/s"
    if prefill:
        line += f", prefill {prefill:.1f} tok/s"
    lines = [line]
    realtime = stream.get("realtime")
    if realtime:
        rtf = realtime["rtf"]
        lines.append(f"    real time: first chunk p95 "
                     f"{realtime['first_chunk_ms'].get('p95_ms', 0):.1f} ms, RTF max "
                     f"{rtf.get('max', 0):.3f}, {realtime['deficits']} playback deficit(s) "
                     f"({realtime['deficit_s']:.3f} s)")
    return lines


def _summary(profile: dict[str, Any]) -> list[str]:
    lines = []
    traced = profile.get("traced") or {}
    for sid, phases in (traced.get("stages") or {}).items():
        parts = ", ".join(f"{name.removesuffix('_s')} {value * 1e3:.0f} ms"
                          for name, value in phases.items() if isinstance(value, float))
        lines.append(f"  start-up {sid}: {parts}")
    if "first_output_s" in traced:
        lines.append(f"  first output (traced run): {traced['first_output_s'] * 1e3:.0f} ms")
    baseline = profile.get("baseline") or {}
    if "open_total_s" in baseline:
        lines.append(f"  baseline (untraced): open {baseline['open_total_s'] * 1e3:.0f} ms, "
                     f"first output {baseline.get('first_output_s', 0) * 1e3:.0f} ms")
    overhead = (profile.get("instrumentation") or {}).get("matched_p50_ms") or {}
    if isinstance(overhead.get("overhead"), float):
        lines.append(f"  tracer overhead on the matched requests: "
                     f"{overhead['overhead']:+.2f} ms p50 (order effect "
                     f"{overhead.get('order_effect') or 0:+.2f} ms)")
    for group in baseline.get("groups") or []:
        for level in group["levels"]:
            if level["status"] == "skipped":
                lines.append(f"  {group['name']} @ concurrency {level['concurrency']}: "
                             f"{level['status']} ({level.get('reason')})")
                continue
            errors = f", {len(level['errors'])} error(s)" if level.get("errors") else ""
            if "stream" in level:
                lines += _stream_lines(group["name"], level)
                continue
            total = level["summary"]["total"]
            if not total.get("n"):
                lines.append(f"  {group['name']} @ concurrency {level['concurrency']}: "
                             f"no request completed{errors}")
                continue
            lines.append(f"  {group['name']} @ concurrency {level['concurrency']}: "
                         f"p50 {total['p50_ms']:.1f} ms, p95 {total['p95_ms']:.1f} ms "
                         f"(n={total['n']}), {level['throughput_rps']:.2f} req/s{errors}")
    memory = baseline.get("memory") or {}
    for name, tree in ((memory.get("told_apart") or {}).get("trees") or {}).items():
        loading, runtime = tree.get("loading_peak_bytes"), tree.get("runtime_peak_bytes")
        lines.append(f"  memory {name}: loading peak "
                     f"{(loading or 0) / 2**20:.0f} MiB, runtime peak "
                     + (f"{runtime / 2**20:.0f} MiB" if isinstance(runtime, int)
                        else "not separable here"))
    sampled = (memory.get("sampled") or {}).get("peak_of_sum_bytes")
    if sampled:
        lines.append(f"  memory: peak of the summed worker trees {sampled / 2**20:.0f} MiB "
                     "(sampled)")
    quality = baseline.get("quality") or {}
    if quality.get("declared"):
        shown = ", ".join(f"{k} {v:.4g}" for k, v in (quality.get("metrics") or {}).items())
        lines.append(f"  quality {quality.get('function')}: {shown or quality.get('error')}"
                     f" -> {'met' if quality.get('met') else 'NOT met'}")
    summary = (profile.get("conditions") or {}).get("summary") or {}
    if summary:
        load = summary.get("load_average") or {}
        freq = summary.get("frequency") or {}
        lines.append(f"  conditions: load {load.get('before')} -> {load.get('after')}, "
                     f"frequency {freq.get('source')} (changed: {freq.get('changed')}), "
                     f"temperature {summary.get('temperature_c')}, power "
                     f"{((summary.get('power') or {}).get('before') or {}).get('source')}")
    return lines


def _command(args: argparse.Namespace, levels: tuple[int, ...]) -> list[str]:
    """The reproducible command: every setting spelled out, defaults included."""
    argv = ["edge", NAME, args.pipeline]
    if args.name:
        argv += ["--name", args.name]
    for source in args.sources:
        argv += ["--input", source]
    for file in args.npz:
        argv += ["--inputs", file]
    if args.workload:
        argv += ["--workload", args.workload]
    if args.params is not None:
        argv += ["--params", json.dumps(args.params)]
    argv += ["--requests", str(args.requests), "--warmup", str(args.warmup),
             "--concurrency", ",".join(map(str, levels)),
             "--process-starts", str(args.process_starts),
             "--startup-samples", str(args.startup_samples),
             "--matched-requests", str(args.matched_requests),
             "--slow-consumer-pause", f"{args.slow_consumer_pause:g}"]
    if args.duration is not None:
        argv += ["--duration", f"{args.duration:g}s", "--window", f"{args.window:g}s"]
    if args.chunk_seconds is not None:
        argv += ["--chunk-seconds", f"{args.chunk_seconds:g}"]
    if args.targets:
        argv += ["--targets", args.targets]
    if args.sysfs:
        argv += ["--sysfs", args.sysfs]
    argv += ["--out", args.out]
    if args.no_warm_restart:
        argv.append("--no-warm-restart")
    if args.records:
        argv += ["--records", args.records]
    return argv


def _write_records(profile: dict[str, Any], args: argparse.Namespace) -> list[str]:
    from edge_core.evidence.candidate_records import records_from_profile
    from edge_core.evidence.records import write_record

    records = records_from_profile(profile, profile_path=args.out)
    return [str(write_record(r, os.path.join(args.records, f"{r.record_id}.json")))
            for r in records]


def _figures(profile: dict[str, Any]) -> dict[str, Any]:
    """Per class (or input group) and level, the headline figures with their ``n``."""
    streams: dict[str, Any] = {}
    latency: dict[str, Any] = {}
    for group in (profile.get("baseline") or {}).get("groups") or []:
        for level in group["levels"]:
            key = f"c{level['concurrency']}"
            if "stream" in level:
                s = level["stream"]
                streams.setdefault(group["name"], {})[key] = {
                    "n": s["n"], "errors": len(level.get("errors") or []),
                    "ttft_ms": s["ttft_ms"], "inter_token_ms": s["inter_token_ms"],
                    "decode_tokens_per_s": s["decode_tokens_per_s"],
                    "prefill_tokens_per_s": s["prefill_tokens_per_s"],
                    "tokens": s["tokens"], "request_ms": s["request_ms"],
                    **({"realtime": s["realtime"]} if "realtime" in s else {})}
            elif "summary" in level:
                latency.setdefault(group["name"], {})[key] = {
                    **level["summary"]["total"], "errors": len(level.get("errors") or []),
                    "throughput_rps": level.get("throughput_rps")}
            else:
                latency.setdefault(group["name"], {})[key] = {
                    "status": level["status"], "reason": level.get("reason")}
    return {"streams": streams, "latency": latency}


def _targets(args: argparse.Namespace) -> tuple[str, ...]:
    from edge_core.evidence.errors import RecordInvalid
    from edge_core.evidence.targets import load_targets

    if not args.targets:
        return ()
    try:
        return tuple(t.text for t in load_targets(args.targets))
    except RecordInvalid as exc:
        raise common.CommandFailed(common.EXIT_USAGE, str(exc)) from exc


def _classes(args: argparse.Namespace) -> list[Any]:
    from edge_core.evidence.errors import RecordInvalid
    from edge_core.evidence.workload_file import classes_from_params, read_workload

    if args.workload and args.params is not None:
        raise common.CommandFailed(common.EXIT_USAGE, "--params: give --workload or --params, "
                                   "not both (put shared params in each workload line)")
    try:
        if args.workload:
            return read_workload(args.workload)
        if args.params is not None:
            return classes_from_params(args.params)
    except RecordInvalid as exc:
        raise common.CommandFailed(common.EXIT_USAGE, str(exc)) from exc
    return []


def _check_inputs(args: argparse.Namespace, config: Any, plugins: Any,
                  classes: list[Any]) -> None:
    """Refuse (exit 2) inputs the pipeline cannot take, before anything opens.

    ``--input`` needs a ``prepare`` function in the pipeline; each ``--inputs`` archive
    is read and checked as ``edge run`` checks it (pickle disabled, the first stage's
    declared shapes). The files themselves were checked readable before the pipeline
    file was read (:func:`~edge_core.cli.run_inputs.check_readable`). Without any input
    or request class, the first stage's bundled example inputs are read: a first stage
    none of whose bundles names any is refused here, as ``edge run`` refuses it (it was
    the profile's failure, exit 1, after the first open); with request classes
    (``--params``, ``--workload``) but no input, too, unless a candidate of the first
    stage generates (:func:`~edge_core.cli.run_inputs.no_inputs`). Nothing is reserved
    and no worker starts before this passes.
    """
    from edge_core.cli.run_inputs import no_inputs, read_npz_inputs

    if not (args.sources or args.npz):
        refused = no_inputs(config, plugins, bool(classes))
        if refused is not None:
            raise refused
    if args.sources and config.prepare is None:
        raise common.CommandFailed(common.EXIT_USAGE, f"--input {args.sources[0]}: the "
                                   "pipeline names no 'prepare' function to read it with "
                                   "(give its first stage's tensors with --inputs NPZ)")
    for file in args.npz:
        read_npz_inputs(file, config)


def _check_pools(args: argparse.Namespace, checked: Any) -> None:
    """Refuse (exit 2) a stage without candidates demanding a pool the host lacks.

    A configuration problem of the file, as ``edge run`` and ``edge plan`` refuse it: found
    from the pools the host and the backends' probes report, before any worker starts;
    no profile is written (:func:`~edge_core.runtime.pipeline_files.refuse_unknown_pools`).
    The backends are asked only for a pool the host does not have
    (:func:`~edge_core.runtime.pipeline_files.checking_ledger`): each profiled run's open
    probes them, as ``edge run``'s does.
    """
    from edge_core.errors import ConfigError
    from edge_core.runtime.pipeline_files import checking_ledger, refuse_unknown_pools

    try:
        refuse_unknown_pools(checked.config, checking_ledger(checked.config, checked.plugins))
    except ConfigError as exc:
        raise common.config_failure(exc, args.pipeline) from exc


def run(args: argparse.Namespace) -> int:
    """Profile the pipeline, write the profile, print a summary; 1 when the run failed.

    The JSON document and the profile file hold the profile's ``plugin_errors`` (every
    plugin that did not load, as :func:`~edge_core.evidence.profiling.run_profile` lists
    them); a failure's document, once the file is checked, the check's
    (:func:`edge_core.discovery.plugin_errors`).
    """
    from edge_core.cli.run_inputs import check_readable
    from edge_core.evidence.profiling import ProfileSettings

    levels = args.concurrency
    classes = _classes(args)
    targets = _targets(args)
    _check_window(args)
    try:
        settings = ProfileSettings(requests=args.requests, warmup_requests=args.warmup,
                                   concurrency=levels,
                                   process_start_repeats=args.process_starts,
                                   warm_restart=not args.no_warm_restart,
                                   startup_samples=args.startup_samples,
                                   matched_requests=args.matched_requests,
                                   slow_consumer_pause_s=args.slow_consumer_pause,
                                   chunk_seconds=args.chunk_seconds,
                                   duration_s=args.duration, window_s=args.window,
                                   sysfs=args.sysfs, targets=targets)
    except ValueError as exc:
        raise common.CommandFailed(common.EXIT_USAGE, str(exc)) from exc
    for option, files in (("--input", args.sources), ("--inputs", args.npz)):
        for file in files:  # a missing or unreadable file: exit 2, before anything else
            check_readable(option, file)
    if args.sysfs is not None and not os.path.isdir(args.sysfs):  # read as it runs: not later
        raise common.CommandFailed(common.EXIT_USAGE, f"--sysfs {args.sysfs}: not an existing "
                                   "directory (a sysfs root, such as /sys)")
    common.check_output(args.out, "--out")  # where it writes: exit 2, before anything opens
    if args.records:
        common.check_output(args.records, "--records", directory=True)
    checked = common.checked_pipeline(args)  # every problem of the file: exit 2
    errors = discovery.plugin_errors(record.to_json() for record in checked.plugins.records)
    with common.PluginErrorsOnFailure(errors):
        return _profile(args, checked, settings, classes, levels)


def _check_window(args: argparse.Namespace) -> None:
    """``--window`` only with ``--duration`` and no longer than it (exit 2); its default.

    A window longer than the run would be cut to the run's length: one window, no trend.
    The default window (a minute) is cut so for a shorter ``--duration``, as documented.
    """
    if args.window is None:
        args.window = DEFAULT_WINDOW_S
        return
    if args.duration is None:
        raise common.CommandFailed(common.EXIT_USAGE, f"--window {args.window:g}s: only "
                                   "with --duration (it divides the sustained run)")
    if args.window > args.duration:
        raise common.CommandFailed(common.EXIT_USAGE, f"--window {args.window:g}s: longer "
                                   f"than --duration {args.duration:g}s (the run would be "
                                   "one window, with no trend)")


def _profile(args: argparse.Namespace, checked: Any, settings: ProfileSettings,
             classes: list[Any], levels: tuple[int, ...]) -> int:
    """Profile the checked pipeline, write the profile, print a summary; exit 0 / 1 / 2."""
    from edge_core.evidence.profiling import run_profile, write_profile
    from edge_core.progress import Progress

    # what they need of the pipeline: exit 2
    _check_inputs(args, checked.config, checked.plugins, classes)
    _check_pools(args, checked)
    say = None if args.json else common.say
    logs = common.worker_logs(args.verbose, say)  # not the terminal: before any worker starts
    with Progress("requests", unit="requests", enabled=False if args.json else None) as bar:
        profile = run_profile(args.pipeline, name=args.name, sources=args.sources,
                              npz_files=args.npz, classes=classes, settings=settings,
                              command=_command(args, levels), progress=bar, say=say)
    write_profile(profile, args.out)  # its plugin_errors: those of the plugins it ran with
    records = _write_records(profile, args) if args.records else []
    outcome = profile["outcome"]
    if args.json:
        common.print_json({"ok": outcome["ok"], "profile": args.out, "outcome": outcome,
                           "records": records, "streamed": profile.get("streamed"),
                           **_figures(profile),
                           "instrumentation": profile.get("instrumentation"),
                           "conditions": (profile.get("conditions") or {}).get("summary"),
                           "worker_logs": str(logs) if logs is not None else None,
                           "plugin_errors": profile["plugin_errors"]})
    else:
        print(f"profile of {profile['pipeline_file']}: "
              + ("ok" if outcome["ok"] else
                 f"FAILED at {outcome['step']}: {outcome['error_type']}: {outcome['error']}"))
        for line in _summary(profile):
            print(line)
        if args.requests < 20:
            print(f"  note: {args.requests} request(s) per level is below the protocol's 20; "
                  "the records flag it and leave performance unjudged")
        print(f"profile written to {args.out}")
        for record in records:
            print(f"record written to {record}")
        if not outcome["ok"] and logs is not None:  # where the workers said what went wrong
            print(f"edge: worker logs: {logs}", file=sys.stderr)
    return common.EXIT_OK if outcome["ok"] else common.EXIT_FAILED
