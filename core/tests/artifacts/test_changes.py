"""A bundle changed between verification and load is refused; the worker's copy never changes."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from edge_contracts.manifest import MANIFEST_FILENAME
from edge_core.artifacts import BundleChanged, DigestMismatch, verify_bundle
from edge_core.artifacts.hashing import hash_member

from .bundles import edit_manifest, sha256_of


def _rewrite_same_size_keeping_mtime(path: Path) -> None:
    """Flip one byte in place, then restore the modification time (only ctime moves)."""
    info = path.stat()
    time.sleep(0.02)  # past one tick of a coarse file-system clock
    data = bytearray(path.read_bytes())
    data[0] ^= 0xFF
    with open(path, "r+b") as handle:
        handle.write(data)
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))


def test_member_changed_after_verification_is_refused_before_load(
    bundle: Path, staging_root: Path
) -> None:
    with verify_bundle(bundle, staging_root=staging_root) as verified:
        verified.ensure_unchanged()
        staged = verified.graph.read_bytes()
        _rewrite_same_size_keeping_mtime(bundle / "model.onnx")
        with pytest.raises(BundleChanged) as caught:
            verified.ensure_unchanged()
        assert caught.value.field == 'manifest.files["model.onnx"]'
        assert verified.graph.read_bytes() == staged, "the worker's copy must not change"


def test_member_replaced_by_another_file_after_verification_is_refused(
    bundle: Path, staging_root: Path
) -> None:
    with verify_bundle(bundle, staging_root=staging_root) as verified:
        replacement = bundle / "replacement"
        replacement.write_bytes((bundle / "weights.bin").read_bytes())
        replacement.replace(bundle / "weights.bin")  # same bytes, new inode
        with pytest.raises(BundleChanged, match=r"weights\.bin"):
            verified.ensure_unchanged()


def test_manifest_changed_after_verification_is_refused(
    bundle: Path, staging_root: Path
) -> None:
    with verify_bundle(bundle, staging_root=staging_root) as verified:
        edit_manifest(bundle, lambda m: m.update(component="other"))
        with pytest.raises(BundleChanged, match="manifest"):
            verified.ensure_unchanged()


def test_staged_copy_changed_after_verification_is_refused(
    bundle: Path, staging_root: Path
) -> None:
    with verify_bundle(bundle, staging_root=staging_root) as verified:
        copy = verified.path("weights.bin")
        copy.chmod(0o600)
        _rewrite_same_size_keeping_mtime(copy)
        with pytest.raises(BundleChanged, match="staged copy"):
            verified.ensure_unchanged()


def test_in_place_rehash_refuses_a_change_that_kept_every_timestamp(
    bundle: Path, staging_root: Path
) -> None:
    verified = verify_bundle(bundle, stage=False, staging_root=staging_root)
    verified.ensure_unchanged(rehash=True)
    _rewrite_same_size_keeping_mtime(bundle / "inputs.npz")
    with pytest.raises(BundleChanged):
        verified.ensure_unchanged(rehash=True)


def test_file_growing_while_it_is_hashed_is_refused(tmp_path: Path) -> None:
    root = tmp_path.resolve()
    path = root / "growing.bin"
    path.write_bytes(b"\0" * (64 << 20))
    stop = threading.Event()

    def append() -> None:
        with open(path, "ab") as handle:
            while not stop.is_set():
                handle.write(b"x" * 4096)
                handle.flush()
                time.sleep(0.001)

    writer = threading.Thread(target=append)
    writer.start()
    try:
        time.sleep(0.01)
        with pytest.raises(BundleChanged, match="while it was being hashed"):
            hash_member(root, "growing.bin")
    finally:
        stop.set()
        writer.join()


def test_bundle_fixed_after_a_refusal_verifies_again(bundle: Path, staging_root: Path) -> None:
    _rewrite_same_size_keeping_mtime(bundle / "weights.bin")
    with pytest.raises(DigestMismatch, match="sha256 differs"):
        verify_bundle(bundle, staging_root=staging_root)
    edit_manifest(bundle, lambda m: m["files"].update(
        {"weights.bin": sha256_of(bundle / "weights.bin")}))
    with verify_bundle(bundle, staging_root=staging_root) as verified:
        assert verified.manifest_sha256 == sha256_of(bundle / MANIFEST_FILENAME)
