"""The warm-up runs the example inputs and expected outputs the stage verified.

Real ort-cpu workers over the ``y = k * x`` bundle of ``test_ort_cpu_restart_bundle``.
Verified in place (``stage_bundle = false``), the worker reads its warm-up's example
inputs and expected outputs from the bundle itself, after its load. A hook wrapper
rewrites them between the verification (in ``edge_load``) and that read (inside
``edge_warmup_placement``): the worker hashes what it reads against the manifest the
stage verified, and the open is refused with ``BundleChanged`` — never a warm-up run on
other bytes, whose placement and numerics would be shown as the stage's evidence.
Staged (the default), the worker reads the private copy: the rewrite on disk changes
nothing. Each refusal leaves no worker, segment or staged copy, and nothing charged.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_contracts.requests import ErrorInfo
from edge_contracts.worker_errors import error_info
from edge_core import hookimpl
from edge_core.artifacts import BundleChanged, verify_bundle
from edge_core.host.errors import RemoteError
from edge_core.ledger import ResourceLedger
from edge_core.plugins import load_plugins
from edge_core.testing.leaks import no_leaks as _no_leaks
from edge_ort.controller import archive_refusal
from edge_ort.npz import ArchiveChanged

from .conftest import EXAMPLE_X
from .test_ort_cpu_restart_bundle import open_scale, write_scale_bundle

no_leaks = pytest.fixture(autouse=True)(_no_leaks)

TENFOLD = (EXAMPLE_X * 10).astype(np.float32)
"""The rewrite's example inputs."""


class BeforeWarmup:
    """Fault injection: ``act`` runs once the stage loaded, right before its warm-up."""

    EDGE_CONTRACT = "1.0"

    def __init__(self, act: Callable[[], None]) -> None:
        self.act = act
        self.calls = 0

    @hookimpl(wrapper=True)
    def edge_warmup_placement(self, loaded: Any) -> Generator[None, Any, Any]:
        self.calls += 1
        self.act()
        return (yield)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def rewrite_examples(bundle: Path) -> None:
    """Example inputs and expected outputs replaced, consistently, under the manifest."""
    np.savez(bundle / "example_inputs.npz", x=TENFOLD)
    np.savez(bundle / "expected.npz", y=(TENFOLD * np.float32(2.0)).astype(np.float32))


def open_with(act: Callable[[], None], ledger: ResourceLedger, bundle: Path,
              staged: bool) -> tuple[BeforeWarmup, Any]:
    """Open the stage with ``act`` run before its warm-up; the wrapper and the pipeline."""
    wrapper = BeforeWarmup(act)
    plugins = load_plugins(objects={"rewrite": wrapper}, env={"EDGE_PLUGINS": "ort-cpu"})
    return wrapper, open_scale(plugins, ledger, bundle, options={"stage_bundle": staged})


def test_examples_rewritten_under_the_manifest_before_the_warmup_are_refused_naming_them(
        ledger: ResourceLedger, tmp_path: Path) -> None:
    bundle = tmp_path / "scale"
    write_scale_bundle(bundle, 2.0)
    verified = sha256(bundle / "example_inputs.npz")
    with pytest.raises(BundleChanged) as caught:
        open_with(lambda: rewrite_examples(bundle), ledger, bundle, staged=False)[1].close()
    assert caught.value.field == str(bundle / "example_inputs.npz")
    assert f"differs from the sha256 {verified}" in caught.value.reason
    assert caught.value.value == sha256(bundle / "example_inputs.npz")
    assert ledger.is_empty()


