"""``edge hub devices|compile|profile|infer``: AI Hub as a qualification facility.

Registration is cheap: ``qai_hub``, numpy and onnxruntime are imported only when a
``hub`` command runs. Progress (job states, retries) goes to stderr; the result goes to
stdout (``--json``: one JSON document); each bundle command writes an evidence record.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

__all__ = ["NAME", "register", "run"]

NAME = "hub"


def _connection(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("connection")
    group.add_argument("--config", metavar="PATH",
                       help="qai-hub client ini (default: $QAIHUB_CLIENT_INI, "
                       "then ~/.qai_hub/client.ini)")
    group.add_argument("--api-token", metavar="TOKEN",
                       help="explicit API token (instead of an ini file)")
    group.add_argument("--api-url", default="https://workbench.aihub.qualcomm.com",
                       metavar="URL", help="API URL with --api-token (default "
                       "https://workbench.aihub.qualcomm.com)")
    group.add_argument("--web-url", default=None, metavar="URL",
                       help="web URL with --api-token (default: the API URL)")
    group.add_argument("--retries", type=int, default=2, metavar="N",
                       help="retries per HTTP call (default 2; the client's own is 6)")
    group.add_argument("--job-timeout", type=float, default=1800.0, metavar="SECONDS",
                       help="seconds to wait for one job (default 1800)")
    group.add_argument("--poll", type=float, default=5.0, metavar="SECONDS",
                       help="seconds between job-status polls (default 5)")
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")


def register(subparsers: Any) -> None:
    """Add ``edge hub`` and its subcommands."""
    from edge_core.cli.common import add_command

    parser = add_command(
        subparsers, NAME, "AI Hub: compile, profile and run a bundle on a hosted device "
        "(evidence records, never local deployment; needs edge-qnn[hub])",
        "Use Qualcomm AI Hub as a qualification facility: compile a bundle's graph for a "
        "hosted Snapdragon device, profile it there, run its example inputs and compare the "
        "outputs with the local reference. Each job writes an evidence record ('edge "
        "qualify --hub-job'); nothing is deployed locally. Needs the network and an AI Hub "
        "account. Exit 0 done, 1 a job failed, 2 a usage problem.",
        "edge hub devices",
        "edge hub infer build/ocr/classify-qnn --device NAME   # NAME: from edge hub devices")
    commands = parser.add_subparsers(dest="hub_command", required=True, metavar="ACTION",
                                     title="actions")
    devices = add_command(commands, "devices", "list the service's devices",
                          "List the devices AI Hub offers (their exact names).",
                          "edge hub devices")
    devices.add_argument("--name", default="", metavar="NAME",
                         help="an exact device name (default: every device)")
    _connection(devices)
    for name, text, detail in (
            ("compile", "compile the bundle's graph for a device",
             "Upload the bundle's graph and compile it for the named hosted device; the job "
             "record names the compiled target."),
            ("profile", "compile, then profile on the device",
             "Compile the bundle's graph for the named hosted device, then profile it there: "
             "inference time, peak memory and compute units go into the job record."),
            ("infer", "compile, profile and run the example inputs; compare the outputs "
             "with the local reference",
             "Compile and profile the bundle's graph on the named hosted device, run the "
             "bundle's example inputs there and compare the outputs with the local "
             "reference; the job record holds the comparison.")):
        sub = add_command(commands, name, text, detail,
                          f"edge hub {name} build/ocr/classify-qnn --device NAME")
        sub.add_argument("bundle", metavar="BUNDLE", help="an artifact bundle directory")
        sub.add_argument("--device", required=True, metavar="NAME",
                         help="exact device name (edge hub devices)")
        sub.add_argument("--options", default=None, metavar="TEXT",
                         help="compile options (default: --target_runtime qnn_context_binary)")
        sub.add_argument("--record-dir", default=".", metavar="DIR",
                         help="where the evidence record is written (default: .)")
        _connection(sub)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run one ``edge hub`` command; exit 0 on success, 1 on a hub failure, 2 on usage."""
    from edge_core.cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, print_json

    try:
        from edge_qnn.hub.session import HubError, HubSession, HubSettings
    except ImportError as exc:
        print(f"edge: hub: the qai-hub client is not installed ({exc}); "
              "pip install 'edge-qnn[hub]'", file=sys.stderr)
        return EXIT_USAGE
    try:
        settings = HubSettings(
            config=args.config, api_token=args.api_token, api_url=args.api_url,
            web_url=args.web_url or args.api_url, retries=args.retries,
            job_timeout_s=args.job_timeout, poll_s=args.poll)
    except ValueError as exc:
        print(f"edge: hub: {exc}", file=sys.stderr)
        return EXIT_USAGE
    record: dict[str, Any] = {}
    try:
        session = HubSession(settings, sys.stderr)
        if args.hub_command == "devices":
            from edge_qnn.hub.workflow import list_devices

            devices = list_devices(session, args.name)
            if args.json:
                print_json({"ok": True, "devices": devices})
            else:
                for device in devices:
                    print(f"{device['name']}  (os {device['os']}; "
                          f"{', '.join(device['attributes'])})")
            return EXIT_OK
        from edge_qnn.hub.workflow import DEFAULT_COMPILE_OPTIONS, run_bundle

        record = run_bundle(session, args.hub_command, Path(args.bundle), args.device,
                            args.options or DEFAULT_COMPILE_OPTIONS, record)
    except HubError as exc:
        return _failed(args, record, exc, EXIT_FAILED)
    except Exception as exc:  # a bundle refused before any job: still a typed message
        from edge_core.errors import EdgeError

        if not isinstance(exc, EdgeError):
            raise
        return _failed(args, record, exc, EXIT_FAILED)
    return _finish(args, record)


