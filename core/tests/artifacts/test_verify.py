"""verify_bundle: what a verified bundle gives a worker, and every refusal."""

from __future__ import annotations

import importlib.util
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge_contracts.manifest import MANIFEST_FILENAME
from edge_core.artifacts import (
    DigestMismatch,
    ManifestSchemaInvalid,
    MemberMissing,
    MemberPathRefused,
    ReferenceRefused,
    verify_bundle,
)
from edge_core.errors import ManifestInvalid

from .bundles import NOT_ONNX_GRAPHS, edit_manifest, sha256_of, write_bundle


def test_created_bundle_verifies_and_gives_the_worker_a_private_copy(
    bundle: Path, staging_root: Path
) -> None:
    with verify_bundle(bundle, staging_root=staging_root) as verified:
        assert verified.staged
        assert verified.directory.parent == staging_root
        assert stat.S_IMODE(verified.directory.stat().st_mode) == 0o700
        for name in ("model.onnx", "weights.bin", "inputs.npz", "expected.npz"):
            copy = verified.directory / name
            assert copy.read_bytes() == (bundle / name).read_bytes()
            assert stat.S_IMODE(copy.stat().st_mode) == 0o400
        assert verified.graph == verified.directory / "model.onnx"
        assert verified.example_inputs == verified.directory / "inputs.npz"
        assert verified.expected_outputs == verified.directory / "expected.npz"
        assert verified.manifest_sha256 == sha256_of(bundle / MANIFEST_FILENAME)
        assert dict(verified.references.external_data) == {"model.onnx": ("weights.bin",)}
        inputs = verified.load_example_inputs()
        assert list(inputs) == ["x"] and inputs["x"].shape == (1, 64)
        assert np.array_equal(verified.load_expected_outputs()["y"], np.full((1, 64), 2))
        directory = verified.directory
    assert verified.cleaned_up
    assert not directory.exists()


def test_cleanup_is_idempotent_and_in_place_verification_copies_nothing(
    bundle: Path, staging_root: Path
) -> None:
    verified = verify_bundle(bundle, staging_root=staging_root)
    verified.cleanup()
    verified.cleanup()
    in_place = verify_bundle(bundle, stage=False, staging_root=staging_root)
    assert in_place.directory == bundle.resolve() and not in_place.staged
    in_place.cleanup()
    assert (bundle / "model.onnx").exists()


def test_tampered_file_is_refused_and_nothing_is_left_staged(
    bundle: Path, staging_root: Path
) -> None:
    data = bytearray((bundle / "weights.bin").read_bytes())
    data[100] ^= 0xFF
    (bundle / "weights.bin").write_bytes(bytes(data))
    with pytest.raises(DigestMismatch) as caught:
        verify_bundle(bundle, staging_root=staging_root)
    assert caught.value.field == 'manifest.files["weights.bin"]'
    assert caught.value.value == sha256_of(bundle / "weights.bin")
    assert str(caught.value).startswith('manifest.files["weights.bin"]: sha256 differs')


def test_wrong_hash_in_the_manifest_is_refused(bundle: Path, staging_root: Path) -> None:
    edit_manifest(bundle, lambda m: m["files"].update({"inputs.npz": "0" * 64}))
    with pytest.raises(DigestMismatch, match=r"inputs\.npz"):
        verify_bundle(bundle, staging_root=staging_root)


def test_missing_member_is_refused_before_anything_is_hashed(
    bundle: Path, staging_root: Path
) -> None:
    (bundle / "expected.npz").unlink()
    with pytest.raises(MemberMissing) as caught:
        verify_bundle(bundle, staging_root=staging_root)
    assert caught.value.field == 'manifest.files["expected.npz"]'


@pytest.mark.parametrize(
    "path",
    ["../outside.bin", "sub/../../outside.bin", "/etc/passwd", "sub\\file.bin", "C:file.bin",
     "./model.onnx"],
)
def test_unsafe_member_path_in_the_manifest_is_refused(
    bundle: Path, staging_root: Path, path: str
) -> None:
    edit_manifest(bundle, lambda m: m["files"].update({path: "0" * 64}))
    with pytest.raises(MemberPathRefused) as caught:
        verify_bundle(bundle, staging_root=staging_root)
    assert caught.value.value == path