def test_expected_outputs_rewritten_before_the_warmup_are_refused_naming_them(
        ledger: ResourceLedger, tmp_path: Path) -> None:
    """Expected outputs that would fail the gate: refused as changed, not compared."""
    bundle = tmp_path / "scale"
    write_scale_bundle(bundle, 2.0)
    verified = sha256(bundle / "expected.npz")

    def rewrite() -> None:
        np.savez(bundle / "expected.npz", y=(EXAMPLE_X * np.float32(5.0)).astype(np.float32))

    with pytest.raises(BundleChanged) as caught:
        open_with(rewrite, ledger, bundle, staged=False)[1].close()
    assert caught.value.field == str(bundle / "expected.npz")
    assert f"differs from the sha256 {verified}" in caught.value.reason
    assert caught.value.value == sha256(bundle / "expected.npz")
    assert ledger.is_empty()


def test_a_bundle_redeployed_before_the_warmup_is_refused_naming_both_manifests(
        ledger: ResourceLedger, tmp_path: Path) -> None:
    """Graph, examples and manifest rewritten consistently (a fresh verification would
    pass) once the old graph loaded: refused naming the manifest and both sha256s."""
    bundle = tmp_path / "scale"
    opened = write_scale_bundle(bundle, 2.0)
    rewritten: list[str] = []
    with pytest.raises(BundleChanged) as caught:
        open_with(lambda: rewritten.append(write_scale_bundle(bundle, 3.0, x=TENFOLD)),
                  ledger, bundle, staged=False)[1].close()
    assert caught.value.field == str(bundle / "edge-manifest.json")
    assert opened in caught.value.reason and caught.value.value == rewritten[0]
    assert ledger.is_empty()


def test_a_staged_warmup_runs_the_copy_whatever_the_disk_holds(
        ledger: ResourceLedger, tmp_path: Path) -> None:
    bundle = tmp_path / "scale"
    write_scale_bundle(bundle, 2.0)
    wrapper, pipeline = open_with(lambda: rewrite_examples(bundle), ledger, bundle,
                                  staged=True)
    with pipeline:
        assert wrapper.calls == 1
        (stage,) = pipeline.execution_plan()["stages"]
        worst = stage["numerics"]["outputs"]["y"]["worst"]  # the copy's first element
        assert (worst["index"], worst["expected"], worst["got"]) == ([0, 0], -2.0, -2.0)
        with pipeline.run({"x": EXAMPLE_X}) as result:
            np.testing.assert_array_equal(result.outputs["y"], EXAMPLE_X * 2)
    assert ledger.is_empty()


def test_the_refusal_is_built_from_the_worker_error_s_fields_never_from_its_wording(
        tmp_path: Path) -> None:
    """The controller's refusal of a worker's ``ArchiveChanged``, as it arrives: the
    error sent as a worker sends it (``error_info``) and read back as the client reads
    it. The file and the sha256 read are the error's fields: a reworded message names
    them as well; an error without them is refused naming the stage's manifest."""
    bundle = tmp_path / "scale"
    write_scale_bundle(bundle, 2.0)
    verified = verify_bundle(bundle, stage=False)
    try:
        path = str(bundle / "example_inputs.npz")
        manifest_gives = sha256(bundle / "example_inputs.npz")
        np.savez(bundle / "example_inputs.npz", x=TENFOLD)  # the file alone rewritten
        now = sha256(bundle / "example_inputs.npz")
        read = {path: "example_inputs.npz"}
        for reason in ("differs from the sha256 that the verified manifest gives it; "
                       "sha256 now", "not the bytes verified (the digest read follows)"):
            info = ErrorInfo.from_dict(error_info(ArchiveChanged(path, now, reason)))
            error = RemoteError("worker.warmup", info.type, info.message, info.detail)
            refusal = archive_refusal(verified, read, "s", error)
            assert (refusal.field, refusal.value) == (path, now)
            assert f"differs from the sha256 {manifest_gives}" in refusal.reason
        bare = RemoteError("worker.warmup", "ArchiveChanged", f"{path}: differs; sha256 "
                           f"now: {now!r}")
        refusal = archive_refusal(verified, read, "s", bare)
        assert (refusal.field, refusal.value) == ("stages[s].manifest", bare.value)
    finally:
        verified.cleanup()
