"""``edge profile``: measure a pipeline's start-up, latency and memory into a JSON profile."""

from __future__ import annotations

import argparse
import os
import sys

from edge_core.cli import common

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

NAME = "profile"


def _levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--concurrency: not a list of integers: {text!r}") from None
    if not levels or any(level < 1 for level in levels):
        raise argparse.ArgumentTypeError(f"--concurrency: levels must be >= 1: {text!r}")
    return levels


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add the ``profile`` command."""
    parser = sub.add_parser(NAME, help="profile a pipeline: start-up phases, latency, memory")
    common.add_json_flag(parser)
    parser.add_argument("pipeline", help="a pipeline file (.toml/.yaml/.json) or pyproject.toml")
    parser.add_argument("--name", help="the pipeline's name in pyproject.toml")
    parser.add_argument("--input", dest="sources", action="append", default=[],
                        metavar="SOURCE",
                        help="an input for the pipeline's prepare function; one group each "
                        "(repeatable)")
    parser.add_argument("--inputs", dest="npz", action="append", default=[], metavar="NPZ",
                        help="first-stage inputs as an .npz; one group each (repeatable)")
    parser.add_argument("--requests", type=int, default=20, metavar="N",
                        help="measured requests per group and concurrency level (default 20)")
    parser.add_argument("--warmup", type=int, default=2, metavar="N",
                        help="unmeasured warm-up requests per group (default 2)")
    parser.add_argument("--concurrency", type=_levels, default=(1, 2, 4), metavar="LEVELS",
                        help="comma-separated concurrency levels (default 1,2,4; levels "
                        "above the pipeline's admission are skipped and say so)")
    parser.add_argument("--process-starts", type=int, default=3, metavar="N",
                        help="bare worker starts per route to time process start (default 3)")
    parser.add_argument("--no-warm-restart", action="store_true",
                        help="skip restarting every stage in the traced run")
    parser.add_argument("--out", default="profile.json", metavar="PATH",
                        help="where to write the JSON profile (default profile.json)")
    parser.add_argument("--records", metavar="DIR",
                        help="also write its qualification records into DIR (as `edge "
                        "qualify --profile` would): one per stage and tried candidate")
    parser.set_defaults(func=run)


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
    for group in baseline.get("groups") or []:
        for level in group["levels"]:
            if level["status"] != "measured":
                lines.append(f"  {group['name']} @ concurrency {level['concurrency']}: "
                             f"{level['status']} ({level.get('reason')})")
                continue
            total = level["summary"]["total"]
            lines.append(f"  {group['name']} @ concurrency {level['concurrency']}: "
                         f"p50 {total['p50_ms']:.1f} ms, p95 {total['p95_ms']:.1f} ms "
                         f"(n={total['n']}), {level['throughput_rps']:.2f} req/s")
    for sid, memory in ((baseline.get("memory") or {}).get("stages") or {}).items():
        peak = memory.get("worker_tree_peak_rss_bytes")
        if isinstance(peak, int):
            lines.append(f"  memory {sid}: worker-tree peak {peak / 2**20:.0f} MiB")
    return lines


def _command(args: argparse.Namespace) -> list[str]:
    """The reproducible command: every setting spelled out, defaults included."""
    argv = ["edge", NAME, args.pipeline]
    if args.name:
        argv += ["--name", args.name]
    for source in args.sources:
        argv += ["--input", source]
    for file in args.npz:
        argv += ["--inputs", file]
    argv += ["--requests", str(args.requests), "--warmup", str(args.warmup),
             "--concurrency", ",".join(map(str, args.concurrency)),
             "--process-starts", str(args.process_starts), "--out", args.out]
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


def run(args: argparse.Namespace) -> int:
    """Profile the pipeline, write the profile, print a summary; 1 when the run failed."""
    from edge_core.evidence.profiling import ProfileSettings, run_profile, write_profile
    from edge_core.progress import Progress

    try:
        settings = ProfileSettings(requests=args.requests, warmup_requests=args.warmup,
                                   concurrency=args.concurrency,
                                   process_start_repeats=args.process_starts,
                                   warm_restart=not args.no_warm_restart)
    except ValueError as exc:
        raise common.CommandFailed(common.EXIT_USAGE, str(exc)) from exc
    say = None if args.json else (lambda message: print(f"edge: {message}", file=sys.stderr))
    with Progress("requests", unit="requests", enabled=False if args.json else None) as bar:
        profile = run_profile(args.pipeline, name=args.name, sources=args.sources,
                              npz_files=args.npz, settings=settings,
                              command=_command(args),
                              progress=bar, say=say)
    write_profile(profile, args.out)
    records = _write_records(profile, args) if args.records else []
    outcome = profile["outcome"]
    if args.json:
        common.print_json({"ok": outcome["ok"], "profile": args.out, "outcome": outcome,
                           "records": records})
    else:
        print(f"profile of {profile['pipeline_file']}: "
              + ("ok" if outcome["ok"] else
                 f"FAILED at {outcome['step']}: {outcome['error_type']}: {outcome['error']}"))
        for line in _summary(profile):
            print(line)
        print(f"profile written to {args.out}")
        for record in records:
            print(f"record written to {record}")
    return common.EXIT_OK if outcome["ok"] else common.EXIT_FAILED