def test_symlinked_file_leading_outside_the_bundle_is_refused(
    tmp_path: Path, staging_root: Path
) -> None:
    directory = write_bundle(tmp_path / "bundle")
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"not part of the bundle")
    (directory / "link.bin").symlink_to(secret)
    edit_manifest(directory, lambda m: m["files"].update({"link.bin": sha256_of(secret)}))
    with pytest.raises(MemberPathRefused, match="symlink escape") as caught:
        verify_bundle(directory, staging_root=staging_root)
    assert caught.value.field == 'manifest.files["link.bin"]'


def test_symlinked_parent_directory_leading_outside_the_bundle_is_refused(
    tmp_path: Path, staging_root: Path
) -> None:
    directory = write_bundle(tmp_path / "bundle")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "weights.bin").write_bytes(b"\0" * 64)
    (directory / "shared").symlink_to(outside, target_is_directory=True)
    digest = sha256_of(outside / "weights.bin")
    edit_manifest(directory, lambda m: m["files"].update({"shared/weights.bin": digest}))
    with pytest.raises(MemberPathRefused, match="outside the bundle"):
        verify_bundle(directory, staging_root=staging_root)


def test_symlink_that_stays_inside_the_bundle_is_a_member_like_any_file(
    bundle: Path, staging_root: Path
) -> None:
    (bundle / "alias.npz").symlink_to("inputs.npz")
    edit_manifest(bundle, lambda m: m["files"].update({"alias.npz": sha256_of(
        bundle / "inputs.npz")}))
    with verify_bundle(bundle, staging_root=staging_root) as verified:
        copy = verified.path("alias.npz")
        assert not copy.is_symlink()
        assert copy.read_bytes() == (bundle / "inputs.npz").read_bytes()


def test_special_file_member_is_refused(bundle: Path, staging_root: Path) -> None:
    os.mkfifo(bundle / "pipe")
    edit_manifest(bundle, lambda m: m["files"].update({"pipe": "0" * 64}))
    with pytest.raises(MemberPathRefused, match="regular file"):
        verify_bundle(bundle, staging_root=staging_root)


def test_manifest_that_is_missing_malformed_or_a_symlink_is_refused(
    tmp_path: Path, bundle: Path, staging_root: Path
) -> None:
    manifest = bundle / MANIFEST_FILENAME
    text = manifest.read_text()
    manifest.write_text(text[:-20])
    with pytest.raises(ManifestSchemaInvalid, match="valid JSON"):
        verify_bundle(bundle, staging_root=staging_root)
    moved = tmp_path / "elsewhere.json"
    moved.write_text(text)
    manifest.unlink()
    with pytest.raises(ManifestSchemaInvalid, match=r"has no edge-manifest\.json"):
        verify_bundle(bundle, staging_root=staging_root)
    manifest.symlink_to(moved)
    with pytest.raises(MemberPathRefused, match="manifest"):
        verify_bundle(bundle, staging_root=staging_root)


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (lambda m: m.update(schema_version=2), ManifestSchemaInvalid),
        (lambda m: m["metadata"].update(graph="other.onnx"), ReferenceRefused),
        (lambda m: m["metadata"].update(example_inputs="absent.npz"), ReferenceRefused),
        (lambda m: m["metadata"]["validation"].update(expected_outputs="absent.npz"),
         ReferenceRefused),
        (lambda m: m["files"].update({MANIFEST_FILENAME: "0" * 64}), ManifestSchemaInvalid),
    ],
    ids=["schema-version", "graph-unlisted", "example-inputs-unlisted",
         "expected-outputs-unlisted", "manifest-lists-itself"],
)
def test_manifest_breaking_the_schema_or_referencing_unlisted_files_is_refused(
    bundle: Path, staging_root: Path, change: Any, error: type[ManifestInvalid]
) -> None:
    edit_manifest(bundle, change)
    with pytest.raises(error):
        verify_bundle(bundle, staging_root=staging_root)


