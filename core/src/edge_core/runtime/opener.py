"""The stage opener: resolve, reserve, start, reload and unwind the stages of a pipeline.

:class:`StageOpener` holds what opening needs — the configuration, the plugins, the
ledger, progress — and owns every step of it, for every policy that opens stages
(:meth:`Pipeline.open <edge_core.runtime.pipeline.Pipeline.open>`, the candidates of
:mod:`edge_core.runtime.candidates`, the reference runs of
:mod:`edge_core.runtime.reference_run`, ``edge plan`` in :mod:`edge_core.runtime.preview`):

* :meth:`~StageOpener.resolve` — the backend of a stage (or of one of its candidates) is
  installed and its probe says it is available (else ``BackendUnavailable`` with the
  probe's reason); its options are validated; one :class:`StageSlot` per replica;
* :meth:`~StageOpener.reserve` — each slot's demands (``edge_reserve``) charged on the
  ledger at once, or nothing charged (``ResourceUnavailable``);
* :meth:`~StageOpener.start` — load, give the slot its
  :class:`~edge_core.runtime.stage_runtime.StageRuntime`, and the load gate
  (:mod:`edge_core.runtime.gate`): warm-up placement, numerics, observed memory;
* :meth:`~StageOpener.reload` — the runtime's restart: reserve again, load under the new
  generation on the bundle the stage opened with (the slot's
  :class:`~edge_core.artifacts.pins.BundlePin`: every load of a slot runs inside it), the
  gate again; through the stage's candidates in order when it has some, each on its
  bundle as the stage opened with it (:meth:`~StageOpener.identities`: one
  :class:`~edge_core.artifacts.pins.BundleIdentities` per stage, shared by its replicas
  and candidates); a restart that fails leaves that failure as the slot's gate record
  (``mode: "failed"``), never the gate its last successful load passed;
* :meth:`~StageOpener.unwind` / :meth:`~StageOpener.retire` — retire what was started in
  reverse order and settle each reservation (released after verified retirement, else
  quarantined), release what was reserved and never started.

:meth:`~StageOpener.open_candidate` is one stage on one candidate — resolved, reserved,
started and gated, or unwound and the error raised — and :meth:`~StageOpener.open_all`
the single-backend form of a whole pipeline (every stage's demands reserved at once).
Each slot keeps its own state, so slots admitted together are started independently:
:meth:`~StageOpener.start_all` starts them in parallel, one thread each, once the ledger
has admitted all of them (reservation stays one atomic step, in data-flow order; loading
workers, warming up and gating overlap), waits for every one to finish, and raises the
first failure in data-flow order so that the caller unwinds everything.

**Gate reuse.** With a :class:`~edge_core.selection.gates.GateStore`, :meth:`start` looks
up the slot's stored full gate (:func:`~edge_core.selection.key.gate_key`: the same
stage configuration, bundle sha256, declared environment and runtime identity); when one
matches, the load asks the backend to warm up one point of each dynamic shape-set entry
(``StageContext.gate_points``) and the slot's :attr:`StageSlot.gate` record says "gate
reused from DATE, n of m points checked now". Any mismatch runs the full gate, which is
stored when it passes. A reused gate is never recorded as a full one. A stage whose
backend reports no per-shape warm-ups (no ``WarmupReport.buckets``) has no gate points:
its record says so (:data:`NO_POINTS_NOTE`) rather than "0 of 0 points checked".
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, cast

import attrs

from edge_core.artifacts.errors import BundleChanged
from edge_core.artifacts.pins import BundleIdentities, BundlePin
from edge_core.artifacts.shared_verification import verification_scope
from edge_core.binding import backend_table, bind_owner
from edge_core.config.model import PipelineConfig, StageConfig
from edge_core.config.structure import join_path, name_stages
from edge_core.config.transforms import resolve_input_transform
from edge_core.errors import BackendUnavailable, ConfigError, stage_label
from edge_core.ledger import ResourceLedger, UnknownPool
from edge_core.placement import WarmupReport
from edge_core.plugins import PluginSet
from edge_core.runtime.candidate_entries import (
    CandidatesRefused,
    candidate_path,
    chosen_entry,
    refusal_entry,
)
from edge_core.runtime.chain import Transform
from edge_core.runtime.gate import check_memory, check_warmup, memory_verdicts, warmup_report
from edge_core.runtime.linear_chain import check_linear_chain
from edge_core.runtime.restarts import RestartMode, RestartPolicy
from edge_core.runtime.stage_runtime import StageRuntime
from edge_core.runtime.stage_slot import StageSlot, UnverifiedRetirement
from edge_core.selection.gates import REUSED_POINT, GateStore, StoredGate
from edge_core.selection.key import (
    DecisionKey,
    gate_bundle_part,
    gate_key,
    manifest_file,
    manifest_sha256,
)
from edge_core.stage import FAILED_STAGE_ATTR, RETIRE_OUTCOME_ATTR, LoadedStage, StageContext

__all__ = ["PROBE_TIMEOUT_S", "StageOpener", "bundle_directory", "resolve_slots"]

PROBE_TIMEOUT_S = 10.0
"""The bound on one plugin's probe while a stage's backend is resolved."""

RELOAD_RETIRE_S = 5.0
"""How long a reload that failed its gate waits for the new worker's verified retirement."""

