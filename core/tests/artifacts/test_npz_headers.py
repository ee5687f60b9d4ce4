""".npz shapes read from the .npy headers: hostile archives refused without loading an array.

The verifier no longer calls ``numpy.load`` on a bundle's archives; these tests make
``numpy.load`` and ``numpy.lib.format.read_array`` fail loudly so that a refusal which
needed them would show, and check the refusals are the ones ``load_npz`` gives.
"""

from __future__ import annotations

import struct
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from edge_core.artifacts import ReferenceRefused, verify_bundle
from edge_core.artifacts.npz_headers import read_npz_headers
from edge_core.artifacts.references import load_npz, npz_headers, specs_of_headers
from edge_core.shapes import specs_of

from .bundles import edit_manifest, sha256_of, write_bundle


def _npy(shape: tuple[int, ...], dtype: object, body: bytes) -> bytes:
    header = {"descr": dtype, "fortran_order": False, "shape": shape}
    text = repr(header).encode("latin1")
    text += b" " * (64 - (10 + len(text) + 1) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text + body


def _in_bundle(tmp_path: Path, make: Callable[[Path], None]) -> Path:
    directory = write_bundle(tmp_path / "b")
    make(directory / "inputs.npz")
    edit_manifest(directory, lambda m: m["files"].update(
        {"inputs.npz": sha256_of(directory / "inputs.npz")}))
    return directory


@pytest.fixture
def no_array_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any numpy.load or read_array during the test fails it."""
    def refuse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("an array was loaded")

    monkeypatch.setattr(np, "load", refuse)
    monkeypatch.setattr(np.lib.format, "read_array", refuse)


def _object_npz(path: Path) -> None:
    """A stored member whose header declares an object dtype (what follows it: a pickle's
    place; nothing here is ever unpickled, so it is written by hand)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("x.npy", _npy((2,), "|O", b"\x80\x04N." * 2))


def test_an_object_dtype_header_is_refused_without_loading(
    tmp_path: Path, staging_root: Path, no_array_loads: None
) -> None:
    directory = _in_bundle(tmp_path, _object_npz)
    with pytest.raises(ReferenceRefused, match="allow_pickle=False") as caught:
        verify_bundle(directory, staging_root=staging_root)
    assert caught.value.field == "manifest.metadata.example_inputs"


def test_an_object_field_inside_a_structured_dtype_is_refused(
    tmp_path: Path, no_array_loads: None
) -> None:
    path = tmp_path / "s.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("x.npy", _npy((1,), [("a", "<i4"), ("b", "|O")], b"\0" * 12))
    with pytest.raises(ReferenceRefused, match="allow_pickle=False"):
        npz_headers(path, "npz")


def test_an_oversized_shape_is_refused_without_loading(
    tmp_path: Path, staging_root: Path, no_array_loads: None
) -> None:
    def huge(path: Path) -> None:
        with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
            archive.writestr("x.npy", _npy((1 << 20, 1 << 20), "<f4", b"\0" * 64))

    directory = _in_bundle(tmp_path, huge)
    with pytest.raises(ReferenceRefused, match="must fill the member's declared") as caught:
        verify_bundle(directory, staging_root=staging_root)
    assert caught.value.field == "manifest.metadata.example_inputs['x.npy']"


def test_a_member_failing_its_crc_is_refused_as_load_npz_refuses_it(tmp_path: Path) -> None:
    path = tmp_path / "crc.npz"
    np.savez(path, x=np.arange(1000, dtype=np.int64))
    data = bytearray(path.read_bytes())
    at = data.index(b"\x93NUMPY") + 200  # inside the array's bytes
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ReferenceRefused, match="CRC") as loaded:
        load_npz(path, "npz")
    with pytest.raises(ReferenceRefused, match="CRC") as headers:
        npz_headers(path, "npz")
    assert (headers.value.field, headers.value.reason) == (loaded.value.field,
                                                           loaded.value.reason)


def test_a_file_numpy_does_not_read_as_an_archive_is_refused_as_before(tmp_path: Path) -> None:
    path = tmp_path / "one.npz"
    np.save(path.with_suffix(".npy"), np.zeros(3))
    path.with_suffix(".npy").rename(path)
    with pytest.raises(ReferenceRefused) as loaded:
        load_npz(path, "npz")
    with pytest.raises(ReferenceRefused) as headers:
        npz_headers(path, "npz")
    assert str(headers.value) == str(loaded.value)


def test_headers_agree_with_the_loaded_arrays(tmp_path: Path) -> None:
    path = tmp_path / "mixed.npz"
    arrays = {"f": np.zeros((2, 3, 4), np.float32), "big": np.ones((7,), ">i8"),
              "fortran": np.asfortranarray(np.zeros((5, 2), np.uint8)),
              "scalar": np.array(3.5), "empty": np.zeros((0, 9), np.int16)}
    np.savez_compressed(path, **arrays)
    loaded = load_npz(path, "npz")
    headers = npz_headers(path, "npz")
    assert list(headers) == list(loaded)
    for name, array in loaded.items():
        assert headers[name].shape == array.shape
        assert headers[name].dtype == array.dtype
    assert specs_of_headers(headers) == specs_of(loaded)


def test_a_member_without_the_npy_magic_is_its_raw_bytes(tmp_path: Path) -> None:
    path = tmp_path / "raw.npz"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("notes.txt", b"hello")
    with path.open("rb") as handle:
        headers = read_npz_headers(handle, "npz")
    assert headers["notes.txt"].raw == b"hello"
    assert load_npz(path, "npz")["notes.txt"] == b"hello"
