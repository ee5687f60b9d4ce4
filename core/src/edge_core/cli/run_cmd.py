"""``edge run``: open a pipeline (admission, load, gates), serve requests, print the plan."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from edge_core.cli import common

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

NAME = "run"


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add the ``run`` command."""
    parser = sub.add_parser(NAME, help="run a pipeline and print its plan and answer")
    common.add_json_flag(parser)
    parser.add_argument("pipeline", help="a pipeline file (.toml/.yaml/.json) or pyproject.toml")
    parser.add_argument("--name", help="the pipeline's name in pyproject.toml")
    parser.add_argument("--input", dest="source",
                        help="what the pipeline's prepare function takes (e.g. an image path)")
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
    parser.set_defaults(func=run)


def _health_lines(health: dict[str, Any]) -> list[str]:
    """One line per stage: its state (see docs/runtime.md), generation and restarts."""
    lines = []
    for sid, stage in health["stages"].items():
        reason = f" ({stage['reason']})" if stage.get("reason") else ""
        lines.append(f"  stage {sid}: {stage['state']}{reason}; generation "
                     f"{stage['generation']}, restarts {stage['restarts']} "
                     f"(restart = {stage['policy']['restart']})")
    return lines


def _inputs(args: argparse.Namespace, pipeline: Any) -> dict[str, Any]:
    import numpy as np

    from edge_core.config.transforms import resolve_input_transform

    config = pipeline.config
    if args.inputs:
        with np.load(args.inputs, allow_pickle=False) as data:
            return {name: np.array(data[name]) for name in data.files}
    if args.source is not None:
        if config.prepare is None:
            raise common.CommandFailed(common.EXIT_USAGE, "--input: the pipeline names no "
                                       "'prepare' function to read it with")
        prepare = resolve_input_transform(config.prepare, "prepare")
        prepared: Any = prepare(args.source)
        return dict(prepared)
    first = pipeline._stages[0].runtime.loaded
    bundle = getattr(first, "bundle", None)
    if bundle is not None and bundle.example_inputs is not None:
        return dict(bundle.load_example_inputs())
    if args.params is not None:  # a prompt-only generate stage takes no tensors
        return {}
    raise common.CommandFailed(common.EXIT_USAGE, "inputs: give --input or --inputs (the first "
                               "stage has no example inputs to fall back on)")


def _answer(pipeline: Any, outputs: dict[str, Any], inputs: dict[str, Any]) -> Any:
    from edge_core.config.transforms import resolve_input_transform

    if pipeline.config.finish is not None:
        finish = resolve_input_transform(pipeline.config.finish, "finish")
        return finish(outputs, inputs, pipeline.bundle_directories())
    return {name: {"dtype": str(a.dtype), "shape": list(a.shape)} for name, a in outputs.items()}


def _summary(plan: dict[str, Any]) -> list[str]:
    lines = [f"pipeline {plan['pipeline']}"]
    for stage in plan["stages"]:
        placement = stage["placement"] or {}
        split = ", ".join(f"{name} {v['nodes']}"
                          for name, v in (placement.get("providers") or {}).items())
        demands = ", ".join(f"{pool} {n / 2**20:.0f} MiB"
                            for pool, n in stage["reservation"]["demands"].items())
        numerics = stage["numerics"] or {}
        lines.append(
            f"  stage {stage['id']}: {stage['backend']} on {placement.get('target')} "
            f"[{split}] ({placement.get('method')}); reserved {demands}; "
            f"numerics {numerics.get('reference')} max_abs {numerics.get('max_abs_error')}; "
            f"evidence {stage['evidence']}"
        )
        for tried in stage.get("candidates") or ():
            if tried["outcome"] != "chosen":
                lines.append(f"    candidate {tried['backend']} refused at {tried['layer']}: "
                             f"{tried['reason']}")
    return lines


def run(args: argparse.Namespace) -> int:
    """Open the pipeline, serve ``--repeat`` requests, print plan, answer and latencies."""
    from edge_core.errors import ConfigError, EdgeError
    from edge_core.runtime.opening import open_pipeline

    say = None if args.json else (lambda message: print(f"edge: {message}", file=sys.stderr))
    started = time.perf_counter()
    try:
        pipeline = open_pipeline(args.pipeline, name=args.name, progress=say)
    except ConfigError as exc:
        raise common.CommandFailed(common.EXIT_USAGE, str(exc)) from exc
    except (EdgeError, ValueError) as exc:
        raise common.CommandFailed(common.EXIT_FAILED, f"{type(exc).__name__}: {exc}") from exc
    open_s = time.perf_counter() - started
    try:
        inputs = _inputs(args, pipeline)
        samples: list[dict[str, Any]] = []
        answer: Any = None
        for index in range(max(1, args.repeat)):
            t0 = time.perf_counter()
            with pipeline.run(inputs, params=args.params, deadline_s=args.deadline) as result:
                total = time.perf_counter() - t0
                if index == 0:
                    answer = _answer(pipeline, result.outputs, inputs)
                samples.append({"request": index, "total_s": total,
                                "stages_s": dict(result.latencies)})
        plan = pipeline.execution_plan()
        health = pipeline.health()
    except (EdgeError, ValueError) as exc:
        states = "\n".join(["health:", *_health_lines(pipeline.health())])
        pipeline.close()
        raise common.CommandFailed(common.EXIT_FAILED,
                                   f"{type(exc).__name__}: {exc}\n{states}") from exc
    closing = pipeline.close()
    stage_ids = [s["id"] for s in plan["stages"]]
    p50_ms = {sid: statistics.median(s["stages_s"][sid] for s in samples) * 1e3
              for sid in stage_ids}
    p50_ms["total"] = statistics.median(s["total_s"] for s in samples) * 1e3
    report = {
        "ok": True, "pipeline": plan["pipeline"], "open_s": open_s, "answer": answer,
        "requests": len(samples), "latency_p50_ms": p50_ms, "plan": plan, "health": health,
        "closed": closing, "ledger_after_close": pipeline.ledger.snapshot(),
    }
    if args.profile:
        profile = {**report, "samples": samples}
        with open(args.profile, "w", encoding="utf-8") as handle:
            json.dump(profile, handle, indent=2, default=str)
    if args.json:
        common.print_json(report)
        return common.EXIT_OK
    for line in _summary(plan):
        print(line)
    print(f"health: {health['state']}")
    for line in _health_lines(health):
        print(line)
    texts = [item["text"] for item in answer if isinstance(item, dict) and "text" in item] \
        if isinstance(answer, list) else []
    if texts:
        print("recognised text:")
        for text in texts:
            print(f"  {text}")
    print(f"answer: {json.dumps(answer, default=str)}")
    latency = ", ".join(f"{k} {v:.2f} ms" for k, v in p50_ms.items())
    print(f"latency p50 over {len(samples)} request(s): {latency}")
    released = all(v.get("release") == "released" for v in closing.values())
    print(f"closed: every worker retired and verified, reservations released: {released}")
    if args.profile:
        print(f"profile written to {args.profile}")
    return common.EXIT_OK
