"""The ORT stage options refuse what ONNX Runtime cannot take, naming the option."""

from __future__ import annotations

import pytest

from edge_core.errors import ConfigError
from edge_ort.options import MAX_THREADS, OrtOptions


@pytest.mark.parametrize("threads", [-1, MAX_THREADS + 1, 10**11, True])
def test_intra_op_threads_outside_0_to_the_maximum_are_refused_by_name(threads: int) -> None:
    with pytest.raises(ConfigError, match=rf"intra_op_threads: must be between 0 and "
                                          rf"{MAX_THREADS}"):
        OrtOptions(intra_op_threads=threads)


@pytest.mark.parametrize("threads", [0, 1, MAX_THREADS])
def test_intra_op_threads_from_0_to_the_maximum_are_taken(threads: int) -> None:
    assert OrtOptions(intra_op_threads=threads).intra_op_threads == threads
