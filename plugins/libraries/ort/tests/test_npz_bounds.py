"""The worker's .npz reader applies the archive bounds before allocating, on both paths."""

from __future__ import annotations

import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest

from edge_contracts.errors import ArchiveRefused
from edge_contracts.npz_limits import NPZ_MAX_RATIO
from edge_ort.npz import load_npz


def _npy(shape: tuple[int, ...], dtype: str, body: bytes) -> bytes:
    text = repr({"descr": dtype, "fortran_order": False, "shape": shape}).encode("latin1")
    text += b" " * (64 - (10 + len(text) + 1) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text + body


def test_a_deflate_bomb_is_refused_before_inflating(tmp_path: Path) -> None:
    path = tmp_path / "bomb.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("x.npy", _npy((64 << 20,), "|u1", bytes(64 << 20)))
    assert path.stat().st_size < 1 << 20
    with pytest.raises(ArchiveRefused, match=rf"more than {NPZ_MAX_RATIO} x") as caught:
        load_npz(str(path))
    assert caught.value.field == "bomb.npz['x']"


@pytest.mark.parametrize("method", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])
def test_an_npy_header_declaring_32_tib_is_refused_on_the_numpy_path(
    tmp_path: Path, method: int
) -> None:
    path = tmp_path / "huge.npz"
    with zipfile.ZipFile(path, "w", method) as archive:
        archive.writestr("x.npy", _npy((4 << 40,), "<f8", b"\0" * 64))
    with pytest.raises(ArchiveRefused, match="must fill the member's declared"):
        load_npz(str(path))


def test_archives_within_the_bounds_still_load(tmp_path: Path) -> None:
    path = tmp_path / "ok.npz"
    arrays = {"zeros": np.zeros((512, 512), np.float32), "ids": np.arange(10)}
    np.savez_compressed(path, **arrays)  # 1 MiB of zeros: above the ratio, under the floor
    loaded = load_npz(str(path))
    for name, array in arrays.items():
        np.testing.assert_array_equal(loaded[name], array)
