"""Options and memory demands shared by every ORT backend (light: no numpy, no host).

Plugins import these while validating a stage's options and while probing, both of which
must stay cheap in the controller.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import attrs

from edge_contracts.devices import RAM_POOL
from edge_core.errors import ConfigError
from edge_core.stage import StageContext

__all__ = [
    "ARENA_EXTEND_STRATEGIES",
    "ARENA_SHRINKAGE",
    "BASE_RAM_BYTES",
    "BUNDLE_RAM_FACTOR",
    "CPU",
    "DEFAULT_SESSION_CONFIG",
    "WORKER_ENTRY",
    "OrtOptions",
    "base_load_config",
    "estimate_demands",
]

WORKER_ENTRY = "edge_ort.worker:create"
CPU = "CPUExecutionProvider"
#: Resident memory of a worker with numpy and onnxruntime imported and nothing loaded,
#: rounded up from measurement (about 110 MiB here).
BASE_RAM_BYTES = 192 * 1024 * 1024
#: A session holds the graph's weights about once more plus arenas; rounded up.
BUNDLE_RAM_FACTOR = 3


ARENA_EXTEND_STRATEGIES = ("next_power_of_two", "same_as_requested")
"""How ONNX Runtime's CPU arena grows (``kNextPowerOfTwo``, ``kSameAsRequested``)."""
ARENA_SHRINKAGE = ("at-rest", "every-call", "never")
"""When the CPU arena gives its free chunks back."""


DEFAULT_SESSION_CONFIG: Mapping[str, str] = {"session.intra_op.allow_spinning": "0"}
"""Session entries every ORT worker gets unless a stage sets them.

ONNX Runtime's intra-op threads spin while they wait for work (after each run too), which
pays when one session owns its cores. Here every stage is a worker process sharing the
machine with the other stages' workers and the controller: idle pools spinning steal the
cores the busy stage needs, and every call pays for the spin in CPU. Chosen by
measurement against what a user runs instead (``benchmarks/ort_call.py``, alternating
blocks of one run): spinning on, spinning only while a run lasts
(``session.force_spinning_stop``) and off, on the three-stage OCR page pipeline at 1 and
4 clients (``--page-pipeline``; with ``--page-default-threads`` also with ORT's default
thread count in every stage, where spinning on doubled the CPU seconds per page and
halved the pages per second) and on the 64 MiB zero-copy call of one stage against a
plain default ``InferenceSession``, with the CPU each costs per call; the figures are in
benchmarks/RESULTS.md (``ort_call``). A stage with one intra-op thread has no pool, so
the entry changes nothing there.
"""


MAX_THREADS = 1024
"""The most intra-op threads a stage may ask ONNX Runtime for (its option is a C ``int``)."""


