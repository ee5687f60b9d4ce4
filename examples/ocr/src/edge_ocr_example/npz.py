"""Byte-reproducible ``.npz`` files: same arrays in, same bytes out (no pickle, fixed dates).

``numpy.savez`` stamps each member with the current time, so two builds of the same bundle
would hash differently. These files are ordinary ``.npz`` archives that ``numpy.load``
reads; members are stored uncompressed, sorted by name, dated 1980-01-01.
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

__all__ = ["load_npz", "save_npz"]

_EPOCH = (1980, 1, 1, 0, 0, 0)


def save_npz(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """Write ``arrays`` to ``path`` as an uncompressed, reproducible ``.npz`` archive."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        for name in sorted(arrays):
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_EPOCH)
            info.external_attr = 0o644 << 16
            with archive.open(info, "w", force_zip64=True) as member:
                np.lib.format.write_array(
                    member, np.ascontiguousarray(arrays[name]), allow_pickle=False
                )


def load_npz(path: Path) -> dict[str, np.ndarray]:
    """Read every array of an ``.npz`` file with pickle disabled."""
    with np.load(path, allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}
