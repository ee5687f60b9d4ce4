"""Bundle pins: inside a stage's loads, a bundle is the one the stage opened with.

A bundle rewritten in place (graph, weights and manifest consistently, so that a fresh
verification passes) is refused with ``BundleChanged`` naming the manifest and both
sha256s, unless the stage kept the staged copy it opened with: then that copy is reissued
(hashed again) whatever the bundle holds. Staged copies are checked to be gone afterwards
(the ``staging_root`` fixture).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from edge_contracts.manifest import MANIFEST_FILENAME
from edge_core.artifacts import (
    BundleChanged,
    create_manifest,
    verification_scope,
    verify_bundle,
    verify_once,
)
from edge_core.artifacts.pins import BundleIdentities, BundlePin

from .bundles import matmul_model, write_bundle


class Loaded:
    """What a backend's load returns: it holds its verified bundle (``edge_ort``'s does)."""

    def __init__(self, bundle: object) -> None:
        self.bundle = bundle


def rewrite(bundle: Path) -> str:
    """Deploy another model in place, consistently; the new manifest's sha256."""
    write_bundle(bundle, model=matmul_model(32), create=False)
    create_manifest(bundle, graph="model.onnx", example_inputs="inputs.npz",
                    expected_outputs="expected.npz", precision="float32", overwrite=True)
    return verify_bundle(bundle, stage=False).manifest_sha256  # a fresh one passes


def test_a_rewritten_bundle_is_refused_naming_the_manifest_and_both_sha256s(
        bundle: Path, staging_root: Path) -> None:
    pin = BundlePin()
    with pin.active():
        opened = verify_bundle(bundle, stage=False)
    now = rewrite(bundle)
    with pin.active(), pytest.raises(BundleChanged) as refused:
        verify_bundle(bundle, staging_root=staging_root)  # nothing kept: from disk
    assert refused.value.field == str(bundle / MANIFEST_FILENAME)
    assert opened.manifest_sha256 in refused.value.reason and refused.value.value == now
    with pin.active(), pytest.raises(BundleChanged):
        verify_once(bundle, staging_root=staging_root)
    verify_bundle(bundle, staging_root=staging_root).cleanup()  # outside a pin: as before


def test_a_restart_gets_the_kept_copy_whatever_the_bundle_holds_now(
        bundle: Path, staging_root: Path) -> None:
    pin = BundlePin()
    with pin.active():
        loaded = Loaded(verify_once(bundle, staging_root=staging_root))
    pin.keep(loaded)
    opened = loaded.bundle
    opened.cleanup()  # the dead worker's stage is retired: the pin keeps the copy
    assert opened.directory.is_dir() and pin.kept() == {str(bundle): str(opened.directory)}
    rewrite(bundle)
    with pin.active():
        again = verify_once(bundle, staging_root=staging_root)
    assert again.detached and again.directory == opened.directory
    assert again.manifest_sha256 == opened.manifest_sha256
    again.ensure_unchanged(rehash=True)  # the copy is checked, not the rewritten bundle
    with pytest.raises(BundleChanged):
        opened.ensure_unchanged()  # an ordinary handle does see the rewrite
    again.cleanup()
    assert opened.directory.is_dir()
    pin.release()
    assert not opened.directory.exists()


def test_a_kept_copy_that_changed_is_dropped_and_the_bundle_verified_afresh(
        bundle: Path, staging_root: Path) -> None:
    pin = BundlePin()
    with pin.active():
        loaded = Loaded(verify_bundle(bundle, staging_root=staging_root))
    pin.keep(loaded)
    copy = loaded.bundle.path("inputs.npz")
    os.chmod(copy, 0o600)
    data = bytearray(copy.read_bytes())
    data[-1] ^= 1
    copy.write_bytes(bytes(data))
    with pin.active():
        fresh = verify_once(bundle, staging_root=staging_root)  # unchanged on disk: passes
    assert not fresh.detached and fresh.directory != loaded.bundle.directory
    assert pin.kept() == {}
    fresh.cleanup()
    loaded.bundle.cleanup()
    rewrite(bundle)
    with pin.active(), pytest.raises(BundleChanged):  # and now nothing can serve the old
        verify_once(bundle, staging_root=staging_root)


def test_replicas_share_the_identity_a_sibling_opening_on_a_rewrite_is_refused(
        bundle: Path, staging_root: Path) -> None:
    identities = BundleIdentities()
    first, second = BundlePin(identities), BundlePin(identities)
    with verification_scope():
        with first.active():
            handle = verify_once(bundle, staging_root=staging_root)
        rewrite(bundle)
        with second.active(), pytest.raises(BundleChanged):
            verify_once(bundle, staging_root=staging_root)
    handle.cleanup()


def test_keep_takes_only_a_staged_copy_of_the_opened_manifest(
        bundle: Path, staging_root: Path) -> None:
    pin = BundlePin()
    with pin.active():
        in_place = verify_bundle(bundle, stage=False)
    pin.keep(Loaded(in_place))
    pin.keep(Loaded(None))
    pin.keep(object())
    assert pin.kept() == {}
    other = verify_bundle(rewrite_copy(bundle), staging_root=staging_root)
    pin.keep(Loaded(other))  # never verified inside the pin: not the stage's bundle
    assert pin.kept() == {}
    other.cleanup()


def rewrite_copy(bundle: Path) -> Path:
    """Another bundle directory beside ``bundle``."""
    return write_bundle(bundle.parent / "other")
