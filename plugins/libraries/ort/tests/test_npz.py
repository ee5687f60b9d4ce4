"""The worker's .npz reader: the arrays numpy.load gives, without importing zipfile."""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from edge_ort.npz import OWN_SHA256_MAX_BYTES, ArchiveChanged, _members, load_npz

RNG = np.random.default_rng(0)
ARRAYS = {
    "x": RNG.standard_normal((2, 3)).astype(np.float32),
    "n": np.array(5, np.int64),
    "f": np.asfortranarray(RNG.standard_normal((4, 5))),
    "b": np.array([True, False]),
    "h": np.zeros((0, 3), np.float16),
    "u": RNG.integers(0, 255, (1000,), np.uint8),
    "big": RNG.standard_normal((300, 1000)).astype(np.float32),
    "name with.dots": np.arange(3),
}


def same_as_numpy(path: Path) -> dict[str, np.ndarray]:
    got = load_npz(str(path))
    with np.load(path, allow_pickle=False) as reference:
        assert list(got) == list(reference.files)
        for name in reference.files:
            want = reference[name]
            assert got[name].dtype == want.dtype and got[name].shape == want.shape, name
            assert np.array_equal(got[name], want), name
            assert got[name].flags.writeable, name
            assert got[name].flags.f_contiguous == want.flags.f_contiguous, name
    return got


@pytest.mark.parametrize("writer", ["savez", "savez_compressed"])
def test_numpy_archives_are_read_without_the_fallback(tmp_path: Path, writer: str) -> None:
    path = tmp_path / f"{writer}.npz"
    getattr(np, writer)(path, **ARRAYS)
    assert set(_members(memoryview(path.read_bytes()))) == set(ARRAYS)  # not by np.load
    same_as_numpy(path)


def test_positional_names_and_forced_zip64_local_headers(tmp_path: Path) -> None:
    path = tmp_path / "positional.npz"
    np.savez(path, np.ones(3), np.zeros(2))
    assert list(same_as_numpy(path)) == ["arr_0", "arr_1"]
    forced = tmp_path / "zip64.npz"  # what the OCR example's reproducible writer does
    info = zipfile.ZipInfo("x.npy", date_time=(1980, 1, 1, 0, 0, 0))
    with (
        zipfile.ZipFile(forced, "w") as archive,
        archive.open(info, "w", force_zip64=True) as member,
    ):
        np.lib.format.write_array(member, ARRAYS["x"], allow_pickle=False)
    assert set(_members(memoryview(forced.read_bytes()))) == {"x"}
    same_as_numpy(forced)


def test_a_corrupted_member_is_refused_as_numpy_load_refuses_it(tmp_path: Path) -> None:
    path = tmp_path / "bad.npz"
    np.savez(path, x=np.ones(1000))
    data = bytearray(path.read_bytes())
    data[200] ^= 0xFF  # inside the member's bytes: the CRC-32 no longer matches
    path.write_bytes(bytes(data))
    with pytest.raises(zipfile.BadZipFile):
        load_npz(str(path))


def test_a_truncated_archive_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "whole.npz"
    np.savez(path, **ARRAYS)
    cut = tmp_path / "cut.npz"
    cut.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(zipfile.BadZipFile):
        load_npz(str(cut))


def test_object_arrays_are_refused_without_unpickling(tmp_path: Path) -> None:
    path = tmp_path / "object.npz"
    np.savez(path, o=np.array([{"a": 1}], dtype=object))
    with pytest.raises(ValueError, match="allow_pickle"):
        load_npz(str(path))


def test_other_archives_fall_back_to_numpy_load(tmp_path: Path) -> None:
    path = tmp_path / "bzip2.npz"
    with (
        zipfile.ZipFile(path, "w", compression=zipfile.ZIP_BZIP2) as archive,
        archive.open("x.npy", "w") as member,
    ):
        np.lib.format.write_array(member, ARRAYS["u"], allow_pickle=False)
    with pytest.raises(Exception, match="compression"):
        _members(memoryview(path.read_bytes()))
    assert np.array_equal(same_as_numpy(path)["x"], ARRAYS["u"])


@pytest.mark.parametrize("compression", [zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2],
                         ids=["read-here", "numpy-load"])
def test_given_its_sha256_the_bytes_read_once_are_those_parsed(
        tmp_path: Path, compression: int) -> None:
    """With the verified sha256: the same arrays (on both paths); other bytes, or none,
    are refused naming the file, both sha256s, before any array is read."""
    path = tmp_path / "inputs.npz"
    with zipfile.ZipFile(path, "w", compression=compression) as archive:
        for name in ("x", "u"):
            with archive.open(f"{name}.npy", "w") as member:
                np.lib.format.write_array(member, ARRAYS[name], allow_pickle=False)
    verified = hashlib.sha256(path.read_bytes()).hexdigest()
    got = load_npz(str(path), verified)
    assert list(got) == ["x", "u"]
    assert all(np.array_equal(got[n], ARRAYS[n]) and got[n].flags.writeable for n in got)
    np.savez(path, x=ARRAYS["x"] * 10)
    with pytest.raises(ArchiveChanged) as caught:
        load_npz(str(path), verified)
    assert caught.value.field == str(path)
    assert caught.value.value == hashlib.sha256(path.read_bytes()).hexdigest()
    assert f"differs from the sha256 {verified}" in caught.value.reason
    path.unlink()
    with pytest.raises(ArchiveChanged) as caught:
        load_npz(str(path), verified)
    assert caught.value.value == "none (No such file or directory)"