NO_POINTS_NOTE = ("full gate on the warm-up's placement and numerics; no gate points (the "
                  "backend reports no per-shape warm-ups)")
"""The gate note of a stage whose warm-up report holds no buckets (``WarmupReport.buckets``
empty: a backend without a shape set, the echo worker's, docs/authoring.md's): its one
warm-up is gated as a whole, there is no point to count or check again, and nothing is
stored for a later open to reuse."""


def bundle_directory(manifest: Path) -> Path:
    """The bundle directory of a stage's ``manifest`` (the folder, or the file's folder)."""
    return manifest if manifest.is_dir() else manifest.parent


def resolve_slots(config: PipelineConfig, plugins: PluginSet, index: int,
                  stage: StageConfig | None = None, path: str | None = None,
                  identities: BundleIdentities | None = None) -> list[StageSlot]:
    """The replicas of stage ``index`` of ``config`` on ``stage`` (default: its own).

    ``stage`` is one of the stage's candidates, or any variant of it (a reference run's);
    ``path`` names it in errors (default ``stages[index]``); ``identities`` are the
    bundles the stage opened with (default: new ones, shared by these replicas). Nothing
    is reserved.

    Every path into the file is followed by the stage's id (:func:`stage_label`).

    Raises:
        BackendUnavailable: the backend is not installed (naming what is), its
            plugin's probe failed, or the probe says it is unavailable (its reason).
        ConfigError: the backend's options or the input transform are invalid.
    """
    try:
        return _resolve_slots(config, plugins, index, stage, path, identities)
    except ConfigError as exc:
        named = name_stages(exc, [s.id for s in config.stages])
        if named is exc:
            raise
        raise named.with_traceback(exc.__traceback__) from exc.__cause__


def _resolve_slots(config: PipelineConfig, plugins: PluginSet, index: int,
                   stage: StageConfig | None, path: str | None,
                   identities: BundleIdentities | None) -> list[StageSlot]:
    """:func:`resolve_slots`, its configuration problems not yet naming the stage."""
    label = stage_label(config.stages[index].id)
    stage = stage or config.stages[index]
    path = path or f"stages[{index}]"
    owner = backend_table(plugins).get(stage.backend.name)
    if owner is None:
        bind_owner(plugins, stage.backend.name)  # raises, naming what is installed
    assert owner is not None
    answer = plugins.probe(owner[1], timeout_s=PROBE_TIMEOUT_S)
    if answer.error:
        raise BackendUnavailable(
            f"{path}.backend.name{label}: probe of plugin {owner[1]!r} failed "
            f"({answer.error}): {stage.backend.name!r}"
        )
    report = next((r for r in answer.result or () if r.backend == stage.backend.name), None)
    if report is None or not report.available:
        reason = report.reason if report is not None else "the probe did not report it"
        raise BackendUnavailable(f"{path}.backend.name{label}: unavailable: {reason}: "
                                 f"{stage.backend.name!r}")
    binding = bind_owner(plugins, stage.backend.name)
    options = stage.backend.validated
    if options is None:
        defaults = binding.config_defaults(stage.backend.name) or {}
        options = binding.validate_stage(
            stage.backend.name, {**defaults, **dict(stage.backend.options)},
            f"{path}.backend.options",
        )
    manifest_dir = None if stage.manifest is None else bundle_directory(stage.manifest)
    context = StageContext(
        pipeline=config.name, stage_id=stage.id, backend=stage.backend.name,
        options=options, manifest_dir=Path(manifest_dir) if manifest_dir else None,
        route=stage.backend.route, max_io_bytes=stage.max_io_bytes,
        placement=stage.placement.to_policy(),
        declared_demands=dict(stage.resources.demands), generation=1,
        shapes=tuple(stage.shapes),
    )
    transform = None
    if stage.input_transform is not None:
        transform = resolve_input_transform(stage.input_transform,
                                            f"{path}.input_transform")
    if identities is None:  # the replicas open on one bundle, and restart on it
        identities = BundleIdentities()
    return [StageSlot(stage, binding, attrs.evolve(context, replica=replica),
                      cast("Transform | None", transform), BundlePin(identities))
            for replica in range(stage.replicas)]


