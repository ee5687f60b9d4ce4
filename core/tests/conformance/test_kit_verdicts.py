"""The kit's verdicts on deliberately non-conforming plugins: each check can fail or skip.

The plugins here are real plugin objects registered with the real plugin manager; the
ones that load stages run the echo backend's real worker.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_core import hookimpl, hookspecs
from edge_core.backend import BackendInfo, CancelOutcome, ProbeReport
from edge_core.plugins import EdgePluginManager, PluginRecord, PluginSet, load_plugins
from edge_core.testing.checks import CHECKS, STAGE_CHECKS
from edge_core.testing.results import Status
from edge_core.testing.runner import run_backend
from edge_echo import plugin as echo

NO_ENTRY_POINTS = {"EDGE_PLUGINS": ""}


class Nowhere:
    """A backend whose probe says it cannot run here."""

    EDGE_CONTRACT = "1.0"

    @hookimpl
    def edge_backends(self) -> list[BackendInfo]:
        return [BackendInfo(name="nowhere", kinds=["graph"])]

    @hookimpl
    def edge_probe(self) -> list[ProbeReport]:
        return [ProbeReport(backend="nowhere", available=False,
                            reason="needs a frobnicator, none found")]


class Unspecced(Nowhere):
    """Available, but implements a hook nobody specified."""

    @hookimpl
    def edge_backends(self) -> list[BackendInfo]:
        return [BackendInfo(name="unspecced", kinds=["graph"])]

    @hookimpl
    def edge_probe(self) -> list[ProbeReport]:
        return [ProbeReport(backend="unspecced", available=True)]

    @hookimpl
    def edge_frobnicate(self) -> None:
        """Not a hook of edge-core."""


class WrongEcho:
    """The echo worker behind a backend that claims too much: it says it is preemptible
    (its cancel retires) and its conformance stage expects three times the input."""

    EDGE_CONTRACT = "1.0"

    def __init__(self, stage_error: str | None = None) -> None:
        self.stage_error = stage_error

    @hookimpl
    def edge_backends(self) -> list[BackendInfo]:
        return [BackendInfo(name="wrong-echo", kinds=["graph"], preemptible=True,
                            providers=["numpy"])]

    @hookimpl
    def edge_probe(self) -> list[ProbeReport]:
        return [ProbeReport(backend="wrong-echo", available=True)]

    @hookimpl
    def edge_validate_stage(self, backend: str, section: Mapping[str, Any], path: str) -> Any:
        return echo.edge_validate_stage(backend, section, path)

    @hookimpl
    def edge_reserve(self, stage: Any) -> Mapping[str, int]:
        return echo.edge_reserve(stage)

    @hookimpl
    def edge_load(self, stage: Any) -> Any:
        return echo.edge_load(stage)

    @hookimpl
    def edge_warmup_placement(self, loaded: Any) -> Any:
        return echo.edge_warmup_placement(loaded)

    @hookimpl
    def edge_call(self, loaded: Any, request: Any, inputs: Mapping[str, Any]) -> Iterator[Any]:
        return echo.edge_call(loaded, request, inputs)

    @hookimpl
    def edge_cancel(self, loaded: Any, request_id: str, epoch: int) -> Any:
        return echo.edge_cancel(loaded, request_id, epoch)

    @hookimpl
    def edge_retire(self, loaded: Any, deadline_s: float) -> Any:
        return echo.edge_retire(loaded, deadline_s)

    @hookimpl
    def edge_conformance_stage(self, backend: str, workdir: Path) -> Mapping[str, Any]:
        if self.stage_error:
            raise RuntimeError(self.stage_error)
        stage = dict(echo.edge_conformance_stage(backend, workdir))
        stage["expected"] = {"x": stage["inputs"]["x"] * np.float32(3.0)}
        return stage


def test_an_unavailable_backend_skips_every_check_with_the_probe_reason() -> None:
    plugins = load_plugins(objects={"nowhere": Nowhere()}, env=NO_ENTRY_POINTS)
    report = run_backend(plugins, "nowhere")
    assert not report.available and not report.failed
    assert [r.check for r in report.results] == list(CHECKS)
    for result in report.results:
        assert result.status is Status.SKIPPED
        assert "needs a frobnicator, none found" in result.detail
    assert report.counts() == {"passed": 0, "failed": 0, "skipped": len(CHECKS)}


def test_a_hook_without_a_specification_fails_check_pending() -> None:
    # Discovery refuses such a plugin; an embedder registering it on the manager directly
    # bypasses discovery, and the kit still catches it.
    manager = EdgePluginManager()
    manager.add_hookspecs(hookspecs)
    manager.register(Unspecced(), name="unspecced")
    record = PluginRecord("unspecced", __name__, "object")
    record.contract, record.backends, record.loaded = "1.0", ("unspecced",), True
    plugins = PluginSet(manager, [record])
    plugins.read_backends()
    report = run_backend(plugins, "unspecced")
    by_check = {r.check: r for r in report.results}
    assert by_check["hooks_have_specs"].status is Status.FAILED
    assert "edge_frobnicate" in by_check["hooks_have_specs"].detail
    assert by_check["contract_version"].status is Status.PASSED
    # It declares an available backend without the owner hooks: every stage check fails.
    for name in STAGE_CHECKS:
        assert by_check[name].status is Status.FAILED
        assert "does not implement edge_reserve" in by_check[name].detail
    assert by_check["probe_fast_and_light"].status is Status.SKIPPED


@pytest.mark.slow
def test_wrong_outputs_and_an_untrue_preemptible_claim_fail_their_checks() -> None:
    plugins = load_plugins(objects={"wrong": WrongEcho()}, env=NO_ENTRY_POINTS)
    report = run_backend(plugins, "wrong-echo", ["calls_match_expected", "cancel_running_call",
                                                 "retire_verified"])
    calls, cancel, retire = report.results
    assert calls.status is Status.FAILED
    assert "outputs.x: beyond the bound" in calls.detail
    assert cancel.status is Status.FAILED
    assert "did not cancel in place" in cancel.detail and "retire-required" in cancel.detail
    assert retire.status is Status.PASSED


def test_a_raising_conformance_hook_fails_the_stage_checks() -> None:
    plugins = load_plugins(objects={"wrong": WrongEcho("no model at hand")}, env=NO_ENTRY_POINTS)
    report = run_backend(plugins, "wrong-echo", ["contract_version", "calls_match_expected"])
    static, stage = report.results
    assert static.status is Status.PASSED
    assert stage.status is Status.FAILED
    assert stage.detail == "edge_conformance_stage: RuntimeError: no model at hand"


@pytest.fixture(scope="module")
def onnxruntime_imported() -> None:
    """Import onnxruntime before the leak snapshot: importing it opens a telemetry database
    for the process's life, which the plugin's in-process probe would otherwise do."""
    import onnxruntime  # noqa: F401


def test_a_probe_that_imports_a_heavy_runtime_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, onnxruntime_imported: None
) -> None:
    (tmp_path / "heavy_probe_plugin.py").write_text(textwrap.dedent('''
        from edge_core import hookimpl, hookspecs
        EDGE_CONTRACT = "1.0"

        @hookimpl
        def edge_backends():
            from edge_core.backend import BackendInfo
            return [BackendInfo(name="heavy", kinds=["graph"])]

        @hookimpl
        def edge_probe():
            import onnxruntime
            from edge_core.backend import ProbeReport
            return [ProbeReport(backend="heavy", available=True,
                                runtime={"onnxruntime": onnxruntime.__version__})]
    '''), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    plugins = load_plugins(local_modules=["heavy_probe_plugin"], env=NO_ENTRY_POINTS)
    (result,) = run_backend(plugins, "heavy", ["probe_fast_and_light"]).results
    assert result.status is Status.FAILED
    assert result.detail == "probe: imported a heavy runtime in the controller: ['onnxruntime']"


def test_unknown_check_names_are_refused() -> None:
    plugins = load_plugins(objects={"nowhere": Nowhere()}, env=NO_ENTRY_POINTS)
    with pytest.raises(KeyError, match="no_such_check"):
        run_backend(plugins, "nowhere", ["no_such_check"])


class RestartingEcho(WrongEcho):
    """The echo worker, non-preemptible, whose conformance stage declares
    ``restart = "on-failure"``: the kit's cancel check follows that policy."""

    @hookimpl
    def edge_backends(self) -> list[BackendInfo]:
        return [BackendInfo(name="restarting-echo", kinds=["graph"], preemptible=False,
                            providers=["numpy"])]

    @hookimpl
    def edge_probe(self) -> list[ProbeReport]:
        return [ProbeReport(backend="restarting-echo", available=True)]

    @hookimpl
    def edge_conformance_stage(self, backend: str, workdir: Path) -> Mapping[str, Any]:
        stage = dict(echo.edge_conformance_stage(backend, workdir))
        stage["stage"] = {**stage["stage"], "restart": "on-failure", "restart_backoff_s": 0.0}
        return stage


