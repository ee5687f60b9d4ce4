"""Qualification statuses, what each one means, and the failing layer of an error.

The statuses are deliberately distinct: a prerequisite that is missing (BLOCKED) is not
an attempt that failed (FAILED), an artifact that was refused (REJECTED) is neither, a
measured but unchecked result (PROFILE_ONLY) is not a qualification, and a cell whose
every judged verdict was met while some were not judged (MET_AS_JUDGED) is not a PASS.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

import attrs

__all__ = ["COLOURS", "MEANINGS", "FailureClass", "Status", "classify_error", "classify_layer"]


class Status(enum.StrEnum):
    """The status of one device x model x configuration cell."""

    #: All four verdicts judged and met: the complete model ran on the target device
    #: within bound of its reference (functional), the task-level check on the golden set
    #: passed (quality), the product targets were met on at least the protocol's request
    #: count (performance), and the run served without errors and retired verified
    #: (reliability).
    PASS = "PASS"  # noqa: S105 - a status, not a password
    #: The functional verdict is met and no judged verdict failed, but some verdicts were
    #: not judged (no golden set, no targets, ...): the record names which were.
    MET_AS_JUDGED = "MET_AS_JUDGED"
    #: The complete model ran and matched its references, but part of the graph ran on a
    #: fallback provider (a split the placement policy allowed).
    PARTIAL = "PARTIAL"
    #: Only components are qualified: some stages (or a single hosted component job) were
    #: checked against a reference, the complete model was not.
    COMPONENT = "COMPONENT"
    #: Performance was measured but no output was compared against a reference: an
    #: unqualified result.
    PROFILE_ONLY = "PROFILE_ONLY"
    #: A run was attempted and failed (worker start, load, placement gate, numerics,
    #: memory, a request).
    FAILED = "FAILED"
    #: The artifact itself was refused (manifest, hashes, paths, a compile job) before
    #: anything ran.
    REJECTED = "REJECTED"
    #: A prerequisite is missing (backend, device, memory, route, configuration):
    #: nothing was attempted.
    BLOCKED = "BLOCKED"

    @property
    def needs_failure(self) -> bool:
        """True for the statuses that must name a failing layer and a next step."""
        return self in (Status.FAILED, Status.REJECTED, Status.BLOCKED)

    @property
    def in_v1(self) -> bool:
        """True for the statuses a version 1 record can carry."""
        return self is not Status.MET_AS_JUDGED


MEANINGS: dict[Status, str] = {
    Status.PASS: "all four verdicts judged and met: functional, quality, performance, "
    "reliability",
    Status.MET_AS_JUDGED: "functional met, nothing judged failed, some verdicts unjudged "
    "(the cell names which were judged)",
    Status.PARTIAL: "complete model within bound, but part of it ran on a fallback provider",
    Status.COMPONENT: "only components checked against a reference, not the complete model",
    Status.PROFILE_ONLY: "measured, but no output compared against a reference",
    Status.FAILED: "an attempted run failed, or a judged verdict was not met",
    Status.REJECTED: "the artifact was refused before anything ran",
    Status.BLOCKED: "a prerequisite is missing; nothing was attempted",
}
"""One line per status, for reports."""

COLOURS: dict[Status, str] = {
    Status.PASS: "#1a7f37",
    Status.MET_AS_JUDGED: "#1b7c83",
    Status.PARTIAL: "#9a6700",
    Status.COMPONENT: "#0969da",
    Status.PROFILE_ONLY: "#8250df",
    Status.FAILED: "#cf222e",
    Status.REJECTED: "#bc4c00",
    Status.BLOCKED: "#57606a",
}
"""The cell colour of each status in the HTML report (all distinct)."""


@attrs.frozen
class FailureClass:
    """What an error class means for a record: status, failing layer, smallest next step."""

    status: Status
    layer: str
    next_step: str


_TABLE: dict[str, FailureClass] = {
    "BackendUnavailable": FailureClass(
        Status.BLOCKED, "backend",
        "install the backend's distribution; `edge probe` says why it is unavailable"),
    "RouteRefused": FailureClass(
        Status.BLOCKED, "route",
        "run from a controller in the route's OS domain or change stages[].backend.route"),
    "TopologyRefused": FailureClass(
        Status.BLOCKED, "configuration", "make the stages a linear chain"),
    "DemandExceeded": FailureClass(
        Status.FAILED, "memory",
        "raise stages[].resources.demands to at least the observed peak named in the error"),
    "ResourceUnavailable": FailureClass(
        Status.BLOCKED, "admission",
        "free memory in the named pool, or lower the plan's demands or ceilings"),
    "ManifestInvalid": FailureClass(
        Status.REJECTED, "artifact",
        "rebuild the bundle from a trusted export (`edge manifest create`) and verify it"),
    "PlacementRefused": FailureClass(
        Status.FAILED, "placement",
        "read the placement split: nodes on a fallback provider need an export change "
        "(ops, static shapes, quantisation) or an explicitly looser placement policy"),
    "NumericsRefused": FailureClass(
        Status.FAILED, "numerics",
        "compare the stage against its reference on CPU; check precision and "
        "quantisation of the export"),
    "BootstrapRefused": FailureClass(
        Status.FAILED, "worker-start",
        "run the route's interpreter with `-m edge_contracts.worker` entry imports by "
        "hand to see the import error"),
    "RemoteError": FailureClass(
        Status.FAILED, "runtime",
        "reproduce the runtime's error outside edge with the staged bundle and options"),
    "DeadlineExceeded": FailureClass(
        Status.FAILED, "runtime",
        "the stage did not answer within its bound (a call deadline, an ORT backend's "
        "gate_timeout_s): raise the bound or put a faster candidate first"),
    "WorkerUnresponsive": FailureClass(
        Status.FAILED, "worker",
        "the worker stopped answering heartbeats: check for a stopped or hung process"),
    "RequestTooLarge": FailureClass(
        Status.FAILED, "request",
        "raise stages[].max_io_bytes to the request's size, or send smaller inputs"),
    "RequestFailed": FailureClass(
        Status.FAILED, "request", "rerun one request with `edge run --inputs` to isolate it"),
    "WorkerLost": FailureClass(
        Status.FAILED, "worker",
        "check the worker's exit status (an OOM kill?) and rerun at concurrency 1"),
    "WorkerError": FailureClass(
        Status.FAILED, "worker", "read the worker's error; rerun with one stage"),
    "StageClosed": FailureClass(
        Status.FAILED, "runtime", "the stage was retired: restart it or rerun the profile"),
    "ConfigError": FailureClass(
        Status.BLOCKED, "configuration", "fix the field named in the error"),
    "PluginError": FailureClass(
        Status.BLOCKED, "plugins", "`edge plugins` lists what failed to load"),
    "RecordInvalid": FailureClass(
        Status.BLOCKED, "inputs", "give the inputs the error names"),
    "FileNotFoundError": FailureClass(
        Status.BLOCKED, "inputs", "create the missing file named in the error"),
}

_UNKNOWN = FailureClass(Status.FAILED, "unknown",
                        "rerun the recorded command and read the full traceback")


def classify_error(classes: Sequence[str]) -> FailureClass:
    """The failure class of an error, from its class names, most specific first (its MRO)."""
    for name in classes:
        found = _TABLE.get(name)
        if found is not None:
            return found
    return _UNKNOWN


def classify_layer(layer: str | None) -> FailureClass:
    """The failure class of a failing layer (a refused candidate records only its layer).

    The first class of the table with that layer; an unknown layer is ``unknown``.
    """
    for found in _TABLE.values():
        if found.layer == layer:
            return found
    return _UNKNOWN
