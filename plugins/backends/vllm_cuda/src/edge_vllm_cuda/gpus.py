"""NVIDIA GPUs as the controller sees them: through NVML, else ``nvidia-smi``; never torch.

:func:`probe_gpus` tries NVML first (the optional ``nvidia-ml-py`` distribution, module
``pynvml``), then the ``nvidia-smi`` command; each failure is kept as a reason, so a
machine without GPUs says exactly why none were seen. Physical memory totals become the
``machine:vram:<uuid>`` pools the ledger charges.
"""

from __future__ import annotations

import functools
import importlib
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from edge_contracts.devices import (
    DeviceDescriptor,
    DeviceKind,
    ExecutionDomain,
    Integration,
    vram_pool,
)
from edge_core.host.probe_process import run_probe

__all__ = ["SMI_ENV_NAMES", "Gpu", "GpuProbe", "cached_probe", "parse_nvidia_smi",
           "probe_gpus"]

#: The ``nvidia-smi`` query the fallback runs (memory in MiB, no header, no units).
SMI_QUERY = ("--query-gpu=index,uuid,name,memory.total,driver_version",
             "--format=csv,noheader,nounits")
_MIB = 1024 * 1024
SMI_ENV_NAMES: tuple[str, ...] = ()
"""What ``nvidia-smi`` takes from the controller's environment besides the probe allowlist
(:mod:`edge_core.host.probe_process`): nothing (it lists every GPU the driver has)."""


def _gpu_tuple(values: Iterable[Gpu]) -> tuple[Gpu, ...]:
    return tuple(values)


def _text_tuple(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(values)


class GpuProbeError(ValueError):
    """``nvidia-smi`` printed a line this parser cannot read."""


@attrs.frozen
class Gpu:
    """One physical NVIDIA GPU.

    Attributes:
        index: Its index as NVML and ``nvidia-smi`` number it.
        uuid: Its stable identity (``GPU-...``), the physical id of its VRAM pool.
        name: Product name.
        total_bytes: Physical memory.
    """

    index: int
    uuid: str
    name: str
    total_bytes: int

    @property
    def pool(self) -> str:
        """The ledger pool of this GPU's memory: ``machine:vram:<uuid>``."""
        return vram_pool(self.uuid)

    def descriptor(self, domain: ExecutionDomain) -> DeviceDescriptor:
        """This GPU as a device descriptor drawing from its own VRAM pool."""
        return DeviceDescriptor(physical_id=self.uuid, kind=DeviceKind.GPU, name=self.name,
                                execution_domain=domain, integration=Integration.DISCRETE,
                                pools=(self.pool,))

    def to_json(self) -> dict[str, object]:
        """JSON-ready form for plans and probe notes."""
        return {"index": self.index, "uuid": self.uuid, "name": self.name,
                "total_bytes": self.total_bytes}


@attrs.frozen
class GpuProbe:
    """What the GPU probe found, how, and why not.

    Attributes:
        gpus: The GPUs seen, by index.
        source: ``nvml``, ``nvidia-smi`` or ``none``.
        reasons: Why each method that was tried saw nothing.
        driver: The driver version, when seen.
    """

    gpus: tuple[Gpu, ...] = attrs.field(converter=_gpu_tuple)
    source: str
    reasons: tuple[str, ...] = attrs.field(default=(), converter=_text_tuple)
    driver: str | None = None

    def by_index(self, index: int) -> Gpu | None:
        """The GPU with NVML index ``index``, or None."""
        return next((g for g in self.gpus if g.index == index), None)

    def why_none(self) -> str:
        """One line saying why no GPU was seen."""
        return "; ".join(self.reasons) or "no NVIDIA GPU reported"


def parse_nvidia_smi(text: str) -> tuple[tuple[Gpu, ...], str | None]:
    """Parse the output of ``nvidia-smi`` with :data:`SMI_QUERY`; return GPUs and driver.

    Raises:
        GpuProbeError: a line without five fields or with a non-numeric index or memory.
    """
    gpus = []
    driver = None
    for number, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 5:
            raise GpuProbeError(f"nvidia-smi line {number}: expected 5 fields: {line!r}")
        index, uuid, name, memory, driver = fields
        try:
            gpus.append(Gpu(int(index), uuid, name, int(float(memory)) * _MIB))
        except ValueError:
            raise GpuProbeError(f"nvidia-smi line {number}: index or memory.total is not a "
                                f"number: {line!r}") from None
    return tuple(gpus), driver


def _probe_nvml() -> tuple[tuple[Gpu, ...], str | None]:
    pynvml: Any = importlib.import_module("pynvml")  # nvidia-ml-py, optional
    pynvml.nvmlInit()
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            name = pynvml.nvmlDeviceGetName(handle)
            total = pynvml.nvmlDeviceGetMemoryInfo(handle).total
            gpus.append(Gpu(index, _text(uuid), _text(name), int(total)))
        return tuple(gpus), _text(driver)
    finally:
        pynvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def probe_gpus(nvidia_smi: str | None = "nvidia-smi", *, use_nvml: bool = True,
               timeout_s: float = 10.0) -> GpuProbe:
    """Ask NVML, then ``nvidia-smi``, for the NVIDIA GPUs; never imports torch or vLLM.

    Args:
        nvidia_smi: The command (name on PATH or a path); ``None`` skips the fallback.
        use_nvml: Try NVML through ``pynvml`` first.
        timeout_s: Bound on the ``nvidia-smi`` run.
    """
    reasons: list[str] = []
    if use_nvml:
        try:
            gpus, driver = _probe_nvml()
            if gpus:
                return GpuProbe(gpus, "nvml", driver=driver)
            reasons.append("NVML: no GPU reported")
        except ImportError:
            reasons.append("NVML: nvidia-ml-py (module pynvml) is not installed")
        except Exception as exc:  # pynvml raises NVMLError subclasses per cause
            reasons.append(f"NVML: {type(exc).__name__}: {exc}")
    if nvidia_smi is not None:
        command = shutil.which(nvidia_smi)
        if command is None:
            reasons.append(f"nvidia-smi: command not found: {nvidia_smi!r}")
        else:
            try:
                done = run_probe([command, *SMI_QUERY], timeout_s=timeout_s,
                                 declared=SMI_ENV_NAMES)
            except (OSError, subprocess.TimeoutExpired) as exc:
                reasons.append(f"nvidia-smi: {type(exc).__name__}: {exc}")
            else:
                if done.returncode != 0:
                    reasons.append(f"nvidia-smi: exit {done.returncode}: "
                                   f"{(done.stderr or done.stdout).strip()[:200]!r}")
                else:
                    try:
                        gpus, driver = parse_nvidia_smi(done.stdout)
                    except GpuProbeError as exc:
                        reasons.append(str(exc))
                    else:
                        if gpus:
                            return GpuProbe(gpus, "nvidia-smi", tuple(reasons), driver)
                        reasons.append("nvidia-smi: no GPU listed")
    return GpuProbe((), "none", tuple(reasons))


@functools.lru_cache(maxsize=1)
def cached_probe() -> GpuProbe:
    """:func:`probe_gpus` once per controller process (GPUs do not come and go)."""
    return probe_gpus()


def gpus_for(probe: GpuProbe, indices: Sequence[int]) -> tuple[Gpu | None, ...]:
    """The probed GPU for each index (None where the probe saw none)."""
    return tuple(probe.by_index(i) for i in indices)