@pytest.mark.parametrize(("data", "missing"), NOT_ONNX_GRAPHS)
def test_a_graph_named_onnx_that_is_not_an_onnx_model_is_refused(
    bundle: Path, staging_root: Path, data: bytes, missing: str
) -> None:
    """A manifest written by hand (create refuses it too) for a graph that is not ONNX."""
    (bundle / "model.onnx").write_bytes(data)
    edit_manifest(bundle, lambda m: m["files"].update(
        {"model.onnx": sha256_of(bundle / "model.onnx")}))
    for stage in (True, False):
        with pytest.raises(ReferenceRefused) as caught:
            verify_bundle(bundle, stage=stage, staging_root=staging_root)
        assert (caught.value.field, caught.value.value) == ("manifest.metadata.graph",
                                                            "model.onnx")
        assert caught.value.reason.startswith(f"named .onnx but {missing}")


@pytest.mark.parametrize("member", ["sub/x.onnx", "buckets/B1.ONNX"])
@pytest.mark.parametrize(("data", "missing"), NOT_ONNX_GRAPHS)
def test_another_member_named_onnx_that_is_not_an_onnx_model_is_refused(
    bundle: Path, staging_root: Path, member: str, data: bytes, missing: str
) -> None:
    """A manifest written by hand (create refuses it too) listing, beside a valid graph,
    a file named .onnx that is not a model with a graph."""
    (bundle / member).parent.mkdir(parents=True, exist_ok=True)
    (bundle / member).write_bytes(data)
    edit_manifest(bundle, lambda m: m["files"].update({member: sha256_of(bundle / member)}))
    for stage in (True, False):
        with pytest.raises(ReferenceRefused) as caught:
            verify_bundle(bundle, stage=stage, staging_root=staging_root)
        assert (caught.value.field, caught.value.value) == (f'manifest.files["{member}"]',
                                                            member)
        assert caught.value.reason.startswith(f"named .onnx but {missing}")


def test_example_inputs_needing_pickle_are_refused(bundle: Path, staging_root: Path) -> None:
    np.savez(bundle / "inputs.npz", x=np.array([{"a": 1}], dtype=object))
    edit_manifest(bundle, lambda m: m["files"].update(
        {"inputs.npz": sha256_of(bundle / "inputs.npz")}))
    with pytest.raises(ReferenceRefused, match="without pickle") as caught:
        verify_bundle(bundle, staging_root=staging_root)
    assert caught.value.field == "manifest.metadata.example_inputs"


def test_example_inputs_that_are_not_an_npz_archive_are_refused(
    bundle: Path, staging_root: Path
) -> None:
    np.save(bundle / "bare.npy", np.ones(3))
    shutil.move(bundle / "bare.npy", bundle / "inputs.npz")
    edit_manifest(bundle, lambda m: m["files"].update(
        {"inputs.npz": sha256_of(bundle / "inputs.npz")}))
    with pytest.raises(ReferenceRefused, match="npz"):
        verify_bundle(bundle, staging_root=staging_root)


def test_unlisted_files_are_reported_and_never_staged(bundle: Path, staging_root: Path) -> None:
    (bundle / "README.txt").write_text("notes")
    with verify_bundle(bundle, staging_root=staging_root) as verified:
        assert verified.unlisted == ("README.txt",)
        assert not (verified.directory / "README.txt").exists()
        assert verified.describe()["unlisted"] == ["README.txt"]


_WORKER = """
import sys
import numpy as np
import onnxruntime as ort
graph, inputs, expected = sys.argv[1:]
session = ort.InferenceSession(graph, providers=["CPUExecutionProvider"])
with np.load(inputs, allow_pickle=False) as feeds, np.load(expected, allow_pickle=False) as ref:
    (output,) = session.run(None, dict(feeds))
    sys.exit(0 if np.array_equal(output, ref["y"]) else 3)
"""


def test_a_worker_process_loads_the_staged_copy_with_its_external_data(
    bundle: Path, staging_root: Path
) -> None:
    if importlib.util.find_spec("onnxruntime") is None:  # imported only in the child
        pytest.skip("onnxruntime is not installed")
    with verify_bundle(bundle, staging_root=staging_root) as verified:
        verified.ensure_unchanged()
        result = subprocess.run(
            [sys.executable, "-c", _WORKER, str(verified.graph), str(verified.example_inputs),
             str(verified.expected_outputs)],
            capture_output=True, text=True, timeout=120, check=False,
        )
        assert result.returncode == 0, result.stderr
