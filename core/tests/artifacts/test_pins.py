"""Bundle pins: inside a stage's loads, a bundle is the one the stage opened with.

A bundle rewritten in place (graph, weights and manifest consistently, so that a fresh
verification passes) is refused with ``BundleChanged`` naming the manifest and both
sha256s, unless the stage kept the staged copy it opened with: then that copy is reissued
(hashed again) whatever the bundle holds. Staged copies are checked to be gone afterwards
(the ``staging_root`` fixture). The pin follows the stage's load, not the thread: a
verification of the bundle a stage is loading answers to its pin from any thread.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from edge_contracts.manifest import MANIFEST_FILENAME
from edge_core.artifacts import (
    BundleChanged,
    create_manifest,
    verification_scope,
    verify_bundle,
    verify_once,
)
from edge_core.artifacts.errors import MemberPathRefused
from edge_core.artifacts.pins import BundleIdentities, BundlePin, loaded_directory

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


def on_a_thread(work: Callable[[], Any]) -> Any:
    """``work()`` run on a new thread (as a plugin's own loader thread runs it)."""
    done: dict[str, Any] = {}

    def run() -> None:
        try:
            done["value"] = work()
        except BaseException as error:
            done["error"] = error

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if "error" in done:
        raise done["error"]
    return done["value"]


def test_a_load_pins_its_bundle_in_every_thread_while_it_runs(
        bundle: Path, staging_root: Path) -> None:
    pin = BundlePin()
    with pin.active(bundle):
        loaded = Loaded(on_a_thread(lambda: verify_once(bundle, staging_root=staging_root)))
    assert pin.identities.opened(bundle) == loaded.bundle.manifest_sha256  # recorded
    pin.keep(loaded)
    loaded.bundle.cleanup()
    now = rewrite(bundle)
    with pin.active(bundle):
        again = on_a_thread(lambda: verify_once(bundle, staging_root=staging_root))
        assert again.detached and again.directory == loaded.bundle.directory
        again.cleanup()
        with pytest.raises(BundleChanged) as refused:  # in place: nothing kept to reissue
            on_a_thread(lambda: verify_bundle(bundle, stage=False))
        assert refused.value.value == now
    # another bundle verified on another thread while the load runs: not the stage's
    other = write_bundle(bundle.parent / "other")
    with pin.active(bundle):
        on_a_thread(lambda: verify_bundle(other, stage=False))
    assert pin.identities.opened(other) is None
    # once the load is over, a verification on another thread is nobody's
    on_a_thread(lambda: verify_bundle(bundle, staging_root=staging_root)).cleanup()
    pin.release()


def test_two_stages_loading_one_bundle_a_thread_of_neither_is_checked_against_both(
        bundle: Path, staging_root: Path) -> None:
    """It cannot tell which stage it serves: it is recorded by both, refused when either
    opened with another manifest, and no kept copy is reissued."""
    first, second = BundlePin(), BundlePin()
    with first.active(bundle), second.active(bundle):
        loaded = Loaded(on_a_thread(lambda: verify_once(bundle, staging_root=staging_root)))
    opened = loaded.bundle.manifest_sha256
    assert first.identities.opened(bundle) == second.identities.opened(bundle) == opened
    first.keep(loaded)
    loaded.bundle.cleanup()
    now = rewrite(bundle)
    third = BundlePin()  # a stage opening on the rewrite while the first restarts
    with first.active(bundle), third.active(bundle), pytest.raises(BundleChanged) as refused:
        on_a_thread(lambda: verify_once(bundle, staging_root=staging_root))
    assert opened in refused.value.reason and refused.value.value == now
    with first.active(bundle):  # the first alone: its kept copy
        again = on_a_thread(lambda: verify_once(bundle, staging_root=staging_root))
    assert again.detached and again.manifest_sha256 == opened
    again.cleanup()
    first.release()


def test_a_manifest_expected_since_the_open_is_the_only_one_that_passes(
        bundle: Path, staging_root: Path) -> None:
    """A candidate's bundle read (not verified) when its stage opened: a later
    verification passes with that manifest alone; one unreadable then never passes."""
    opened = verify_bundle(bundle, stage=False).manifest_sha256
    identities = BundleIdentities()
    identities.expect(bundle, opened)
    identities.expect(bundle, "0" * 64)  # the first expectation stays
    assert identities.opened(bundle) == opened
    with BundlePin(identities).active(bundle):
        verify_bundle(bundle, stage=False)
    now = rewrite(bundle)
    with BundlePin(identities).active(bundle), pytest.raises(BundleChanged) as refused:
        verify_bundle(bundle, stage=False)
    assert opened in refused.value.reason and refused.value.value == now
    unread = BundleIdentities()
    unread.expect(bundle.parent / "missing", None)
    unread.expect(bundle, None)
    assert unread.opened(bundle) is None
    with BundlePin(unread).active(bundle), pytest.raises(BundleChanged) as refused:
        verify_bundle(bundle, staging_root=staging_root)
    assert "could not be read when the stage opened" in refused.value.reason


def test_the_identities_keep_the_manifest_verified_first_not_a_rewrite(
        bundle: Path, staging_root: Path) -> None:
    identities = BundleIdentities()
    assert identities.manifest(bundle) is None
    identities.expect(bundle, verify_bundle(bundle, stage=False).manifest_sha256)
    assert identities.manifest(bundle) is None  # read, not verified, at open
    with BundlePin(identities).active(bundle):
        verified = verify_bundle(bundle, stage=False)
    assert identities.manifest(bundle) == verified.manifest
    rewrite(bundle)
    with BundlePin(identities).active(bundle), pytest.raises(BundleChanged):
        verify_bundle(bundle, staging_root=staging_root)
    assert identities.manifest(bundle) == verified.manifest


def test_read_gives_the_verified_bytes_of_a_member_from_the_copy_or_the_checked_disk(
        bundle: Path, staging_root: Path) -> None:
    """``BundlePin.read``: the kept copy's bytes whatever the disk holds; without a copy
    the disk's, only while they hash to what the verified manifest gives the member."""
    member = "inputs.npz"
    original = (bundle / member).read_bytes()
    assert BundlePin().read(bundle, member) is None  # nothing verified: nothing known
    kept, disk = BundlePin(), BundlePin()
    with kept.active(bundle):
        loaded = Loaded(verify_once(bundle, staging_root=staging_root))
    kept.keep(loaded)
    loaded.bundle.cleanup()
    with disk.active(bundle):
        opened = verify_bundle(bundle, stage=False)
    with pytest.raises(MemberPathRefused):
        disk.read(bundle, "not-listed.npz")
    assert kept.read(bundle, member) == disk.read(bundle, member) == original
    (bundle / member).write_bytes(original + b"\0")  # the manifest left as it was
    assert kept.read(bundle, member) == original
    with pytest.raises(BundleChanged) as changed:
        disk.read(bundle, member)
    assert changed.value.field == str(bundle / member)
    assert opened.manifest.files[member] in changed.value.reason
    assert opened.manifest_sha256 in changed.value.reason
    (bundle / member).unlink()  # gone: refused the same way
    with pytest.raises(BundleChanged) as gone:
        disk.read(bundle, member)
    assert gone.value.field == str(bundle / member)
    assert str(gone.value.value).startswith("none (")
    rewrite(bundle)
    (bundle / member).write_bytes(original)  # a new manifest, the member's bytes as verified
    create_manifest(bundle, graph="model.onnx", example_inputs=member, overwrite=True)
    assert disk.read(bundle, member) == original
    (bundle / member).write_bytes(original + b"\0")
    now = create_manifest(bundle, graph="model.onnx", example_inputs=member,
                          overwrite=True).manifest_sha256
    with pytest.raises(BundleChanged) as refused:
        disk.read(bundle, member)
    assert refused.value.field == str(bundle / MANIFEST_FILENAME)
    assert opened.manifest_sha256 in refused.value.reason and refused.value.value == now
    assert kept.read(bundle, member) == original
    kept.release()


def test_loaded_directory_is_the_copy_or_the_bundle_checked_unchanged(
        bundle: Path, staging_root: Path) -> None:
    staged = verify_bundle(bundle, staging_root=staging_root)
    in_place = verify_bundle(bundle, stage=False)
    assert loaded_directory(staged) == staged.directory != bundle
    assert loaded_directory(in_place) == bundle
    os.utime(bundle / "inputs.npz")  # touched, the manifest unchanged: the file named
    with pytest.raises(BundleChanged) as touched:
        loaded_directory(in_place)
    assert touched.value.field == 'manifest.files["inputs.npz"]'
    in_place = verify_bundle(bundle, stage=False)
    now = rewrite(bundle)
    with pytest.raises(BundleChanged) as refused:
        loaded_directory(in_place)
    assert refused.value.field == str(bundle / MANIFEST_FILENAME)
    assert in_place.manifest_sha256 in refused.value.reason and refused.value.value == now
    assert loaded_directory(staged) == staged.directory  # the copy: what was verified
    staged.cleanup()


def test_check_loaded_sees_a_file_replaced_or_rewritten_with_every_time_put_back(
        bundle: Path) -> None:
    """What a ``stat`` sees (docs/artifacts.md, "What a file-status check sees"): the same
    bytes renamed into place are another inode, and a same-size write in place moves the
    ctime, which ``utime`` cannot set back; size, mtime and atime are all as verified."""
    from edge_core.artifacts.pins import check_loaded

    graph = bundle / "model.onnx"
    for change in ("renamed into place", "written in place"):
        verified = verify_bundle(bundle, stage=False)
        before = graph.stat()
        data = graph.read_bytes()
        time.sleep(0.02)  # past one tick of a coarse clock (a kernel before Linux 6.13)
        if change == "renamed into place":
            (bundle / "model.new").write_bytes(data)
            os.replace(bundle / "model.new", graph)
        else:
            with open(graph, "r+b") as handle:
                handle.write(data)
        os.utime(graph, ns=(before.st_atime_ns, before.st_mtime_ns))
        after = graph.stat()
        assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
        with pytest.raises(BundleChanged) as refused:
            check_loaded(verified)
        assert refused.value.field == 'manifest.files["model.onnx"]', change