class StageOpener:
    """Opens the stages of one pipeline on a ledger; see the module docstring.

    Args:
        config: The pipeline.
        plugins: The loaded plugins.
        ledger: Where every reservation is charged (pipelines may share one).
        progress: Called with one line per step (``loading stage ...``).
        retire_deadline_s: How long a retirement waits for the worker tree to go.
        gates: Where full gates are stored and looked up (``None``: every gate is full
            and nothing is stored).
        reuse_gates: Whether a matching stored gate may be reused (``False``: full gates,
            stored again, as ``--remeasure`` asks).
        parallel_start: Whether :meth:`start_all` starts admitted slots in parallel
            (``False``: one after another in data-flow order, as a traced profile needs
            to tell each stage's phases apart).

    Attributes:
        tried: Stage id → each candidate tried at open (or the last reload), in order
            (:mod:`edge_core.runtime.candidate_entries`).
        started_at: When opening began (``time.time()``).
    """

    def __init__(self, config: PipelineConfig, plugins: PluginSet, ledger: ResourceLedger,
                 *, progress: Callable[[str], None] | None = None,
                 retire_deadline_s: float = 5.0, gates: GateStore | None = None,
                 reuse_gates: bool = True, parallel_start: bool = True) -> None:
        self.config = config
        self.parallel_start = parallel_start
        self.gates = gates
        self.reuse_gates = reuse_gates
        self.plugins = plugins
        self.ledger = ledger
        self.say: Callable[[str], None] = progress or (lambda _message: None)
        self.retire_deadline_s = retire_deadline_s
        self.tried: dict[str, list[dict[str, Any]]] = {}
        self.started_at = time.time()
        self._identities: dict[int, BundleIdentities] = {}
        self._identities_lock = threading.Lock()

    # -- the steps ---------------------------------------------------------------------------

    def resolve(self, index: int, stage: StageConfig | None = None,
                path: str | None = None) -> list[StageSlot]:
        """The replicas of stage ``index`` on ``stage`` (a candidate; default: its own).

        See :func:`resolve_slots`; their pins share the stage's :meth:`identities`.
        """
        return resolve_slots(self.config, self.plugins, index, stage, path,
                             self.identities(index))

    def identities(self, index: int) -> BundleIdentities:
        """The bundles stage ``index`` opened with, shared by its replicas and candidates.

        Made when the stage is first resolved (it opens). A stage with candidates has
        every candidate's manifest sha256 read then (:meth:`BundleIdentities.expect
        <edge_core.artifacts.pins.BundleIdentities.expect>`): a restart that falls back
        to a candidate loads its bundle as the stage opened with it — the copy the
        replica kept, else the bundle on disk with that manifest — or is refused with
        ``BundleChanged``, whether the open verified that candidate (a measured one since
        retired, one refused at its gate) or never tried it.
        """
        with self._identities_lock:
            found = self._identities.get(index)
            if found is None:
                found = self._identities[index] = BundleIdentities()
                stage = self.config.stages[index]
                for choice in stage.choices() if stage.candidates else ():
                    if choice.manifest is not None:
                        found.expect(bundle_directory(choice.manifest),
                                     manifest_sha256(choice.manifest))
        return found

    def demand(self, slots: Iterable[StageSlot]) -> None:
        """Ask each slot's backend what it demands (``edge_reserve``); kept on the slot."""
        for slot in slots:
            slot.demands = dict(slot.binding.reserve(slot.context))

    def charge(self, slots: Sequence[StageSlot]) -> None:
        """Charge the slots' demands on the ledger at once and hand each its token.

        Raises:
            ResourceUnavailable: they do not fit together; nothing is charged.
        """
        try:
            tokens = self.ledger.reserve_plan({slot.owner: slot.demands for slot in slots})
        except UnknownPool as error:
            raise self._where_declared(slots, error) from error
        for slot in slots:
            slot.token = tokens[slot.owner]

    def _where_declared(self, slots: Sequence[StageSlot], error: UnknownPool) -> UnknownPool:
        """``error`` at the pipeline file's path of the demand, where the file declares it.

        The ledger names its owner (``pipeline/stage``); the reader's file has the demand
        at ``stages[i].resources.demands["POOL"]`` (or a candidate's own resources). A
        demand the backend's ``edge_reserve`` made up itself keeps the ledger's path.
        """
        for slot in slots:
            if (not error.path.startswith(f"{slot.owner}.demands[")
                    or error.value not in slot.config.resources.demands):
                continue
            index = next((i for i, s in enumerate(self.config.stages)
                          if s.id == slot.context.stage_id), None)
            if index is None:
                break
            stage = self.config.stages[index]
            where = f"stages[{index}]"
            if (stage.candidates and slot.candidate < len(stage.candidates)
                    and stage.candidates[slot.candidate].resources is not None):
                where += f".candidates[{slot.candidate}]"
            return UnknownPool(join_path(f"{where}.resources.demands", str(error.value)),
                               error.reason, error.value, stage=stage.id)
        return error

    def reserve(self, slots: Sequence[StageSlot]) -> None:
        """The reservation: :meth:`demand`, then :meth:`charge` every slot at once."""
        self.demand(slots)
        self.charge(slots)

    def start(self, slot: StageSlot) -> None:
        """Load one reserved slot, give it its runtime and run the load gate.

        A load that fails after its plugin retired the worker itself settles the
        reservation as the plugin's retire outcome says; any other failure leaves it to
        :meth:`unwind`.
        """
        stored = self._stored_gate(slot)
        if stored is not None:
            slot.context = attrs.evolve(slot.context, gate_points=REUSED_POINT)
        self.say(f"loading stage {slot.context.stage_id} on {slot.binding.backend.name}")
        try:
            with slot.pin.active(slot.context.manifest_dir):  # in any thread of the load
                loaded = slot.binding.load(slot.context)
        except BaseException as error:
            # A plugin that retired its own worker while failing says how that went.
            outcome = getattr(error, RETIRE_OUTCOME_ATTR, None)
            if outcome is not None:
                slot.settle(self.ledger, outcome)
            _name_stage(error, slot)
            raise
        slot.runtime = self.runtime(slot, loaded)
        slot.pin.keep(loaded)  # released when the runtime closes
        self.say(f"warming up stage {slot.context.stage_id}")
        try:
            self._gate(slot, loaded)
            if stored is not None:
                self._check_bundle(slot)
        except Exception as error:
            _name_stage(error, slot)
            raise
        self._record_gate(slot, stored)

    def _pinned(self, slot: StageSlot) -> str | None:
        """The manifest sha256 the slot's stage opened its bundle with (its pin's), if any."""
        manifest_dir = slot.context.manifest_dir
        return None if manifest_dir is None else slot.pin.identities.opened(manifest_dir)

    def _loaded_part(self, slot: StageSlot) -> str:
        """The ``bundles`` gate-key part of what loaded: the pinned manifest, else the disk's.

        Every load of a slot verifies its bundle inside its pin, which lets through only
        the manifest the stage opened with (:mod:`edge_core.artifacts.pins`); a backend
        that verifies nothing through core leaves no pin record: the disk is read now.
        """
        return gate_bundle_part(slot.config, self._pinned(slot))

    def _bundle_moved(self, slot: StageSlot) -> bool:
        """True when what loaded is not the manifest the slot's gate key was made of."""
        key = slot.gate_key
        return key is not None and self._loaded_part(slot) != key.parts.get("bundles")

    def _pin_key(self, slot: StageSlot) -> None:
        """Key the slot's gate by the bundle its pin lets load: the one the stage opened with.

        Whatever the disk holds now; without a pin record the key stays as it is.
        """
        key = slot.gate_key
        if key is not None and self._pinned(slot) is not None:
            slot.gate_key = key.with_part("bundles", self._loaded_part(slot))

    def _check_bundle(self, slot: StageSlot) -> None:
        """Refuse a reused gate when the manifest changed between its lookup and the load.

        The stored gate was the old manifest's; what loaded (verified as it was then) had
        one point checked, not a full gate.

        Raises:
            BundleChanged: the manifest's sha256 differs from the key's.
        """
        if self._bundle_moved(slot):
            manifest = slot.config.manifest
            raise BundleChanged(
                str(manifest_file(manifest)) if manifest is not None else "manifest",
                "changed while the stage opened on a gate stored for the manifest read "
                "before it loaded; open again to run the full gate", "sha256 differs")

    def start_all(self, slots: Sequence[StageSlot]) -> None:
        """:meth:`start` every reserved slot in parallel; raise the first failure.

        The slots start inside one :func:`verification_scope`: the replicas of a stage
        (any slots loading the same bundle) share one verification of it.

        Each slot starts in a thread of its own; every thread is waited for, even when one
        fails (or the wait is interrupted), so that the caller's unwinding sees every slot
        in its final state. The error raised is the first failing slot's in data-flow
        order; the others' are attached as notes.
        """
        with verification_scope():
            self._start_all(slots)

    def _start_all(self, slots: Sequence[StageSlot]) -> None:
        if len(slots) <= 1 or not self.parallel_start:
            for slot in slots:  # one after another; the first failure stops the rest
                self.start(slot)
            return
        errors: list[BaseException | None] = [None] * len(slots)

        def run(number: int) -> None:
            try:
                self.start(slots[number])
            except BaseException as error:  # handed to the caller's thread below
                errors[number] = error

        threads = [threading.Thread(target=run, args=(number,), daemon=True,
                                    name=f"edge-start-{slot.owner}")
                   for number, slot in enumerate(slots)]
        for thread in threads:
            thread.start()
        try:
            for thread in threads:
                thread.join()
        finally:
            for thread in threads:  # an interrupted wait still waits: unwinding follows
                thread.join()
        failed = [(slot, error) for slot, error in zip(slots, errors, strict=True)
                  if error is not None]
        if failed:
            first = failed[0][1]
            for slot, error in failed[1:]:
                first.add_note(f"stage {slot.name} also failed while starting: "
                               f"{type(error).__name__}: {error}")
            raise first

    def _stored_gate(self, slot: StageSlot) -> StoredGate | None:
        """The slot's matching stored full gate, if it may be reused; keeps the lookup."""
        slot.gate_key, slot.gate_lookup, slot.gate_problem = None, None, None
        slot.gate_reason = None
        key = self._gate_key(slot)
        if self.gates is None or key is None:
            return None
        if not (self.reuse_gates and self.config.measurement.reuse):
            return None
        lookup = self.gates.load(key, slot.gate_owner, slot.binding.backend.name)
        slot.gate_lookup = lookup
        return lookup.found

    def _gate_key(self, slot: StageSlot) -> DecisionKey | None:
        """The slot's gate key as things are now (kept in :attr:`StageSlot.gate_key`)."""
        if self.gates is None:
            return None
        try:
            slot.gate_key = gate_key(slot.config, self.plugins)
        except Exception as error:  # an identity that cannot be made: full gate
            slot.gate_key = None
            slot.gate_problem = f"no gate key: {type(error).__name__}: {error}"
        return slot.gate_key

    def _restart_key(self, slot: StageSlot) -> None:
        """Key a restart's full gate by what it loads: the runtime now, the bundle opened with.

        A restart loads the environment and the runtime as they are now, and the bundle
        the stage opened with (:mod:`edge_core.artifacts.pins`: its kept copy, or the
        disk when it still holds that manifest, else ``BundleChanged``). Its gate is
        stored under the key they make — the configuration, environment and runtime read
        now, the ``bundles`` part of the manifest the stage opened with — and the record
        names what changed since the slot last loaded (an upgraded runtime; ``bundles``
        when the disk holds another manifest, read now). So a bundle rewritten under the
        serving pipeline never gets a gate run on the one it replaced, restart after
        restart, and the stored gate of the bundle that loaded stays usable (refreshed)
        for an open after the bundle is restored.
        """
        previous = slot.gate_key
        slot.gate_lookup, slot.gate_problem = None, None
        now = self._gate_key(slot)
        changed = previous.changed(now.parts) if previous is not None and now is not None else []
        slot.gate_reason = "restart" + (
            f"; changed since the stage opened: {', '.join(changed)}" if changed else "")
        if "bundles" in changed and self._pinned(slot) is not None:
            slot.gate_reason += " (the restart loads the bundle the stage opened with)"
        self._pin_key(slot)

    def _record_gate(self, slot: StageSlot, stored: StoredGate | None) -> None:
        """Record how the slot's gate ran (:attr:`StageSlot.gate`); store a full one."""
        report = slot.warmup
        points = [{"entry": b.entry, "point": b.point,
                   "shapes": {n: list(v) for n, v in sorted(b.shapes.items())}}
                  for b in (report.buckets if report is not None else ())]
        checked = len(points)
        if not points:  # one warm-up, gated whole: nothing per point, nothing to store
            slot.gate = {"mode": "full", "points_checked": 0, "points": 0,
                         "note": NO_POINTS_NOTE}
            return
        if stored is not None and checked < len(stored.points):
            slot.gate = {
                "mode": "reused", "reused_from": stored.checked_at,
                "points_checked": checked, "points": len(stored.points),
                "key": stored.key,
                "note": (f"gate reused from {stored.checked_at}, {checked} of "
                         f"{len(stored.points)} points checked now"),
            }
            return
        why = ""
        lookup = slot.gate_lookup
        if slot.gate_reason:
            why = slot.gate_reason
        elif not (self.reuse_gates and self.config.measurement.reuse):
            why = "reuse off"
        elif lookup is not None and lookup.problem:
            why = f"stored gate not used: {lookup.problem}"
        elif lookup is not None and lookup.changed:
            why = f"changed since the stored gate: {', '.join(lookup.changed)}"
        elif stored is not None:
            why = "the backend warmed up every point"
        elif slot.gate_key is not None:
            why = "no stored gate"
        elif slot.gate_problem:
            why = slot.gate_problem
        slot.gate = {"mode": "full", "points_checked": checked, "points": checked,
                     "note": f"full gate, {checked} of {checked} points checked now"
                             + (f" ({why})" if why else "")}
        dynamic = any(p["point"] not in ("static",) for p in points)
        if self.gates is None or slot.gate_key is None or not dynamic \
                or slot.context.gate_points != "all":
            return
        if self._bundle_moved(slot):  # what was gated is not what the key names
            slot.gate["stored"] = "not stored: bundles changed while the stage opened"
            return
        try:
            saved = self.gates.save(slot.gate_key, slot.gate_owner, slot.binding.backend.name,
                                    points)
        except OSError as error:  # a cache that cannot be written: the next gate is full
            slot.gate["stored"] = f"not stored: {error}"
            return
        slot.gate["stored"] = saved.checked_at

    def runtime(self, slot: StageSlot, loaded: LoadedStage) -> StageRuntime:
        """The runtime of a loaded slot: it settles the slot and reloads it through here."""
        limit = getattr(loaded, "max_in_flight", None)
        config = slot.config
        policy = RestartPolicy(RestartMode(config.restart), config.max_restarts,
                               config.restart_backoff_s)
        return StageRuntime(slot.binding, slot.context, loaded,
                            on_retired=functools.partial(slot.settle, self.ledger),
                            reload=functools.partial(self.reload, slot),
                            retire_deadline_s=self.retire_deadline_s,
                            max_in_flight=limit if isinstance(limit, int) else None,
                            call_timeout_s=config.call_timeout_s, policy=policy,
                            on_closed=slot.pin.release)

    def _gate(self, slot: StageSlot, loaded: LoadedStage) -> None:
        """The load gate on what the backend reports of ``loaded`` (:mod:`.gate`)."""
        sid = slot.context.stage_id
        report = warmup_report(sid, slot.binding.warmup_placement(loaded))
        slot.warmup = report
        check_warmup(sid, report, slot.context.placement)
        slot.observed = dict(loaded.observed_memory())
        slot.memory_check = memory_verdicts(slot.demands, slot.observed)
        check_memory(sid, slot.demands, slot.observed)

    def reload(self, slot: StageSlot, generation: int) -> LoadedStage:
        """Restart one replica under ``generation``, as its runtime's ``reload``.

        A stage without candidates reserves again (when its reservation was settled),
        loads and runs the gate again. A stage with candidates retries them in order of
        preference — under ``selection = "measured"`` the measured choice first — and
        switches to the first that passes the whole gate (its runtime then calls that
        candidate's backend), recording every try in :attr:`tried`.

        A restart that fails leaves its failure as the slot's gate record (``mode``
        ``failed``): the plan never shows a gate that passed for a replica whose last
        load did not.

        Raises:
            CandidatesRefused: every candidate was refused; nothing is left charged.
            The error of the load or the gate, for a stage without candidates (the new
            worker retired and the reservation settled first).
        """
        recorded = slot.gate
        try:
            return self._reload_choice(slot, generation)
        except BaseException as error:
            if slot.gate is recorded:  # failed before any load: nothing recorded it
                _record_failed_gate(slot, error, generation, gated=False, report=None)
            raise

    def _reload_choice(self, slot: StageSlot, generation: int) -> LoadedStage:
        """:meth:`reload`: the stage's own backend, else its candidates in order."""
        original = self.config.stage(slot.context.stage_id)
        if not original.candidates:
            return self._reload(slot, generation)
        index = self.config.stages.index(original)
        runtime = slot.runtime
        tries: list[dict[str, Any]] = []
        choices = original.choices()
        order = list(range(len(choices)))
        if self.config.selection == "measured":  # the measured choice first, then in order
            order.sort(key=lambda number: number != slot.candidate)
        for number in order:
            choice = choices[number]
            try:
                fresh = self.resolve(index, choice, candidate_path(index, original, number))
                slot.adopt(fresh[slot.context.replica])
                slot.candidate = number
                self.demand([slot])
                if runtime is not None:
                    runtime.binding = slot.binding
                loaded = self._reload(slot, generation)
            except Exception as error:
                tries.append(refusal_entry(choice.backend.name, error))
                continue
            if runtime is not None:
                runtime.context = slot.context
            tries.append(chosen_entry(choice.backend.name))
            self.tried[original.id] = tries
            return loaded
        self.tried[original.id] = tries
        raise CandidatesRefused(original.id, tries)

    def _reload(self, slot: StageSlot, generation: int) -> LoadedStage:
        """Reserve again if needed, load under ``generation`` and re-run the gate."""
        # a restart runs the full gate: the worker it replaces failed
        slot.context = attrs.evolve(slot.context, generation=generation, gate_points="all")
        self._restart_key(slot)
        self.ledger.heal("restart")  # a quarantine whose tree is gone by now is released
        if slot.token is None:
            self.charge([slot])
        loaded: LoadedStage | None = None
        warmed = slot.warmup  # the last warm-up that ran, until this one reports
        try:
            # the bundle the stage opened with, or BundleChanged (in any thread of the load)
            with slot.pin.active(slot.context.manifest_dir):
                loaded = slot.binding.load(slot.context)
            slot.pin.keep(loaded)  # when none was kept (a copy gone, verified afresh)
            self._pin_key(slot)  # the bundle that loaded, recorded by now
            self._gate(slot, loaded)
            self._record_gate(slot, None)
        except BaseException as error:
            _record_failed_gate(slot, error, generation, gated=loaded is not None,
                                report=slot.warmup if slot.warmup is not warmed else None)
            outcome = (slot.binding.retire(loaded, RELOAD_RETIRE_S) if loaded is not None
                       else getattr(error, RETIRE_OUTCOME_ATTR, None))
            slot.settle(self.ledger, outcome)
            raise
        return loaded

    def unwind(self, started: Sequence[StageSlot], slots: Iterable[StageSlot]) -> None:
        """Retire ``started`` in reverse order, settle each; release the rest of ``slots``.

        A retirement that raises is recorded unverified (the reservation quarantined) and
        unwinding goes on: the first error is the caller's to re-raise. An interruption
        (Ctrl-C, SIGTERM: a ``BaseException`` that is not an ``Exception``) cuts nothing
        short: the retirement it came in is run again to its end (retiring is idempotent),
        every slot after it is retired and settled, what never started is released, and
        only then is it raised, while a second one is ignored (it is the exception in
        flight: ``edge_core.cli``). Before, the rest of ``started`` was left running, to
        the exit hook, after the command had said it was interrupted.
        """
        pending = list(reversed(started))
        try:
            while pending:
                self._retire_slot(pending[0])
                del pending[0]
        except BaseException:
            for slot in pending:  # the first one's retirement may have been cut short
                self._retire_slot(slot, again=slot is pending[0])
            self.release(slots)
            raise
        self.release(slots)

    def _retire_slot(self, slot: StageSlot, again: bool = False) -> None:
        """Retire one started slot and settle its reservation by the outcome.

        ``again``: the slot's retirement was interrupted, perhaps after it was settled;
        a settled reservation (no token left, an outcome recorded) is not settled twice.
        """
        outcome: Any = None
        try:
            if slot.runtime is not None:
                outcome = slot.runtime.close()
        except Exception as exc:  # keep unwinding; the first error is re-raised
            outcome = UnverifiedRetirement(f"retire failed: {type(exc).__name__}: {exc}")
        if again and slot.token is None and slot.release_outcome is not None:
            return
        slot.settle(self.ledger, outcome, again=again)

    def retire(self, slots: Sequence[StageSlot]) -> None:
        """Retire every slot (verified, in reverse order) and settle its reservation."""
        self.unwind(slots, slots)

    def release(self, slots: Iterable[StageSlot]) -> None:
        """Release the reservations of slots that hold one and never started."""
        for slot in slots:
            if slot.token is not None:  # reserved but never started: nothing to retire
                slot.settle(self.ledger, None)

    # -- opening -------------------------------------------------------------------------

    def open_candidate(self, index: int, choice: StageConfig | None = None,
                       path: str | None = None) -> list[StageSlot]:
        """Stage ``index`` on ``choice`` (default: its own backend): its replicas, gated.

        Resolved, reserved (every replica at once), started and gated; on any failure what
        was started is retired, every reservation settled, and the error raised.
        """
        replicas: list[StageSlot] = []
        try:
            replicas = self.resolve(index, choice, path)
            self.reserve(replicas)
            self.start_all(replicas)
        except BaseException:
            self.unwind([r for r in replicas if r.runtime is not None], replicas)
            raise
        return replicas

    def open_all(self) -> list[StageSlot]:
        """Open every stage on its own backend, the whole plan reserved at once.

        Every stage is resolved, the topology checked, every replica's demands reserved
        in one plan (nothing charged when it does not fit), then all started and gated in
        parallel (:meth:`start_all`); on any failure every one is waited for, then what
        started is retired and every reservation settled.

        Raises:
            BackendUnavailable: a stage's backend is not installed or its probe says no.
            TopologyRefused: the stages are not a linear chain.
            ResourceUnavailable: the plan does not fit the ledger (nothing is charged).
            PlacementRefusal / NumericsRefused / DemandExceeded: a stage failed its gate.
            Any error from a plugin's load or warm-up, after unwinding.
        """
        slots = [replica for index in range(len(self.config.stages))
                 for replica in self.resolve(index)]
        check_linear_chain(self.config)
        self.reserve(slots)
        try:
            self.start_all(slots)
        except BaseException:
            self.unwind([slot for slot in slots if slot.runtime is not None], slots)
            raise
        return slots


