"""The page pipeline's bundles: shapes read from .npy headers equal the loaded arrays'.

The verifier builds each bundle's shape set from the headers of its ``.npz`` examples
(:func:`edge_core.artifacts.references.npz_headers`) instead of loading them; on the
real OCR bundles the names, dtypes and shapes must be exactly what ``numpy.load`` gives.
"""

from __future__ import annotations

from pathlib import Path

from edge_core.artifacts.references import load_npz, npz_headers, specs_of_headers
from edge_core.shapes import specs_of


def test_headers_equal_the_loaded_arrays_on_every_ocr_example(page_bundles: Path) -> None:
    archives = sorted(page_bundles.glob("*/examples/*.npz"))
    stages = {path.parent.parent.name for path in archives}
    assert {"detect", "classify", "recognize"} <= stages, stages
    for path in archives:
        loaded = load_npz(path, str(path))
        headers = npz_headers(path, str(path))
        assert list(headers) == list(loaded), path
        for name, array in loaded.items():
            assert (headers[name].shape, headers[name].dtype) == (array.shape, array.dtype)
        assert specs_of_headers(headers) == specs_of(loaded), path
