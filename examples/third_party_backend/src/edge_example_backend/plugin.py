"""The ``example-numpy`` backend's hook implementations.

Importing this module is cheap (``edge plugins`` and ``edge probe`` import it): every
heavier import happens inside the hook that needs it. The worker plumbing comes from
:class:`edge_core.workerstage.WorkerStage`; the bundle is verified with
:func:`edge_core.artifacts.verify_bundle` before the worker sees it.
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
    from edge_example_backend.options import ExampleOptions

#: The hook-contract version this plugin was written against.
EDGE_CONTRACT = "1.0"

BACKEND = "example-numpy"
DEFAULT_RAM_DEMAND = 192 * 1024 * 1024

#: The request parameters the worker reads (``spin_s``: take that long, for the kit's slow
#: request); a front end refuses any other name (``edge serve``: 400 naming it).
PARAMS = ("spin_s",)


@hookimpl
def edge_backends() -> list[BackendInfo]:
    """Declare one backend: graph stages, preemptible, four calls in flight, its params."""
    from edge_core.backend import BackendInfo

    return [BackendInfo(name=BACKEND, kinds=["graph"], preemptible=True, max_concurrency=4,
                        providers=["numpy"], params=PARAMS,
                        description="tanh(x) * scale in numpy (template)")]


@hookimpl
def edge_probe() -> list[ProbeReport]:
    """Available wherever numpy is installed (found without importing it)."""
    import importlib.util

    from edge_core.backend import ProbeReport

    if importlib.util.find_spec("numpy") is None:
        return [ProbeReport(backend=BACKEND, available=False, reason="numpy is not installed")]
    return [ProbeReport(backend=BACKEND, available=True)]


@hookimpl
def edge_validate_stage(backend: str, section: Mapping[str, Any], path: str) -> ExampleOptions:
    """Structure the options strictly; errors carry the full configuration path."""
    from edge_core.config import structure_config
    from edge_example_backend.options import ExampleOptions

    return structure_config(dict(section), ExampleOptions, path=path)


@hookimpl
def edge_reserve(stage: StageContext) -> Mapping[str, int]:
    """The declared demands, else 192 MiB of host RAM (a numpy worker, measured ~60 MiB)."""
    return dict(stage.declared_demands) or {"machine:ram": DEFAULT_RAM_DEMAND}


@hookimpl
def edge_load(stage: StageContext) -> WorkerStage:
    """Verify the bundle, start the worker on the stage's route, load from the copy."""
    from edge_core.artifacts import verify_bundle
    from edge_core.errors import ManifestInvalid
    from edge_core.workerstage import WorkerStage

    if stage.manifest_dir is None:
        raise ManifestInvalid(f"stages[{stage.stage_id}].manifest: this backend needs a "
                              "bundle with params.npz: None")
    bundle = verify_bundle(stage.manifest_dir)
    try:
        loaded = WorkerStage.start(
            stage, default_entry="edge_example_backend.worker:create",
            load_config={"bundle": str(bundle.directory)},
            stage_packages=("edge_example_backend",), manifest=bundle.describe())
    finally:
        bundle.cleanup()  # the worker read everything it needs during load
    return loaded


@hookimpl
def edge_warmup_placement(loaded: WorkerStage) -> WarmupReport:
    """Turn the worker's warm-up answer into the report edge-core gates on."""
    from edge_core.placement import PlacementReport, ProviderShare, WarmupReport

    answer = loaded.warmup()
    shares = {name: ProviderShare(nodes=int(v["nodes"]), op_types=dict(v["op_types"]),
                                  node_names=list(v["node_names"]))
              for name, v in answer["providers"].items()}
    placement = PlacementReport(target="numpy", available_providers=["numpy"],
                                providers=shares, method="self-report")
    return WarmupReport(placement=placement, numerics=answer["numerics"])


@hookimpl
def edge_call(loaded: WorkerStage, request: StageRequest,
              inputs: Mapping[str, Any]) -> Iterator[tuple[StageEvent, Mapping[str, Any]]]:
    """Send the request; the runtime iterates the events."""
    return loaded.call(request, inputs)


@hookimpl
def edge_cancel(loaded: WorkerStage, request_id: str, epoch: int) -> CancelOutcome:
    """Cancel in place: the worker aborts the request's thread."""
    return loaded.cancel(request_id, epoch, preemptible=True)


@hookimpl
def edge_retire(loaded: WorkerStage, deadline_s: float) -> RetireOutcome:
    """Retire the worker tree (verified, bounded)."""
    return loaded.retire(deadline_s)


@hookimpl
def edge_conformance_stage(backend: str, workdir: Path) -> Mapping[str, Any]:
    """A bundle with ``scale = 0.5``, one request, its expected output and a slow request."""
    import numpy as np

    from edge_core.artifacts import create_manifest

    bundle = workdir / "bundle"
    bundle.mkdir()
    np.savez(bundle / "params.npz", scale=np.float32(0.5))
    create_manifest(bundle, component="example-tanh", graph="params.npz", precision="fp32")
    x = np.linspace(-3.0, 3.0, 8, dtype=np.float32).reshape(2, 4)
    return {
        "stage": {"backend": {"name": backend}, "manifest": str(bundle)},
        "inputs": {"x": x},
        "expected": {"y": (np.tanh(x.astype(np.float64)) * 0.5).astype(np.float32)},
        "bound": {"max_abs_error": 1e-6, "normalised_error": 1e-6},
        "slow_params": {"spin_s": 30.0},
    }
