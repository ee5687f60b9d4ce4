"""Bundles crafted to slip past verification: models under other names, npz bombs,
duplicate manifest keys. Each is refused with a typed error before anything is loaded."""

from __future__ import annotations

import io
import struct
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx.external_data_helper import _get_all_tensors

from edge_contracts.errors import ArchiveRefused
from edge_contracts.npz_limits import (
    NPZ_MAX_ARRAY_BYTES,
    NPZ_MAX_RATIO,
    check_members,
    check_npz_file,
)
from edge_core.artifacts import (
    ManifestSchemaInvalid,
    ReferenceRefused,
    verify_bundle,
)

from .bundles import edit_manifest, sha256_of, write_bundle


def _hide_weights(directory: Path, graph: str) -> None:
    """Point the graph's external data at an unlisted file (the weights, renamed)."""
    (directory / "weights.bin").rename(directory / "unlisted.bin")
    model = onnx.load(directory / graph, load_external_data=False)
    for tensor in _get_all_tensors(model):
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = "unlisted.bin"
    onnx.save_model(model, directory / graph)

    def change(manifest: dict[str, object]) -> None:
        files = manifest["files"]
        assert isinstance(files, dict)
        files.pop("weights.bin")
        files[graph] = sha256_of(directory / graph)

    edit_manifest(directory, change)


@pytest.mark.parametrize("graph", ["model.ONNX", "model.onnx.bin", "model.Onnx"])
def test_a_graph_under_any_name_is_scanned_for_external_data(
    tmp_path: Path, staging_root: Path, graph: str
) -> None:
    directory = write_bundle(tmp_path / "b", graph_name=graph)
    _hide_weights(directory, graph)
    for stage in (True, False):
        with pytest.raises(ReferenceRefused, match="not in the verified set"):
            verify_bundle(directory, stage=stage, staging_root=staging_root)


def test_a_member_that_parses_as_a_model_is_scanned_whatever_its_name(
    tmp_path: Path, staging_root: Path
) -> None:
    directory = write_bundle(tmp_path / "b")
    _hide_weights(directory, "model.onnx")
    # The listed graph is clean; the hostile model hides as a data file a route could load.
    (directory / "model.onnx").rename(directory / "aux.dat")
    write_bundle(directory, external=False, create=False)

    def change(manifest: dict[str, object]) -> None:
        files = manifest["files"]
        assert isinstance(files, dict)
        files["aux.dat"] = sha256_of(directory / "aux.dat")
        files["model.onnx"] = sha256_of(directory / "model.onnx")

    edit_manifest(directory, change)
    with pytest.raises(ReferenceRefused, match="not in the verified set") as caught:
        verify_bundle(directory, staging_root=staging_root)
    assert 'manifest.files["aux.dat"]' in caught.value.field


def test_plain_data_members_are_not_mistaken_for_models(
    tmp_path: Path, staging_root: Path
) -> None:
    directory = write_bundle(tmp_path / "b", create=False)
    (directory / "notes.txt").write_text("weights: see weights.bin\n" * 100)
    (directory / "random.bin").write_bytes(np.random.default_rng(7).bytes(1 << 16))
    write_bundle(directory)  # a manifest listing them all
    with verify_bundle(directory, staging_root=staging_root) as verified:
        assert set(verified.references.external_data) == {"model.onnx"}


def test_a_manifest_with_duplicate_keys_is_refused(tmp_path: Path, staging_root: Path) -> None:
    directory = write_bundle(tmp_path / "b")
    path = directory / "edge-manifest.json"
    text = path.read_text()
    path.write_text(text.replace('"files": {', '"files": {"weights.bin": "' + "0" * 64 + '", ',
                                 1))
    with pytest.raises(ManifestSchemaInvalid, match=r"duplicate key 'weights\.bin'"):
        verify_bundle(directory, staging_root=staging_root)


def _npy(shape: tuple[int, ...], dtype: str, body: bytes) -> bytes:
    header = {"descr": dtype, "fortran_order": False, "shape": shape}
    text = repr(header).encode("latin1")
    pad = 64 - (10 + len(text) + 1) % 64
    text += b" " * pad + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text + body


def _deflated_zeros(path: Path, members: dict[str, int]) -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, nbytes in members.items():
            archive.writestr(f"{name}.npy", _npy((nbytes,), "|u1", bytes(nbytes)))


def _in_bundle(tmp_path: Path, make: Callable[[Path], None]) -> Path:
    """A bundle whose example inputs are the archive ``make`` writes."""
    directory = write_bundle(tmp_path / "b")
    make(directory / "inputs.npz")
    edit_manifest(directory, lambda m: m["files"].update(
        {"inputs.npz": sha256_of(directory / "inputs.npz")}))
    return directory


def test_a_deflate_bomb_is_refused_by_its_ratio_before_inflating(
    tmp_path: Path, staging_root: Path
) -> None:
    directory = _in_bundle(tmp_path, lambda p: _deflated_zeros(p, {"x": 64 << 20}))
    assert (directory / "inputs.npz").stat().st_size < 1 << 20
    started = time.monotonic()
    with pytest.raises(ReferenceRefused, match=rf"more than {NPZ_MAX_RATIO} x") as caught:
        verify_bundle(directory, staging_root=staging_root)
    assert caught.value.field == "manifest.metadata.example_inputs['x.npy']"
    assert time.monotonic() - started < 30


def test_many_small_bombs_are_refused_by_the_archive_ratio() -> None:
    members = [(f"m{i}.npy", 1 << 20, 1 << 10, True) for i in range(100)]  # 100 MiB, 100 KiB
    with pytest.raises(ArchiveRefused, match="deflated members declare"):
        check_members(members, "npz")
    check_members(members[:60], "npz")  # 60 MiB: under the archive floor


def test_declared_sizes_beyond_the_limits_are_refused() -> None:
    with pytest.raises(ArchiveRefused, match=f"more than {NPZ_MAX_ARRAY_BYTES} bytes"):
        check_members([("x.npy", NPZ_MAX_ARRAY_BYTES + 1, NPZ_MAX_ARRAY_BYTES + 1, False)], "n")
    with pytest.raises(ArchiveRefused, match="together"):
        check_members([(f"{i}.npy", 900 << 20, 900 << 20, False) for i in range(3)], "n")


def _huge_header_npz(path: Path) -> None:
    """A 32 TiB array declared by the .npy header of a 200-byte stored member."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("x.npy", _npy((4 << 40,), "<f8", b"\0" * 64))


def test_an_npy_header_declaring_32_tib_is_refused_without_allocating(
    tmp_path: Path, staging_root: Path
) -> None:
    directory = _in_bundle(tmp_path, _huge_header_npz)
    with pytest.raises(ReferenceRefused, match="must fill the member's declared"):
        verify_bundle(directory, staging_root=staging_root)
    buffer = io.BytesIO((directory / "inputs.npz").read_bytes())
    with pytest.raises(ArchiveRefused):
        check_npz_file(buffer, "npz")


def test_edge_manifest_verify_reports_the_32_tib_npz_without_a_traceback(
    tmp_path: Path
) -> None:
    directory = _in_bundle(tmp_path, _huge_header_npz)
    result = subprocess.run(
        [sys.executable, "-c", "import sys; from edge_core.cli import main; sys.exit(main())",
         "manifest", "verify", str(directory)],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr + result.stdout
    assert "example_inputs" in result.stderr + result.stdout