def _record_failed_gate(slot: StageSlot, error: BaseException, generation: int, *,
                        gated: bool, report: WarmupReport | None) -> None:
    """Record a restart that failed as the slot's gate: the plan shows no gate passed.

    ``generation``: the generation the restart tried. ``gated``: it loaded, and failed
    in its gate (``report``: what its warm-up reported, if it did: its placement split
    and numerics are kept in the record, named by that generation); else it failed
    before its gate — a load refused (``BundleChanged``) or failed — and no point was
    checked. The plan shows no warm-up of the replica as current while this record
    stands (:func:`edge_core.runtime.execution_plan.execution_plan`).
    """
    checked = len(report.buckets) if report is not None else 0
    what = "restart's gate failed" if gated else "restart failed before its gate"
    slot.gate = {"mode": "failed", "generation": generation, "points_checked": checked,
                 "points": checked, "note": f"{what}: {type(error).__name__}: {error}"}
    if report is not None:
        slot.gate["placement"] = report.placement.split()
        slot.gate["numerics"] = dict(report.numerics) if report.numerics is not None else None


def _name_stage(error: BaseException, slot: StageSlot) -> None:
    """Tell ``error`` which stage it came from (:data:`FAILED_STAGE_ATTR`), unless it knows."""
    if not isinstance(error, Exception) or hasattr(error, FAILED_STAGE_ATTR):
        return
    context = slot.context
    where = f"stages[{context.stage_id}] on {slot.binding.backend.name}"
    if context.manifest_dir is not None:
        where += f", bundle {context.manifest_dir}"
    with contextlib.suppress(AttributeError):  # an exception type without a __dict__
        setattr(error, FAILED_STAGE_ATTR, where)
