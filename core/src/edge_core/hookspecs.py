"""Hook specifications: the whole extension surface of edge-core, in lifecycle order.

A backend plugin is a module (found through the ``edge`` entry-point group, or named in
configuration) that implements some of these hooks with :data:`edge_core.hookimpl` and
declares the hook-contract version it was written against in a module-level
``EDGE_CONTRACT = "1.0"``.

Two calling conventions apply, and each hook says which:

* **every plugin answers** — the hook is called on every registered plugin, each call
  isolated so that one plugin's exception (or hang, where a timeout is stated) does not
  hide the others' answers;
* **owner only** — the hook is called only on the plugin that declared the stage's
  backend in :func:`edge_backends`. The runtime binds the owner's implementation once when
  a stage is resolved (see :mod:`edge_core.binding`); nothing searches plugins per request.

Hooks are grouped by phase: discovery, configuration, admission, execution, teardown,
and the command line.
"""

from __future__ import annotations

from typing import Protocol

from edge_core.markers import hookimpl, hookspec

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Iterator, Mapping, Sequence
    from pathlib import Path
    from typing import Any

    from edge_contracts.requests import StageEvent, StageRequest
    from edge_core.backend import BackendInfo, CancelOutcome, ProbeReport
    from edge_core.placement import WarmupReport
    from edge_core.stage import LoadedStage, StageContext

PROJECT = "edge"

__all__ = ["CONTRACT_VERSION", "HOOK_NAMES", "PROJECT", "CommandRegistry", "hookimpl",
           "hookspec"]


class CommandRegistry(Protocol):
    """What :func:`edge_register_commands` adds subcommands to (argparse's subparsers have it)."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        """Add subcommand ``name``; keyword arguments as argparse's ``add_parser`` takes."""
        ...


#: The hook-contract version this core implements, as ``"major.minor"``. A plugin's
#: ``EDGE_CONTRACT`` must have the same major and a minor no greater than this one.
#:
#: 1.1 added, compatibly: the ``CancelOutcome.NOT_STARTED`` answer of ``edge_cancel`` (a
#: 1.0 plugin never gives it), and the optional ``on_lost(listener)`` and ``health()``
#: members of a loaded stage (see :class:`edge_core.stage.LoadedStage`).
CONTRACT_VERSION = "1.1"

# ---------------------------------------------------------------------------------------
# Discovery
# ---------------------------------------------------------------------------------------


@hookspec
def edge_backends() -> Sequence[BackendInfo]:
    """Declare the backends this plugin owns.

    Every plugin answers, once, when the plugin manager builds its backend table; a plugin
    that owns no backend (a tracing plugin, say) need not implement it. Must be cheap and
    import no runtime.

    Returns:
        One :class:`~edge_core.backend.BackendInfo` per backend, in a list or tuple. Any
        other answer (a mapping, a single ``BackendInfo``, a list holding something else)
        is a plugin error and the plugin serves no backend (``edge probe`` reports its
        probe's rows unavailable). Two plugins declaring the same backend name is a
        plugin error reported by ``edge plugins``.

    """


@hookspec
def edge_probe() -> Sequence[ProbeReport]:
    """Report whether each of this plugin's backends can run here, and on which devices.

    Every plugin answers; each call is isolated with a timeout, so a crashing or hanging
    probe marks only its own plugin as failed. Probes must be cheap and must not import a
    heavy runtime (onnxruntime, torch, vllm) in the controller process: ask the route's
    interpreter in a subprocess, read files, or query a driver library instead.

    Returns:
        One :class:`~edge_core.backend.ProbeReport` per declared backend. An unavailable
        backend's report carries the reason, which the runtime repeats when a stage asks
        for it.

    """


# ---------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def edge_config_defaults(backend: str) -> Mapping[str, Any] | None:
    """Contribute default values for a backend's section of a stage's configuration.

    Owner only. Called before validation; the user's values override these defaults key by
    key (top level only).

    Args:
        backend: The backend name the stage names.

    Returns:
        A mapping of defaults, or ``None`` for none.

    """


