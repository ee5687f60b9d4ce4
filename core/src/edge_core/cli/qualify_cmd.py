"""``edge qualify``: write one qualification record from a profile or an AI Hub job record.

Exit status: 0 when the record was written (whatever its status), 2 when the profile, job
record or targets file cannot be read or is malformed, or ``--out`` / ``--out-dir``
cannot be written (checked before anything is read).
"""

from __future__ import annotations

import argparse
import json
import os

from edge_core.cli import common

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

NAME = "qualify"


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add the ``qualify`` command."""
    parser = common.add_command(
        sub, NAME, "write a qualification record (PASS ... BLOCKED) from a profile",
        "Turn a profile from 'edge profile' (or an AI Hub job record) into a qualification "
        "record: a status (PASS, PARTIAL, COMPONENT, PROFILE_ONLY, FAILED, REJECTED, BLOCKED), "
        "the identities, the command, and on failure the failing layer and the next step. "
        "A profile of a pipeline with candidate backends gives one record per stage and "
        "tried candidate. Exit 2 for an unreadable source, or an --out or --out-dir that "
        "cannot be written.",
        "edge qualify --profile profile.json",
        "edge qualify --profile profile.json --device laptop --out-dir qualification")
    common.add_json_flag(parser)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--profile", metavar="PATH", help="a profile from `edge profile`")
    source.add_argument("--hub-job", metavar="PATH",
                        help="an AI Hub job record (JSON: status, device, job ids, compute "
                        "units, inference time, peak memory)")
    parser.add_argument("--device", metavar="LABEL",
                        help="the cell's device label (default: from the source)")
    parser.add_argument("--model", metavar="LABEL",
                        help="the cell's model label (default: from the source)")
    parser.add_argument("--configuration", metavar="LABEL",
                        help="the cell's configuration label (default: from the source)")
    parser.add_argument("--out", metavar="PATH",
                        help="where to write the record (default qualification/<id>.json); "
                        "not with a profile of candidate backends, which gives several")
    parser.add_argument("--targets", metavar="FILE",
                        help="judge performance against these product targets (TOML or "
                        "JSON: targets = [\"ttft_p95_ms <= 800\", ...]) instead of those "
                        "the profile recorded")
    parser.add_argument("--out-dir", default="qualification", metavar="DIR",
                        help="the folder of the records named by id (default qualification)")
    parser.set_defaults(func=run)


def _read(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, json.JSONDecodeError) as exc:
        raise common.CommandFailed(common.EXIT_USAGE,
                                   f"{path}: cannot read JSON: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise common.CommandFailed(common.EXIT_USAGE, f"{path}: not valid UTF-8 "
                                   f"(byte {exc.start}: {exc.reason})") from None


def run(args: argparse.Namespace) -> int:
    """Build the record, write it, print its status (and failing layer)."""
    from edge_core.evidence.candidate_records import records_from_profile
    from edge_core.evidence.errors import RecordInvalid
    from edge_core.evidence.hubjob import record_from_hub_job
    from edge_core.evidence.records import write_record
    from edge_core.evidence.targets import load_targets

    if args.out:  # where it writes: exit 2, before anything is read
        common.check_output(args.out, "--out")
    else:
        common.check_output(args.out_dir, "--out-dir", directory=True)
    labels = {"device": args.device, "model": args.model, "configuration": args.configuration}
    try:
        targets = ([t.text for t in load_targets(args.targets)] if args.targets else None)
    except RecordInvalid as exc:  # names the targets file
        raise common.CommandFailed(common.EXIT_USAGE, str(exc)) from exc
    source = args.profile or args.hub_job
    document = _read(source)
    try:
        if args.profile:
            records = records_from_profile(document, profile_path=args.profile,
                                           labels=labels, targets=targets,
                                           targets_origin=f"--targets {args.targets}")
        else:
            argv = ["edge", NAME, "--hub-job", args.hub_job]
            records = [record_from_hub_job(document, job_path=args.hub_job,
                                           labels=labels, command=argv)]
    except RecordInvalid as exc:  # the field of the source: named with its file
        raise common.CommandFailed(common.EXIT_USAGE, f"{source}: {exc}") from exc
    if args.out and len(records) > 1:
        raise common.CommandFailed(
            common.EXIT_USAGE, f"--out: the profile tried candidate backends and gives "
            f"{len(records)} records (one per stage and candidate): use --out-dir: {args.out!r}")
    paths = [write_record(record, args.out or os.path.join(args.out_dir,
                                                           f"{record.record_id}.json"))
             for record in records]
    if args.json:
        listed = [_summary(record, path) for record, path in zip(records, paths, strict=True)]
        common.print_json({"ok": True, **listed[0], "records": listed})
        return common.EXIT_OK
    for record, path in zip(records, paths, strict=True):
        print_record(record, str(path))
    return common.EXIT_OK


def _summary(record: Any, path: Any) -> dict[str, Any]:
    return {"record": str(path), "status": record.status.value, "cell": list(record.cell.key),
            "failure": record.to_json()["failure"], "verdicts": dict(record.verdicts)}


def print_record(record: Any, path: str) -> None:
    """Print one record's status, cell, failing layer and notes, and where it was written."""
    cell = record.cell
    print(f"{record.status.value}: {cell.model} x {cell.device} / {cell.configuration}")
    if record.failure is not None:
        print(f"  failing layer: {record.failure.layer}: {record.failure.reason}")
        print(f"  next step: {record.failure.next_step}")
    for name, verdict in record.verdicts.items():
        print(f"  {name}: {verdict.get('verdict')} ({verdict.get('basis')})")
    for note in record.notes:
        print(f"  note: {note}")
    print(f"record written to {path}")