@pytest.mark.parametrize("elements", [16, OWN_SHA256_MAX_BYTES // 4 + 1024],
                         ids=["own-sha256", "hashlib"])
def test_either_sha256_module_verifies_and_refuses_the_same(
        tmp_path: Path, elements: int) -> None:
    """A small archive is hashed by the interpreter's own sha256 module, a large one by
    hashlib (OpenSSL): the same digest, the same refusal."""
    path = tmp_path / "inputs.npz"
    array = np.arange(elements, dtype=np.float32)
    np.savez(path, x=array)
    assert (path.stat().st_size > OWN_SHA256_MAX_BYTES) == (elements > 16)
    verified = hashlib.sha256(path.read_bytes()).hexdigest()
    assert np.array_equal(load_npz(str(path), verified)["x"], array)
    np.savez(path, x=array + 1)
    with pytest.raises(ArchiveChanged) as caught:
        load_npz(str(path), verified)
    assert caught.value.value == hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_small_archive_verified_imports_no_hashlib(tmp_path: Path) -> None:
    """OpenSSL's libcrypto is not loaded for a warm-up's small example archive."""
    path = tmp_path / "inputs.npz"
    np.savez(path, x=ARRAYS["x"])
    assert path.stat().st_size <= OWN_SHA256_MAX_BYTES
    verified = hashlib.sha256(path.read_bytes()).hexdigest()
    assert load_in_fresh_process(path, verified, "_hashlib", "hashlib") == ["1", "False", "False"]


def test_reading_an_archive_imports_no_zipfile(tmp_path: Path) -> None:
    path = tmp_path / "inputs.npz"
    np.savez(path, **ARRAYS)
    assert load_in_fresh_process(path, None, "zipfile") == [str(len(ARRAYS)), "False"]


def load_in_fresh_process(path: Path, sha256: str | None, *modules: str) -> list[str]:
    """In a fresh interpreter: how many arrays ``load_npz`` read, then whether each of
    ``modules`` was imported by then (``True``/``False``)."""
    code = (
        "import sys; from edge_ort.npz import load_npz; "
        f"arrays = load_npz({str(path)!r}, {sha256!r}); "
        f"print(len(arrays), *(name in sys.modules for name in {list(modules)!r}))"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60).stdout.split()


def _stored_archive(path: Path, members: list[tuple[str, bytes]]) -> None:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, data in members:
            archive.writestr(name, data)


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def test_a_npy_name_over_other_bytes_reads_as_numpy_load_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "not_npy.npz"
    _stored_archive(path, [("x.npy", b"hello, these are not .npy")])
    with pytest.raises(Exception, match=r"not \.npy"):
        _members_then_arrays(path)
    got = load_npz(str(path))
    with np.load(path, allow_pickle=False) as reference:
        assert got["x"] == np.array(reference["x"])  # the bytes, as the worker always read them


def test_a_local_name_that_differs_from_the_directory_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "renamed.npz"
    _stored_archive(path, [("x.npy", _npy_bytes(np.arange(3)))])
    data = bytearray(path.read_bytes())
    local_name = data.index(b"x.npy")  # the local header's copy comes first
    data[local_name] = ord("y")
    path.write_bytes(bytes(data))
    with pytest.raises(zipfile.BadZipFile, match="differ"):
        load_npz(str(path))


def test_directory_entries_sharing_one_member_are_not_inflated(tmp_path: Path) -> None:
    # A small file whose directory lists one deflated member many times would inflate it
    # once per entry: such overlap goes to numpy.load, which refuses the file.
    path = tmp_path / "overlap.npz"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("m0.npy", _npy_bytes(np.zeros(1 << 18, np.float32)))
    data = path.read_bytes()
    central = data.index(b"PK\x01\x02")
    end = data.index(b"PK\x05\x06")
    entry = data[central:end]
    entries = [entry.replace(b"m0.npy", f"m{i}.npy".encode()) for i in range(20)]
    directory = b"".join(entries)
    record = bytearray(data[end:])
    record[8:10] = record[10:12] = len(entries).to_bytes(2, "little")
    record[12:16] = len(directory).to_bytes(4, "little")
    path.write_bytes(data[:central] + directory + bytes(record))
    with pytest.raises(Exception, match=r"differ|overlap"):
        _members_then_arrays(path)
    with pytest.raises(zipfile.BadZipFile):
        load_npz(str(path))


def test_a_stored_member_is_copied_once(tmp_path: Path) -> None:
    import tracemalloc

    array = np.arange(4 << 20, dtype=np.float32)  # 16 MiB
    path = tmp_path / "big.npz"
    np.savez(path, x=array)
    tracemalloc.start()
    try:
        got = load_npz(str(path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert np.array_equal(got["x"], array)
    assert peak < 1.25 * array.nbytes  # the result itself, and no second copy


def _members_then_arrays(path: Path) -> None:
    from edge_ort.npz import _array

    data = memoryview(path.read_bytes())
    for where in _members(data).values():
        _array(data, *where)