@hookspec(firstresult=True)
def edge_validate_stage(backend: str, section: Mapping[str, Any], path: str) -> Any:
    """Validate and structure a stage's backend-specific section.

    Owner only. Called while the pipeline configuration is loaded, before anything is
    reserved.

    Args:
        backend: The backend name the stage names.
        section: The raw section merged over the defaults from ``edge_config_defaults``.
        path: The section's path in the configuration (``stages[1].backend.options``), to
            prefix every error with.

    Returns:
        The plugin's own validated options object; it reaches the plugin's later hooks as
        ``StageContext.options``.

    Raises:
        edge_core.errors.ConfigError: naming ``path`` + the field, the reason and the value.

    """


# ---------------------------------------------------------------------------------------
# Admission
# ---------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def edge_reserve(stage: StageContext) -> Mapping[str, int]:
    """State the memory a stage needs, per physical pool, including its load-time peak.

    Owner only. Called for every stage of a pipeline before any of them loads; the runtime
    then charges all stages' demands against the ledger atomically, or refuses the whole
    pipeline. Pool names are those of :mod:`edge_contracts.devices` (``machine:ram``,
    ``machine:vram:<id>`` ...).

    Args:
        stage: The resolved stage; ``stage.declared_demands`` holds what the user declared.

    Returns:
        Pool name to bytes. A plugin that cannot estimate returns the declared demands;
        one that can should refuse declared demands below its own estimate.

    """


# ---------------------------------------------------------------------------------------
# Execution
# ---------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def edge_load(stage: StageContext) -> LoadedStage:
    """Start the stage's worker, verify its artifact, and load the model.

    Owner only. Called after the whole pipeline was admitted, one stage at a time in
    pipeline order. On failure the plugin must leave no worker behind (or raise after
    retiring it); the runtime then unwinds the stages loaded before this one. A load that
    raises or returns ``None`` (a :class:`~edge_core.errors.PluginError` naming the
    plugin) has every worker it started on the calling thread (``start_worker``,
    ``WorkerStage.start``) retired by core as well, before the error goes on.

    Args:
        stage: The resolved stage, with the worker generation to run under.

    Returns:
        A handle satisfying :class:`~edge_core.stage.LoadedStage`.

    """


@hookspec(firstresult=True)
def edge_warmup_placement(loaded: LoadedStage) -> WarmupReport:
    """Run the stage's example input bucket and report where every node actually ran.

    Owner only. Called once after ``edge_load``. The plugin reports; core applies the gate
    (:func:`edge_core.placement.check_placement`) with the stage's policy, so every backend
    is judged the same way, and refuses a stage whose numerical check failed.

    Args:
        loaded: The handle from ``edge_load``.

    Returns:
        A :class:`~edge_core.placement.WarmupReport`: the observed placement (never
        adjusted to pass) and the comparison of the outputs with a reference.

    """


@hookspec(firstresult=True)
def edge_call(
    loaded: LoadedStage, request: StageRequest, inputs: Mapping[str, Any]
) -> Iterator[tuple[StageEvent, Mapping[str, Any]]]:
    """Send one request to the stage's worker and stream its events back.

    Owner only, bound once at load: the runtime calls the owner's implementation directly
    on the hot path. The call must send the request and return without waiting for the
    first event; the iterator yields ``(event, tensors)`` pairs in ``seq`` order and ends
    after the terminal event.

    Args:
        loaded: The handle from ``edge_load``.
        request: Carries request id, epoch and worker generation; the worker fences on them.
        inputs: Input name to NumPy array (empty for prompt-only generate requests, whose
            prompt travels in ``request.params``).

    Returns:
        An iterator of events with their output tensors (name to NumPy array). An error
        the iterator raises ends the request on its stage (its slot freed) and reaches
        the caller as it was raised.

    Raises:
        ResourceUnavailable: not now (the backend is busy; nothing was sent). The request
            waits for the stage as for a taken slot, asleep until a slot of it is released
            (or a recheck, every 50 ms), within its deadline, and is tried again. Any other
            error is the request's.

    """