@pytest.mark.slow
def test_the_cancel_check_follows_an_on_failure_restart_policy() -> None:
    plugins = load_plugins(objects={"restarting": RestartingEcho()}, env=NO_ENTRY_POINTS)
    (cancel,) = run_backend(plugins, "restarting-echo", ["cancel_running_call"]).results
    assert cancel.status is Status.PASSED, cancel.detail
    assert "restarted automatically" in cancel.detail



class BlockingEcho(WrongEcho):
    """Declares preemptible and answers every cancel "cancelled in place", but its worker
    runs each request inside ``submit`` (echo's non-preemptible worker): a slow request
    keeps the worker busy after its cancel."""

    def __init__(self) -> None:
        super().__init__()

    @hookimpl
    def edge_backends(self) -> list[BackendInfo]:
        return [BackendInfo(name="wrong-echo", kinds=["graph"], preemptible=True,
                            providers=["numpy"])]

    @hookimpl
    def edge_cancel(self, loaded: Any, request_id: str, epoch: int) -> Any:
        return loaded.cancel(request_id, epoch, preemptible=True)

    @hookimpl
    def edge_conformance_stage(self, backend: str, workdir: Path) -> Mapping[str, Any]:
        stage = dict(echo.edge_conformance_stage(backend, workdir))
        stage["slow_params"] = {"delay_s": 4.0}  # the slow request: 4 s inside submit
        return stage


