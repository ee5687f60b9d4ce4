"""Large copies shared between threads: the same bytes, errors raised, fork-safe."""

from __future__ import annotations

import subprocess
import sys
import threading

import numpy as np
import pytest

from edge_contracts import copying
from edge_contracts.copying import COPY_THREADS_ENV, copy_bytes, copy_threads


@pytest.fixture
def shared_always(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every copy is split (three chunks), whatever its size."""
    monkeypatch.setattr(copying, "PARALLEL_MIN_BYTES", 1)
    monkeypatch.setenv(COPY_THREADS_ENV, "3")


@pytest.mark.usefixtures("shared_always")
@pytest.mark.parametrize("nbytes", [1, 4095, 4096, 4097, 3 * 4096 + 5, 8 * 4096, 1_048_583])
def test_split_copies_give_the_same_bytes(nbytes: int) -> None:
    src = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
    dst = np.zeros(nbytes, np.uint8)
    copy_bytes(dst, src)
    assert np.array_equal(dst, src)


def test_mismatched_arrays_are_refused() -> None:
    with pytest.raises(ValueError, match="uint8 vectors"):
        copy_bytes(np.zeros(4, np.uint8), np.zeros(5, np.uint8))
    with pytest.raises(ValueError, match="uint8 vectors"):
        copy_bytes(np.zeros(4, np.float32), np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="uint8 vectors"):
        copy_bytes(np.zeros((2, 2), np.uint8), np.zeros((2, 2), np.uint8))


@pytest.mark.usefixtures("shared_always")
def test_a_failing_chunk_on_a_helper_is_raised_to_the_caller(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caller = threading.current_thread()

    class HelperFails:
        """numpy, except that copies on helper threads fail."""

        def __getattr__(self, name: str) -> object:
            return getattr(np, name)

        @staticmethod
        def copyto(dst: np.ndarray, src: np.ndarray) -> None:
            if threading.current_thread() is not caller:
                raise MemoryError("helper chunk failed")
            np.copyto(dst, src)

    monkeypatch.setattr(copying, "np", HelperFails())
    with pytest.raises(MemoryError, match="helper chunk"):
        copy_bytes(np.zeros(3 * 4096, np.uint8), np.ones(3 * 4096, np.uint8))


@pytest.mark.usefixtures("shared_always")
def test_a_read_only_destination_fails_without_hanging() -> None:
    dst = np.zeros(3 * 4096, np.uint8)
    dst.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        copy_bytes(dst, np.ones(3 * 4096, np.uint8))


def test_the_thread_count_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(COPY_THREADS_ENV, "1")
    assert copy_threads() == 1
    monkeypatch.setenv(COPY_THREADS_ENV, "nonsense")
    assert 1 <= copy_threads() <= 4


def test_one_thread_starts_no_helpers() -> None:
    code = (
        "import threading, numpy as np; from edge_contracts import copying; "
        "copying.PARALLEL_MIN_BYTES = 1; "
        "copying.copy_bytes(np.zeros(1 << 20, np.uint8), np.ones(1 << 20, np.uint8)); "
        "print(sorted(t.name for t in threading.enumerate() if t.name.startswith('edge-copy')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**_env(), COPY_THREADS_ENV: "1"}, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def test_a_forked_child_gets_its_own_helpers() -> None:
    # The parent's helper threads do not exist in a forked child: waiting for them there
    # would hang, so the child must start its own.
    code = (
        "import os, numpy as np; from edge_contracts import copying; "
        "copying.PARALLEL_MIN_BYTES = 1; "
        "src = np.arange(1 << 20, dtype=np.uint32).view(np.uint8); dst = np.zeros_like(src); "
        "copying.copy_bytes(dst, src); pid = os.fork()\n"
        "if pid == 0:\n"
        "    dst[:] = 0; copying.copy_bytes(dst, src); os._exit(0 if (dst == src).all() else 3)\n"
        "_, status = os.waitpid(pid, 0); print(os.waitstatus_to_exitcode(status))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**_env(), COPY_THREADS_ENV: "2"}, check=True, timeout=60)
    assert out.stdout.strip() == "0"


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)


@pytest.mark.usefixtures("shared_always")
def test_helpers_keep_no_view_of_the_arrays_after_the_copy() -> None:
    # A helper holding its last chunk would keep a shared-memory mapping (and its file
    # descriptor) alive after the segment was given back.
    import gc
    import weakref

    dst = np.zeros(3 * 4096, np.uint8)
    src = np.ones(3 * 4096, np.uint8)
    refs = [weakref.ref(dst), weakref.ref(src)]
    copy_bytes(dst, src)
    del dst, src
    gc.collect()
    assert [ref() for ref in refs] == [None, None]


@pytest.mark.usefixtures("shared_always")
@pytest.mark.parametrize(
    "array",
    [
        np.arange(3 * 4096 + 7, dtype=np.float32).reshape(-1, 1),
        np.arange(24, dtype=np.int64).reshape(2, 3, 4).transpose(1, 0, 2),  # not contiguous
        np.zeros((0, 5), np.float16),
        np.array(["a", "bc"]),
    ],
)
def test_owned_copies_equal_numpy_copies(array: np.ndarray) -> None:
    array.flags.writeable = False
    copied = copying.owned_copy(array)
    assert copied.dtype == array.dtype and copied.shape == array.shape
    assert np.array_equal(copied, array)
    assert copied.flags.owndata and copied.flags.writeable
    assert not np.may_share_memory(copied, array)
