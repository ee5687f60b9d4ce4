"""What a vLLM stage reserves, per pool, before anything loads.

On CUDA, each GPU a rank runs on is charged ``ceil(gpu_memory_utilization x physical
total) + vram_headroom_bytes`` on its ``machine:vram:<uuid>`` pool — N pools for tensor
parallel over N GPUs, charged atomically by the ledger with the rest of the plan. Host RAM
is charged too: the worker tree's base (torch + vLLM loaded) plus the weight files, plus
the KV cache on the CPU platform (``kv_cache_space_gib``). A demand above a GPU's physical
total, or a declared demand below the estimate, is refused.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from edge_contracts.devices import RAM_POOL
from edge_core.errors import ConfigError
from edge_vllm_cuda.gpus import GpuProbe
from edge_vllm_cuda.options import VllmOptions

__all__ = ["DemandRefused", "estimate_demands", "stage_demands"]

_GIB = 1024**3


class DemandRefused(ConfigError):
    """A stage's memory demand cannot be met by the hardware or undercuts the estimate."""


def estimate_demands(options: VllmOptions, probe: GpuProbe, path: str) -> dict[str, int]:
    """The plugin's own estimate per pool.

    Args:
        options: The stage's validated options.
        probe: The GPUs the controller sees (unused on the CPU platform).
        path: The options' configuration path, prefixed to every error.

    Raises:
        DemandRefused: a requested GPU index was not seen (with the probe's reasons), or
            the demand on a GPU exceeds its physical total.
    """
    ram = options.ram_base_bytes + options.model_bytes()
    demands: dict[str, int] = {}
    if options.device == "cpu":
        demands[RAM_POOL] = ram + options.kv_cache_space_gib * _GIB
        return demands
    for rank, index in enumerate(options.gpu_indices()):
        gpu = probe.by_index(index)
        field = f"{path}.device_ids[{rank}]" if options.device_ids else f"{path}.device"
        if gpu is None:
            raise DemandRefused(field, f"no NVIDIA GPU with index {index} "
                                f"({probe.why_none()})", index)
        vram = math.ceil(options.gpu_memory_utilization * gpu.total_bytes)
        vram += options.vram_headroom_bytes
        if vram > gpu.total_bytes:
            raise DemandRefused(
                f"{path}.gpu_memory_utilization",
                f"{options.gpu_memory_utilization} x {gpu.total_bytes} bytes of GPU {index} "
                f"({gpu.uuid}) plus vram_headroom_bytes {options.vram_headroom_bytes} exceeds "
                f"its physical total {gpu.total_bytes}", vram)
        demands[gpu.pool] = vram
    demands[RAM_POOL] = ram
    return demands


def stage_demands(options: VllmOptions, probe: GpuProbe, declared: Mapping[str, int],
                  path: str, demands_path: str) -> dict[str, int]:
    """The demands to reserve: the estimate, raised to what the user declared.

    Raises:
        DemandRefused: as :func:`estimate_demands`; also a declared demand below the
            estimate, or a declared VRAM demand above its GPU's physical total.
    """
    estimate = estimate_demands(options, probe, path)
    totals = {gpu.pool: gpu.total_bytes for gpu in probe.gpus}
    merged = dict(estimate)
    for pool, nbytes in declared.items():
        field = f"{demands_path}[{pool!r}]"
        if pool in estimate and nbytes < estimate[pool]:
            raise DemandRefused(field, f"below the plugin's estimate of {estimate[pool]} bytes",
                                nbytes)
        if pool in totals and nbytes > totals[pool]:
            raise DemandRefused(field, f"above the GPU's physical total of {totals[pool]} bytes",
                                nbytes)
        merged[pool] = nbytes
    return merged
