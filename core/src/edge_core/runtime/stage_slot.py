"""A stage slot: everything a pipeline keeps per stage replica while opening and serving.

A :class:`StageSlot` is made by the opener's resolution
(:meth:`StageOpener.resolve <edge_core.runtime.opener.StageOpener.resolve>`) and filled
in as the replica is opened: its reservation token and demands, its runtime once loaded,
its warm-up report and observed memory once gated, its reference run's record. Its
ledger owner is ``pipeline/stage`` (``pipeline/stage#r`` for replica r > 0), so that
pipelines may share a ledger; a candidate held beside another candidate of its stage is
``pipeline/stage~c`` (candidate ``c``).

:meth:`StageSlot.settle` is the one way a slot's reservation ends after retirement:
released when the retirement was verified (or nothing ever ran), quarantined otherwise
(with the worker tree's identities, which :meth:`ResourceLedger.heal
<edge_core.ledger.ResourceLedger.heal>` re-checks), and then forgotten.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from edge_contracts.manifest import ArtifactManifest
from edge_core.artifacts.pins import BundlePin
from edge_core.artifacts.references import load_npz
from edge_core.binding import OwnerBinding
from edge_core.config.model import StageConfig
from edge_core.ledger import ReleaseOutcome, ReservationToken, ResourceLedger
from edge_core.placement import WarmupReport
from edge_core.runtime.chain import Transform
from edge_core.runtime.stage_runtime import StageRuntime
from edge_core.selection.gates import GateLookup
from edge_core.selection.key import DecisionKey
from edge_core.stage import StageContext

__all__ = ["ExampleInputs", "StageSlot", "UnverifiedRetirement"]


@attrs.frozen
class ExampleInputs:
    """A stage's bundled example inputs, as it loaded them (:meth:`StageSlot.example_inputs`).

    Attributes:
        member: Their file in the bundle (``metadata.example_inputs``).
        arrays: The arrays by name.
        manifest: The manifest that names them: the one the stage verified.
    """

    member: str
    arrays: Mapping[str, Any] = attrs.field(repr=False)
    manifest: ArtifactManifest = attrs.field(repr=False)


class UnverifiedRetirement:
    """The retire outcome recorded when retirement itself raised: nothing is verified gone.

    Attributes:
        verified: Always False.
        reason: What retirement raised.
    """

    verified = False

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def to_dict(self) -> dict[str, object]:
        """The outcome as the close summary reports it."""
        return {"verified": False, "reason": self.reason}


class StageSlot:
    """One stage replica of a pipeline, from its resolution to its retirement.

    Attributes:
        config: The stage's configuration (of the candidate it runs on).
        binding: The owner plugin's bound hooks for the stage's backend.
        context: The stage as the plugin sees it (its generation moves on at each reload).
        transform: The stage's input transform, resolved (None: the previous outputs).
        token: Its reservation while it holds one.
        demands: What it reserved, per pool.
        runtime: Its runtime once loaded.
        warmup: Its warm-up report once gated.
        observed: Memory observed after warm-up, per pool.
        memory_check: The observed-memory check's verdict, per pool.
        release_outcome: How its last reservation ended (``released``, ``quarantined``,
            ``none``), once settled.
        reference: The reference run's record (``reference_backend``), if any.
        pin: The replica's bundle pin (:mod:`edge_core.artifacts.pins`): the manifest
            sha256 its stage opened with (shared by the replicas resolved together) and
            the staged copy kept for restarts; every load of the replica runs inside it.
    """

    def __init__(self, config: StageConfig, binding: OwnerBinding, context: StageContext,
                 transform: Transform | None, pin: BundlePin | None = None) -> None:
        self.config = config
        self.binding = binding
        self.context = context
        self.transform = transform
        self.token: ReservationToken | None = None
        self.demands: Mapping[str, int] = {}
        self.runtime: StageRuntime | None = None
        self.warmup: WarmupReport | None = None
        self.observed: Mapping[str, int] = {}
        self.memory_check: dict[str, str] = {}
        self.release_outcome: str | None = None
        self.reference: dict[str, Any] | None = None
        self.pin = pin if pin is not None else BundlePin()
        self.candidate = 0
        """Which of its stage's candidates the slot runs (0 for a stage without any)."""
        self.gate: dict[str, Any] | None = None
        """How its last load gate ran: ``full`` or ``reused`` (from when, how many of the
        stored gate's points were checked now), or ``failed`` (its last restart failed,
        before or in its gate, and why), as the plan shows it."""
        self.gate_key: DecisionKey | None = None
        """The key its gate is stored under (:func:`~edge_core.selection.key.gate_key`)."""
        self.gate_lookup: GateLookup | None = None
        """What the gate store found for :attr:`gate_key`."""
        self.gate_problem: str | None = None
        """Why no gate key could be made, if so."""
        self.gate_reason: str | None = None
        """Why a restart's gate is full (a restart, and what changed since the slot opened)."""
        self.candidate_tag = ""
        """``~c`` for candidate ``c`` of a stage opened while another of its candidates is
        held (a measured selection, a first-ready start), so that each holds a
        reservation of its own (:mod:`edge_core.runtime.measured_selection`); else empty."""

    @property
    def name(self) -> str:
        """The replica's name in reports: its stage id, ``stage#r`` for replica r > 0."""
        replica = f"#{self.context.replica}" if self.context.replica else ""
        return f"{self.context.stage_id}{replica}"

    @property
    def settled(self) -> bool:
        """Whether it was retired and its reservation settled since it last reserved one.

        Nothing is left to retire or release then: retiring it again (a second pass after
        an interruption) would only overwrite :attr:`release_outcome` with ``none``.
        """
        return self.token is None and self.release_outcome is not None

    @property
    def owner(self) -> str:
        """Its ledger owner: ``pipeline/stage`` (``pipeline/stage~c#r``: tag, replica).

        ``#r`` for replica r > 0; the :attr:`candidate_tag` after the stage id.
        """
        replica = f"#{self.context.replica}" if self.context.replica else ""
        return f"{self.context.pipeline}/{self.context.stage_id}{self.candidate_tag}{replica}"

    @property
    def gate_owner(self) -> str:
        """Its stored gates' owner: ``pipeline/stage`` (replicas and tags share them)."""
        return f"{self.context.pipeline}/{self.context.stage_id}"

    def adopt(self, other: StageSlot) -> None:
        """Run from now on as ``other`` (a fresh resolution on another candidate) does."""
        self.config, self.binding, self.transform = other.config, other.binding, other.transform
        self.context = other.context

    def example_inputs(self) -> ExampleInputs | None:
        """The example inputs of the bundle the replica loaded, and the manifest naming them.

        As its stage verified them when it opened (:meth:`BundlePin.read
        <edge_core.artifacts.pins.BundlePin.read>`): from the copy the replica keeps, else
        from the bundle on disk, checked against the sha256 the verified manifest gives
        them. A backend that verifies nothing through edge-core leaves no record of what
        loaded: its bundle is verified now, in place. ``None``: no bundle, or a bundle
        without example inputs.

        Raises:
            BundleChanged: the bundle was rewritten since the stage opened (naming the
                manifest, the sha256 the stage opened with and the one now), or the
                example inputs changed under a manifest that did not.
        """
        directory = self.context.manifest_dir
        if directory is None:
            return None
        manifest = self.pin.identities.manifest(directory)
        if manifest is None:  # nothing verified through edge-core: the bundle as it is
            from edge_core.artifacts.verify import verify_bundle

            bundle = verify_bundle(directory, stage=False)
            member = bundle.manifest.metadata.example_inputs
            return None if member is None else ExampleInputs(
                member, bundle.load_example_inputs(), bundle.manifest)
        member = manifest.metadata.example_inputs
        data = None if member is None else self.pin.read(directory, member)
        if member is None or data is None:
            return None
        return ExampleInputs(member, load_npz(data, "manifest.metadata.example_inputs",
                                              member), manifest)

    def settle(self, ledger: ResourceLedger, outcome: Any, *, again: bool = False) -> str:
        """End the reservation after retirement, record how and forget the token.

        ``outcome`` is the retire outcome (None: nothing ran). Released when it is
        verified, quarantined otherwise with the worker tree's identities; ``none`` when
        the slot holds no reservation. ``again``: a settle of this slot was interrupted
        (Ctrl-C, SIGTERM) and is run again; one cut short after the ledger released the
        token, before it was forgotten here, finds it no longer held: ``released``.

        Returns:
            ``released``, ``quarantined`` or ``none`` (also kept as :attr:`release_outcome`).
        """
        if self.token is None:
            self.release_outcome = "none"
            return self.release_outcome
        verified = bool(getattr(outcome, "verified", outcome is None))
        reason = getattr(outcome, "reason", None)
        # the identities of the worker's tree, re-checked by ledger.heal() if quarantined
        tree = [p for p in getattr(outcome, "tree", ()) if callable(getattr(p, "is_alive", None))]
        released = ledger.release(self.token, verified=verified, reason=reason, processes=tree)
        if again and released is ReleaseOutcome.STALE_TOKEN:  # its own release, cut short
            released = ReleaseOutcome.RELEASED
        self.release_outcome, self.token = released.value, None
        return self.release_outcome
