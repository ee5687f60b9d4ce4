"""Running the checks on a backend: the one entry point of the CLI and the pytest plugin.

An unavailable backend has every check reported skipped with its probe's reason; a
backend that provides no conformance stage has its stage checks skipped with that
reason; a plugin whose conformance hook raised or answered malformed has them failed.
Consecutive checks of :data:`~edge_core.testing.checks.SHARED_CHECKS` share one open
pipeline while each leaves it whole (:mod:`edge_core.testing.sharing`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from edge_core.binding import backend_table
from edge_core.plugins import PluginSet
from edge_core.testing.checks import (
    CHECKS,
    SHARED_CHECKS,
    STAGE_CHECKS,
    CheckFailed,
    CheckSkipped,
)
from edge_core.testing.results import BackendReport, CheckResult, Status
from edge_core.testing.sharing import PipelineShare
from edge_core.testing.subject import Subject, prepare

__all__ = ["installed_backends", "run_backend", "run_check"]


def installed_backends(plugins: PluginSet) -> list[str]:
    """Every backend a loaded plugin declares, sorted."""
    return sorted(backend_table(plugins))


def _release(share: PipelineShare) -> str | None:
    """Close the pipeline ``share`` holds, if any; what its close found wrong, or None."""
    try:
        share.release()
    except CheckFailed as exc:
        return f"the pipeline shared with the previous check: {exc}"
    except Exception as exc:
        return f"the pipeline shared with the previous check: {type(exc).__name__}: {exc}"
    return None


def _outcome(subject: Subject, name: str) -> tuple[Status, str]:
    """Run the check; its status and detail."""
    try:
        detail = CHECKS[name](subject)
    except CheckSkipped as exc:
        return Status.SKIPPED, str(exc)
    except CheckFailed as exc:
        return Status.FAILED, str(exc)
    except Exception as exc:  # anything else the backend raised is a failure of the check
        return Status.FAILED, f"{type(exc).__name__}: {exc}"
    return Status.PASSED, detail


def run_check(subject: Subject, name: str, *, keep_open: bool = False) -> CheckResult:
    """Run one check on a prepared backend; never raises for the backend's faults.

    ``keep_open``: the next check run on ``subject`` is one of
    :data:`~edge_core.testing.checks.SHARED_CHECKS`, so this one, when it is one too,
    may leave its pipeline open for it (only when whole). A shared pipeline still open
    when a check that does not share runs is closed first, and one still open after a
    check run without ``keep_open`` (it was skipped before using it) or after a failed
    check is closed then: a failure of that close fails the check that was not already
    failed.
    """
    started = time.perf_counter()

    def result(status: Status, detail: str) -> CheckResult:
        return CheckResult(check=name, backend=subject.backend, status=status, detail=detail,
                           seconds=time.perf_counter() - started)

    if subject.unavailable is not None:
        return result(Status.SKIPPED, f"backend unavailable here: {subject.unavailable}")
    if name in STAGE_CHECKS and subject.stage is None:
        status = Status.FAILED if subject.stage_failed else Status.SKIPPED
        return result(status, str(subject.stage_problem))
    share = subject.share
    share.keep_open = keep_open and name in SHARED_CHECKS
    if name not in SHARED_CHECKS and (problem := _release(share)):
        return result(Status.FAILED, problem)
    status, detail = _outcome(subject, name)
    if not share.keep_open or status is Status.FAILED:
        problem = _release(share)
        if problem and status is not Status.FAILED:
            status, detail = Status.FAILED, problem
    return result(status, detail)


def run_backend(plugins: PluginSet, backend: str,
                checks: Iterable[str] | None = None) -> BackendReport:
    """Prepare ``backend``, run the checks (all by default) in order, clean up.

    Raises:
        BackendUnavailable: no loaded plugin declares ``backend``.
        KeyError: an unknown check name.
    """
    names = list(CHECKS) if checks is None else list(checks)
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        raise KeyError(f"checks: unknown (known: {list(CHECKS)}): {unknown}")
    subject = prepare(plugins, backend)
    try:
        following = [*names[1:], None]  # the check run after each (None: the last)
        results = tuple(run_check(subject, name, keep_open=following[index] in SHARED_CHECKS)
                        for index, name in enumerate(names))
    finally:
        subject.cleanup()
    return BackendReport(backend=backend, plugin=subject.plugin,
                         available=subject.unavailable is None, reason=subject.unavailable,
                         results=results)
