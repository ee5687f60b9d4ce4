"""Every installed backend passes the kit, or reports each check skipped with its reason."""

from __future__ import annotations

import pytest

from edge_core.plugins import PluginSet, load_plugins
from edge_core.testing.results import Status
from edge_core.testing.runner import installed_backends, run_backend

PLUGINS: PluginSet = load_plugins()


@pytest.fixture(scope="module")
def onnxruntime_imported() -> None:
    """ORT workers run out of process, but the ORT probes' subprocesses and the bundle
    builders live here; onnxruntime keeps a telemetry database open once imported."""
    import onnxruntime  # noqa: F401


#: Backends whose conformance stage is known not to fit them yet, with the reason. Each is
#: run and reported (an unexpected pass shows as XPASS); remove the entry once it passes.
KNOWN_GAPS: dict[str, str] = {}


def _params() -> list[object]:
    return [pytest.param(name, marks=pytest.mark.xfail(reason=KNOWN_GAPS[name], strict=False))
            if name in KNOWN_GAPS else name for name in installed_backends(PLUGINS)]


@pytest.mark.slow
@pytest.mark.parametrize("backend", _params())
def test_installed_backend_conforms_or_skips_every_check_with_its_reason(
    backend: str, onnxruntime_imported: None
) -> None:
    report = run_backend(PLUGINS, backend)
    failures = [f"{r.check}: {r.detail}" for r in report.results if r.status is Status.FAILED]
    assert not failures, "\n".join(failures)
    if not report.available:
        assert report.reason
        assert {r.status for r in report.results} == {Status.SKIPPED}
        assert all(report.reason in r.detail for r in report.results)
    else:
        assert report.counts()["passed"] >= 3  # the static checks run on every available one


def test_the_reference_backends_are_installed_and_run_every_stage_check() -> None:
    names = installed_backends(PLUGINS)
    assert {"echo", "echo-preemptible", "ort-cpu"} <= set(names)
