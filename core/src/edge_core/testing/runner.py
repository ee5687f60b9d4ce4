"""Running the checks on a backend: the one entry point of the CLI and the pytest plugin.

An unavailable backend has every check reported skipped with its probe's reason; a
backend that provides no conformance stage has its stage checks skipped with that
reason; a plugin whose conformance hook raised or answered malformed has them failed.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from edge_core.binding import backend_table
from edge_core.plugins import PluginSet
from edge_core.testing.checks import CHECKS, STAGE_CHECKS, CheckFailed, CheckSkipped
from edge_core.testing.results import BackendReport, CheckResult, Status
from edge_core.testing.subject import Subject, prepare

__all__ = ["installed_backends", "run_backend", "run_check"]


def installed_backends(plugins: PluginSet) -> list[str]:
    """Every backend a loaded plugin declares, sorted."""
    return sorted(backend_table(plugins))


def run_check(subject: Subject, name: str) -> CheckResult:
    """Run one check on a prepared backend; never raises for the backend's faults."""
    started = time.perf_counter()

    def result(status: Status, detail: str) -> CheckResult:
        return CheckResult(check=name, backend=subject.backend, status=status, detail=detail,
                           seconds=time.perf_counter() - started)

    if subject.unavailable is not None:
        return result(Status.SKIPPED, f"backend unavailable here: {subject.unavailable}")
    if name in STAGE_CHECKS and subject.stage is None:
        status = Status.FAILED if subject.stage_failed else Status.SKIPPED
        return result(status, str(subject.stage_problem))
    try:
        detail = CHECKS[name](subject)
    except CheckSkipped as exc:
        return result(Status.SKIPPED, str(exc))
    except CheckFailed as exc:
        return result(Status.FAILED, str(exc))
    except Exception as exc:  # anything else the backend raised is a failure of the check
        return result(Status.FAILED, f"{type(exc).__name__}: {exc}")
    return result(Status.PASSED, detail)


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
        results = tuple(run_check(subject, name) for name in names)
    finally:
        subject.cleanup()
    return BackendReport(backend=backend, plugin=subject.plugin,
                         available=subject.unavailable is None, reason=subject.unavailable,
                         results=results)