class FinishedFirst(WrongEcho):
    """Declares preemptible, and every cancel finds its request finished already: its
    "slow" request is over before any cancel can reach it."""

    @hookimpl
    def edge_cancel(self, loaded: Any, request_id: str, epoch: int) -> Any:
        return CancelOutcome.ALREADY_FINISHED


@pytest.mark.slow
def test_a_slow_request_that_is_over_before_every_cancel_fails_cancel_running_call() -> None:
    """A try whose request had finished says nothing of cancelling: the check cancels
    sooner in the next, and fails only when every try found it finished."""
    plugins = load_plugins(objects={"wrong": FinishedFirst()}, env=NO_ENTRY_POINTS)
    (cancel,) = run_backend(plugins, "wrong-echo", ["cancel_running_call"]).results
    assert cancel.status is Status.FAILED, cancel.detail
    assert "had finished before its cancel in every try" in cancel.detail
    assert "slow_inputs/slow_params must run longer" in cancel.detail


class CrashesWithoutBundle(WrongEcho):
    """Its conformance stage has a bundle; without one its reserve hook crashes with a raw
    ``TypeError`` (``None / "file"``), as a backend written without reading that
    ``manifest_dir`` may be ``None`` would."""

    def __init__(self) -> None:
        super().__init__()

    @hookimpl
    def edge_reserve(self, stage: Any) -> Mapping[str, int]:
        size = (stage.manifest_dir / "model.bin").stat().st_size
        return {**echo.edge_reserve(stage), "machine:ram": 256 * 1024 * 1024 + size}

    @hookimpl
    def edge_conformance_stage(self, backend: str, workdir: Path) -> Mapping[str, Any]:
        from edge_core.artifacts import create_manifest

        stage = dict(echo.edge_conformance_stage(backend, workdir))
        bundle = workdir / "bundle"
        bundle.mkdir()
        (bundle / "model.bin").write_bytes(b"weights")
        np.savez(bundle / "example.npz", x=stage["inputs"]["x"])
        create_manifest(bundle, graph="model.bin", example_inputs="example.npz")
        stage["stage"] = {**stage["stage"], "manifest": str(bundle)}
        return stage


@pytest.mark.slow
def test_a_preemptible_claim_whose_worker_blocks_in_submit_fails_cancel_running_call() -> None:
    plugins = load_plugins(objects={"wrong": BlockingEcho()}, env=NO_ENTRY_POINTS)
    (cancel,) = run_backend(plugins, "wrong-echo", ["cancel_running_call"]).results
    assert cancel.status is Status.FAILED, cancel.detail
    assert "the next request was served" in cancel.detail
    assert cancel.seconds < 15  # the verdict does not wait out every slow request


def test_a_stage_that_crashes_without_its_bundle_fails_missing_bundle_handled() -> None:
    plugins = load_plugins(objects={"wrong": CrashesWithoutBundle()}, env=NO_ENTRY_POINTS)
    (check,) = run_backend(plugins, "wrong-echo", ["missing_bundle_handled"]).results
    assert check.status is Status.FAILED
    assert "crashed with TypeError" in check.detail and "manifest_dir None" in check.detail


def test_typed_refusals_and_bundle_free_stages_pass_missing_bundle_handled() -> None:
    plugins = load_plugins(objects={"wrong": WrongEcho()}, env=NO_ENTRY_POINTS)
    (check,) = run_backend(plugins, "wrong-echo", ["missing_bundle_handled"]).results
    assert check.status is Status.PASSED
    assert "every stage check ran with manifest_dir None" in check.detail