def _check_threads(_: object, __: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not 0 <= value <= MAX_THREADS:
        raise ConfigError("intra_op_threads", f"must be between 0 and {MAX_THREADS}", value)


def _check_timeout(_: object, __: attrs.Attribute[float | None], value: float | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                              or not 0 < value <= 3600):
        raise ConfigError("gate_timeout_s", "must be a number of seconds in (0, 3600]", value)


@attrs.frozen
class OrtOptions:
    """Options every ORT backend accepts in a stage's ``[backend.options]``.

    Attributes:
        intra_op_threads: ONNX Runtime's intra-op thread count (0: its default).
        placement_method: How node → provider is observed: ``auto`` (assignment info
            where the build has it, else profiling), ``assignment`` or ``profiling``.
            ``assignment`` on a build without it (onnxruntime < 1.24.1, some vendor
            builds) is refused by the worker's load (``InvalidValue`` naming the field).
        session_config: Extra ``SessionOptions`` config entries. Unless set here,
            ``session.intra_op.allow_spinning`` is ``"0"`` (see :data:`DEFAULT_SESSION_CONFIG`).
        provider_options: Options for the target execution provider.
        numerics_bound: Overrides the bundle's declared bound for the warm-up check
            (``max_abs_error``, ``normalised_error``).
        stage_bundle: Load from a private copy of the verified bytes (default), so that
            a bundle changed after verification can never reach the worker.
        session_per_bucket: One session per static bucket of the shape set, its symbolic
            dimensions fixed to the bucket (what static-only providers such as QNN and
            VitisAI compile; each bucket gets its own EP-context cache entry). ``False``:
            one session serves every entry (a CPU session runs any shape).
        cpu_mem_arena: ONNX Runtime's CPU memory arena (``enable_cpu_mem_arena``): a
            stage's intermediate tensors come from a pool that grows to the largest
            request's working set. Off: each tensor is allocated and freed on its own
            (with the lean heap, ``EDGE_HEAP``, large ones go back to the system at once).
        arena_extend_strategy: How the arena grows: ``next_power_of_two`` (ONNX
            Runtime's default) or ``same_as_requested``. Needs ``cpu_mem_arena``.
        arena_shrinkage: When the arena gives its free chunks back
            (``memory.enable_memory_arena_shrinkage = cpu:0``): ``at-rest`` (once the worker
            has been at rest for a few seconds, under the ``rest`` heap policy,
            ``EDGE_HEAP``; CPU targets only: requests that follow each other keep the
            arena), ``every-call`` (at the end of
            every run: each run then grows it again) or ``never`` (it keeps the largest
            request's working set). Ignored without the arena. What each costs is in
            docs/config.md.
        gate_timeout_s: Bound in seconds on the worker's load and, separately, on its
            warm-up (the placement and numerics gate); ``None``: 600 s each. A stage past
            it is refused (the worker is retired), so a slow device or simulator cannot
            hold a candidate list up for long.
    """

    intra_op_threads: int = attrs.field(default=0, validator=_check_threads)
    placement_method: Literal["auto", "assignment", "profiling"] = "auto"
    session_config: Mapping[str, str] = attrs.field(factory=dict)
    provider_options: Mapping[str, str] = attrs.field(factory=dict)
    numerics_bound: Mapping[str, float] = attrs.field(factory=dict)
    stage_bundle: bool = True
    session_per_bucket: bool = False
    gate_timeout_s: float | None = attrs.field(default=None, validator=_check_timeout)
    cpu_mem_arena: bool = True
    arena_extend_strategy: Literal["next_power_of_two", "same_as_requested"] = (
        "next_power_of_two")
    arena_shrinkage: Literal["at-rest", "every-call", "never"] = "at-rest"

    def __attrs_post_init__(self) -> None:
        """Refuse an extend strategy without the arena to extend."""
        if not self.cpu_mem_arena and self.arena_extend_strategy != "next_power_of_two":
            raise ConfigError("arena_extend_strategy", "needs cpu_mem_arena = true",
                              self.arena_extend_strategy)


def base_load_config(target: str, options: OrtOptions | None) -> dict[str, Any]:
    """The ``load`` configuration for a provider that ORT has built in."""
    options = options or OrtOptions()
    providers: list[list[Any]] = [[target, dict(options.provider_options)]]
    if target != CPU:
        providers.append([CPU, {}])
    return {
        "target": target,
        "providers": providers,
        "intra_op_threads": options.intra_op_threads,
        "placement_method": options.placement_method,
        "session_config": {**DEFAULT_SESSION_CONFIG, **options.session_config},
        "session_per_bucket": options.session_per_bucket,
        "cpu_mem_arena": options.cpu_mem_arena,
        "arena_extend_strategy": options.arena_extend_strategy,
        "arena_shrinkage": options.arena_shrinkage,
    }


def estimate_demands(stage: StageContext) -> dict[str, int]:
    """Declared demands when given; else the worker's base plus three times the bundle."""
    if stage.declared_demands:
        return dict(stage.declared_demands)
    size = 0
    if stage.manifest_dir is not None and stage.manifest_dir.is_dir():
        size = sum(p.stat().st_size for p in stage.manifest_dir.rglob("*") if p.is_file())
    return {RAM_POOL: BASE_RAM_BYTES + BUNDLE_RAM_FACTOR * size}