def _failed(args: argparse.Namespace, record: dict[str, Any], exc: Exception,
            code: int) -> int:
    from edge_core.cli.common import print_json

    body: dict[str, Any] = {"ok": False, "error": str(exc),
                            "job_id": getattr(exc, "job_id", None)}
    if record:
        record["status"] = "failed"
        record["error"] = str(exc)
        body["record"] = str(_write(args, record))
    if args.json:
        print_json(body)
    else:
        print(f"edge: hub: {exc}", file=sys.stderr)
        if "record" in body:
            print(f"evidence record: {body['record']}", file=sys.stderr)
    return code


def _write(args: argparse.Namespace, record: dict[str, Any]) -> Path:
    from edge_qnn.hub.evidence import label_for, write_record

    record["label"] = label_for(record)
    return write_record(record, Path(args.record_dir))


def _finish(args: argparse.Namespace, record: dict[str, Any]) -> int:
    from edge_core.cli.common import EXIT_FAILED, EXIT_OK, print_json

    path = _write(args, record)
    ok = record["status"] == "passed"
    if args.json:
        print_json({"ok": ok, "record": str(path), **record})
    else:
        summary = record.get("delegation") or {}
        print(f"{record['label']}  {record['bundle']['component']} on "
              f"{record['device']['name']}: {record['status']}")
        print(f"  jobs: {', '.join(f'{k} {v}' for k, v in record['jobs'].items())}")
        if summary:
            print(f"  layers by compute unit: {summary['by_compute_unit']}")
            print(f"  estimated inference time: {record['estimated_inference_time_us']} us; "
                  f"peak memory: {record['peak_memory_bytes']} B")
        comparison = record["execution"]["comparison"]
        if comparison:
            print(f"  outputs vs {comparison.get('reference')}: max_abs_error "
                  f"{comparison.get('max_abs_error')}, passed {comparison.get('passed')}")
        print(f"  {record['note']}")
        print(f"evidence record: {path}")
    return EXIT_OK if ok else EXIT_FAILED
