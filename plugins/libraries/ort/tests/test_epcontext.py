"""The EP-context key: each file's sha256 from the verified manifest, read bytes otherwise.

Real bundles (``edge_core.artifacts.create_manifest``) and real reads, counted by this
process's own read counter (``/proc/self/io``'s ``rchar``): a file the manifest lists
is never read for the key, a file it does not list is read once per load, and a file
that changed still changes the key.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from edge_core.artifacts import create_manifest
from edge_ort.epcontext import ArtifactDigests, artifact_digest, verified_sha256s

MiB = 1 << 20
pytestmark = pytest.mark.skipif(not Path("/proc/self/io").exists(),
                                reason="counts reads through /proc/self/io (Linux)")


def _read_bytes() -> int:
    with open("/proc/self/io") as counters:
        return next(int(line.split()[1]) for line in counters if line.startswith("rchar:"))


def _bundle(root: Path, fill: bytes = b"\1") -> tuple[Path, str]:
    """A bundle with a 16 MiB listed file; its graph's path and its manifest's sha256."""
    root.mkdir(exist_ok=True)
    (root / "model.bin").write_bytes(b"graph")
    (root / "weights.bin").write_bytes(fill * (16 * MiB))
    created = create_manifest(root, component="c", graph="model.bin", overwrite=True)
    return root / "model.bin", created.manifest_sha256


def test_a_listed_file_is_never_read_and_gives_the_key_its_bytes_would(tmp_path: Path) -> None:
    graph, sha256 = _bundle(tmp_path / "b")
    verified = verified_sha256s(str(tmp_path / "b"), sha256)
    before = _read_bytes()
    digest = artifact_digest(str(graph), verified)
    assert _read_bytes() - before < MiB  # neither weights.bin nor the manifest is read
    before = _read_bytes()
    assert artifact_digest(str(graph)) == digest  # every byte read: the same digest
    assert _read_bytes() - before >= 16 * MiB


def test_a_load_reads_an_unlisted_file_once_for_all_its_entries(tmp_path: Path) -> None:
    graph, sha256 = _bundle(tmp_path / "b")
    (tmp_path / "b" / "unlisted.bin").write_bytes(b"\3" * (4 * MiB))  # in place: beside it
    digests = ArtifactDigests(verified_sha256s(str(tmp_path / "b"), sha256))
    before = _read_bytes()
    first = digests.of(str(graph))
    read = _read_bytes() - before
    assert 4 * MiB <= read < 5 * MiB  # the unlisted file alone
    before = _read_bytes()
    assert digests.of(str(graph)) == first  # a bucket's entry: nothing read again
    assert _read_bytes() - before < 4096  # (the counters file itself)


def test_a_changed_file_changes_the_key(tmp_path: Path) -> None:
    graph, sha256 = _bundle(tmp_path / "b")
    digest = artifact_digest(str(graph), verified_sha256s(str(tmp_path / "b"), sha256))
    graph, rewritten = _bundle(tmp_path / "b", fill=b"\2")  # same size, a new manifest
    assert rewritten != sha256
    assert artifact_digest(str(graph), verified_sha256s(str(tmp_path / "b"),
                                                        rewritten)) != digest
    (tmp_path / "b" / "notes.txt").write_text("one")  # an unlisted file: read, hashed
    with_notes = artifact_digest(str(graph), verified_sha256s(str(tmp_path / "b"), rewritten))
    (tmp_path / "b" / "notes.txt").write_text("two")
    assert artifact_digest(str(graph), verified_sha256s(str(tmp_path / "b"),
                                                        rewritten)) != with_notes


def test_a_manifest_that_is_not_the_one_verified_is_not_believed(tmp_path: Path) -> None:
    """Its sha256s are not taken (the bundle changed since its verification): every file
    is read and hashed, so the key is that of the bytes there."""
    graph, sha256 = _bundle(tmp_path / "b")
    manifest = tmp_path / "b" / "edge-manifest.json"
    verified = verified_sha256s(str(tmp_path / "b"), sha256)
    assert verified[manifest.resolve()] == sha256
    assert verified[(tmp_path / "b" / "weights.bin").resolve()] == hashlib.sha256(
        (tmp_path / "b" / "weights.bin").read_bytes()).hexdigest()
    assert verified_sha256s(str(tmp_path / "nowhere"), sha256) == {}
    graph, _ = _bundle(tmp_path / "b", fill=b"\2")  # redeployed since the verification
    assert verified_sha256s(str(tmp_path / "b"), sha256) == {}
    assert artifact_digest(str(graph), verified_sha256s(str(tmp_path / "b"), sha256)) \
        == artifact_digest(str(graph))