@hookspec(firstresult=True)
def edge_cancel(loaded: LoadedStage, request_id: str, epoch: int) -> CancelOutcome:
    """Cancel a request of a fenced epoch.

    Owner only. The runtime has already fenced the epoch (no output of it will be
    delivered) before calling this hook, and waits for the request's ``edge_call`` to have
    returned first. A preemptible backend stops the request inside its worker and answers
    ``CANCELLED_IN_PLACE``; a non-preemptible one answers ``RETIRE_REQUIRED`` and the
    runtime retires the worker (a non-preemptible backend's ``CANCELLED_IN_PLACE`` is
    treated as ``RETIRE_REQUIRED``: the declaration decides). A request that already
    finished in the worker (its last event may still be on its way) is
    ``ALREADY_FINISHED``: the worker stays. Since contract 1.1 a backend that knows it
    never started the request (still queued on its side) may answer ``NOT_STARTED``: the
    worker stays. Must return within a bounded time. The runtime also calls it when a
    call outlives its deadline or its stage's ``call_timeout_s``.

    Args:
        loaded: The handle from ``edge_load``.
        request_id: The request to stop.
        epoch: The epoch that was fenced; work of this epoch or older must produce nothing.

    Returns:
        A :class:`~edge_core.backend.CancelOutcome`.

    """


# ---------------------------------------------------------------------------------------
# Teardown
# ---------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def edge_retire(loaded: LoadedStage, deadline_s: float) -> Any:
    """Stop the stage's worker and its whole process tree, and say whether that is verified.

    Owner only. Called on shutdown, on unwinding after a failure, and when a
    non-preemptible call is cancelled. Must be idempotent and return within ``deadline_s``
    plus a small constant.

    Args:
        loaded: The handle from ``edge_load``.
        deadline_s: Seconds allowed for graceful close, terminate, kill and verification.

    Returns:
        An ``edge_core.host.retire.RetireOutcome``; an unverified outcome keeps the stage's
        reservation quarantined in the ledger.

    """


# ---------------------------------------------------------------------------------------
# Conformance
# ---------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def edge_conformance_stage(backend: str, workdir: Path) -> Mapping[str, Any] | None:
    """Provide a small, self-contained stage on which the conformance kit exercises a backend.

    Owner only; optional. Called by ``edge conformance`` and the ``edge_core.testing``
    pytest plugin, never while serving. Build whatever the stage needs (an artifact bundle,
    a tiny model) under ``workdir``, which the kit removes afterwards.

    Args:
        backend: The backend name to exercise.
        workdir: An empty private directory for the stage's files.

    Returns:
        ``None`` when the backend cannot provide a stage on this machine (the kit then
        reports every stage check skipped, saying why; the static checks — contract,
        specifications, probe — still run), else a mapping with:
        ``stage`` — a stage table as in a pipeline file, without ``id``; ``inputs`` — input
        name to array for one request; ``expected`` — output name to array, or ``None``;
        ``bound`` — ``{"max_abs_error": ..., "normalised_error": ...}`` for comparing;
        ``params`` — request parameters (generate stages: prompt and sampling);
        ``slow_params`` / ``slow_inputs`` — a request that runs long enough to be cancelled
        while running, or ``None`` when the backend has none.
    """


# ---------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------


@hookspec
def edge_register_commands(subparsers: CommandRegistry) -> None:
    """Add subcommands to the ``edge`` command line.

    Every plugin answers, each call isolated. Called only when the first command-line word
    is not a built-in command (or there is none, as in ``edge --help``), so plugin commands
    cost nothing to the built-in ones.

    Args:
        subparsers: The ``edge`` parser's subcommand registry; add parsers with
            ``subparsers.add_parser(name, help=..., ...)``, which takes what argparse's
            ``add_parser`` takes. Each must set a ``func`` default taking the parsed
            ``argparse.Namespace`` and returning an exit code. Import heavy modules inside
            that function, never at registration. ``edge --help`` lists each command's
            ``help`` under the plugin's distribution.

    """


#: Every hook name, in lifecycle order.
HOOK_NAMES = tuple(
    name for name, value in list(globals().items())
    if name.startswith("edge_") and hasattr(value, "edge_spec")
)
