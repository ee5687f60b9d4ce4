"""The echo backends' hook implementations: the smallest complete backend plugin.

Every lifecycle hook is here, each a few lines, because the worker plumbing comes from
:class:`edge_core.workerstage.WorkerStage`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from edge_core import hookimpl

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path

    from edge_contracts.requests import StageEvent, StageRequest
    from edge_core.backend import BackendInfo, CancelOutcome, ProbeReport
    from edge_core.host.retire import RetireOutcome
    from edge_core.placement import WarmupReport
    from edge_core.stage import StageContext
    from edge_core.workerstage import WorkerStage
    from edge_echo.options import EchoOptions

EDGE_CONTRACT = "1.0"

BACKENDS = ("echo", "echo-preemptible")
DEFAULT_RAM_DEMAND = 256 * 1024 * 1024

#: The request parameters an echo worker reads (:meth:`edge_echo.worker.EchoHandler.submit`):
#: its own delay, a failure or memory it asks for, an extra output, and how it streams.
REQUEST_PARAMS = ("delay_s", "crash", "fail_call", "allocate_mb", "pad_output_bytes",
                  "stream_chunks", "chunk_rate_hz", "tokens_per_chunk", "stall_after",
                  "stall_s", "refuse", "refuse_unnamed")


def backend_infos() -> list[BackendInfo]:
    """The two echo backends: identical but for preemptibility and concurrency."""
    from edge_core.backend import BackendInfo

    return [
        BackendInfo(name="echo", kinds=["graph"], preemptible=False, max_concurrency=1,
                    providers=["numpy"], description="numpy echo; cancel retires the worker",
                    params=REQUEST_PARAMS, worker_preload=()),
        BackendInfo(name="echo-preemptible", kinds=["graph"], preemptible=True,
                    max_concurrency=4, providers=["numpy"],
                    description="numpy echo; cancels in place", params=REQUEST_PARAMS,
                    worker_preload=()),
    ]


@hookimpl
def edge_backends() -> list[BackendInfo]:
    """Declare ``echo`` and ``echo-preemptible``."""
    return backend_infos()


@hookimpl
def edge_probe() -> list[ProbeReport]:
    """Both backends run anywhere numpy does."""
    from edge_core.backend import ProbeReport

    return [ProbeReport(backend=name, available=True, runtime={"edge_echo": "0.1.0"})
            for name in BACKENDS]


@hookimpl
def edge_validate_stage(backend: str, section: Mapping[str, Any], path: str) -> EchoOptions:
    """Structure the options with edge-core's strict converter (errors carry the path)."""
    from edge_core.config import structure_config
    from edge_echo.options import EchoOptions

    return structure_config(dict(section), EchoOptions, path=path)


@hookimpl
def edge_reserve(stage: StageContext) -> Mapping[str, int]:
    """The declared demands, or 256 MiB of host RAM."""
    return dict(stage.declared_demands) or {"machine:ram": DEFAULT_RAM_DEMAND}


@hookimpl
def edge_load(stage: StageContext) -> WorkerStage:
    """Start the echo worker and hand it the options."""
    import attrs

    from edge_contracts.heap import eager_process_environment
    from edge_core.workerstage import WorkerStage
    from edge_echo.options import EchoOptions

    options: EchoOptions = stage.options or EchoOptions()
    config = attrs.asdict(options)
    config["example_shape"] = list(options.example_shape)
    config["preemptible"] = stage.backend == "echo-preemptible"
    # the heap variables, as the host's worker environment has them for a backend that
    # declares its workers' key (BackendInfo.worker_preload: the zygote started ahead)
    return WorkerStage.start(stage, default_entry="edge_echo.worker:create",
                             load_config=config, stage_packages=("edge_echo",),
                             env=eager_process_environment())


@hookimpl
def edge_warmup_placement(loaded: WorkerStage) -> WarmupReport:
    """Turn the worker's warm-up answer into the report core gates on."""
    from edge_core.placement import PlacementReport, ProviderShare, WarmupReport

    answer = loaded.warmup()
    shares = {name: ProviderShare(nodes=int(v["nodes"]), op_types=dict(v["op_types"]),
                                  node_names=list(v["node_names"]))
              for name, v in answer["providers"].items()}
    target = loaded.context.placement.target or "numpy"
    placement = PlacementReport(target=target, available_providers=answer["available"],
                                providers=shares, method="echo-self-report")
    return WarmupReport(placement=placement, numerics=answer["numerics"])


@hookimpl
def edge_call(loaded: WorkerStage, request: StageRequest,
              inputs: Mapping[str, Any]) -> Iterator[tuple[StageEvent, Mapping[str, Any]]]:
    """Send the request to the worker."""
    return loaded.call(request, inputs)


@hookimpl
def edge_cancel(loaded: WorkerStage, request_id: str, epoch: int) -> CancelOutcome:
    """Cancel in place when preemptible; otherwise ask for retirement."""
    return loaded.cancel(request_id, epoch,
                         preemptible=loaded.context.backend == "echo-preemptible")


@hookimpl
def edge_retire(loaded: WorkerStage, deadline_s: float) -> RetireOutcome:
    """Retire the worker tree."""
    return loaded.retire(deadline_s)


@hookimpl
def edge_conformance_stage(backend: str, workdir: Path) -> Mapping[str, Any]:
    """A 2x3 float32 echo stage; every call takes 0.4 s, long enough to cancel while running."""
    import numpy as np

    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5
    options = {"scale": 2.0, "delay_s": 0.4, "example_shape": [2, 3]}
    return {
        "stage": {"backend": {"name": backend, "options": options}},
        "inputs": {"x": x},
        "expected": {"x": x * np.float32(2.0)},
        "bound": {"max_abs_error": 0.0, "normalised_error": 0.0},
        "slow_inputs": {"x": x},
    }
