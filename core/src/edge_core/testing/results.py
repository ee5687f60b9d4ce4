"""What the conformance kit reports: one status per check, gathered per backend.

A check either passed, failed (with the reason), or was skipped (with the reason: the
backend is unavailable here, or the stage it provided has no bundle to tamper with, ...).
Skipped is never counted as passed: ``edge conformance`` exits 0 only when no check
failed, and prints skipped checks as skipped.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

__all__ = ["BackendReport", "CheckResult", "Status", "report_document"]


class Status(enum.StrEnum):
    """The outcome of one check."""

    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"


@attrs.frozen
class CheckResult:
    """One check's outcome on one backend.

    Attributes:
        check: The check's name (see :data:`edge_core.testing.checks.CHECKS`).
        backend: The backend it ran on.
        status: Passed, failed or skipped.
        detail: What was verified (passed) or why it failed or was skipped.
        seconds: How long the check took.
    """

    check: str
    backend: str
    status: Status
    detail: str
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dictionary."""
        return {"check": self.check, "backend": self.backend, "status": self.status.value,
                "detail": self.detail, "seconds": round(self.seconds, 4)}


@attrs.frozen
class BackendReport:
    """Every check's outcome on one backend, with what its probe said.

    Attributes:
        backend: The backend name.
        plugin: The plugin that declares it.
        available: The probe's answer.
        reason: The probe's reason when unavailable.
        results: One result per check, in check order.
    """

    backend: str
    plugin: str
    available: bool
    reason: str | None
    results: tuple[CheckResult, ...]

    @property
    def failed(self) -> bool:
        """True when at least one check failed."""
        return any(r.status is Status.FAILED for r in self.results)

    def counts(self) -> dict[str, int]:
        """Number of checks per status."""
        return {s.value: sum(r.status is s for r in self.results) for s in Status}

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dictionary."""
        return {"backend": self.backend, "plugin": self.plugin, "available": self.available,
                "reason": self.reason, "counts": self.counts(),
                "checks": [r.to_json() for r in self.results]}


def report_document(reports: Iterable[BackendReport],
                    extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The JSON report of a conformance run (``--json``, ``--edge-report``)."""
    from edge_core import __version__
    from edge_core.hookspecs import CONTRACT_VERSION

    backends = [r.to_json() for r in reports]
    totals = {s.value: sum(b["counts"][s.value] for b in backends) for s in Status}
    return {"edge_core": __version__, "hook_contract": CONTRACT_VERSION,
            "summary": totals, "backends": backends, **dict(extra or {})}
