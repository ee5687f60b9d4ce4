"""Input data of a derivation: the source bundle's examples and calibration batches.

Every array is fitted to a bucket's shape the same way: along each axis, cut to the
bucket's size or, when shorter, repeat the last slice (edge padding), so that no value
is invented. Calibration data comes from the bundle's own examples, from ``.npz`` files
(arrays named like the graph's inputs), or from images through a preprocessing function
given as ``module:function`` (an ``HxWx3`` uint8 RGB array -> ``{input: array}``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from edge_core.artifacts import VerifiedBundle
from edge_ort.derive.specs import DeriveInputError

__all__ = ["IMAGE_SUFFIXES", "Sample", "bundle_samples", "calibration_samples", "fit_array",
           "fit_sample"]

Sample = dict[str, npt.NDArray[Any]]
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp")
_MAX_CALIBRATION = 256


def fit_array(array: npt.NDArray[Any], shape: tuple[int, ...]) -> npt.NDArray[Any]:
    """``array`` cut or edge-padded to ``shape`` (same rank)."""
    if array.ndim != len(shape):
        raise DeriveInputError("inputs", f"rank {array.ndim} cannot fit the bucket's "
                               f"rank {len(shape)}", list(array.shape))
    cut = array[tuple(slice(0, n) for n in shape)]
    pad = [(0, max(0, n - have)) for n, have in zip(shape, cut.shape, strict=True)]
    if any(after for _, after in pad):
        cut = np.pad(cut, pad, mode="edge")
    return np.ascontiguousarray(cut)


def fit_sample(sample: Mapping[str, npt.NDArray[Any]],
               shapes: Mapping[str, tuple[int, ...]]) -> Sample:
    """Every input of ``sample`` fitted to ``shapes``; extra arrays are dropped."""
    missing = sorted(set(shapes) - set(sample))
    if missing:
        raise DeriveInputError("inputs", f"a sample lacks the graph input(s) {missing}",
                               sorted(sample))
    return {name: fit_array(np.asarray(sample[name]), shape) for name, shape in shapes.items()}


def _load_npz(path: Path, field: str) -> Sample:
    try:
        with np.load(path, allow_pickle=False) as data:
            return {name: np.asarray(data[name]) for name in data.files}
    except (OSError, ValueError) as exc:
        raise DeriveInputError(field, f"not a readable .npz file ({exc})", str(path)) from None


def bundle_samples(bundle: VerifiedBundle) -> list[tuple[str, Sample]]:
    """Every example input of ``bundle`` (shape-set examples, then ``example_inputs``)."""
    members: list[str] = [case.example_inputs for case in bundle.warmup_cases]
    first = bundle.manifest.metadata.example_inputs
    if first and first not in members:
        members.append(first)
    if not members:
        raise DeriveInputError("bundle.metadata.example_inputs", "the bundle has no example "
                               "inputs to derive from", bundle.component)
    return [(m, _load_npz(bundle.path(m), f"bundle.{m}")) for m in members]


def _preprocess(spec: str | None) -> Callable[[npt.NDArray[np.uint8]], Mapping[str, Any]]:
    if not spec or ":" not in spec:
        raise DeriveInputError("--preprocess", "images need a preprocessing function "
                               "module:function (HxWx3 uint8 -> {input: array})", spec)
    module, _, name = spec.partition(":")
    try:
        function = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise DeriveInputError("--preprocess", f"cannot be imported ({exc})", spec) from None
    if not callable(function):
        raise DeriveInputError("--preprocess", "is not callable", spec)
    return function  # type: ignore[no-any-return]


def _image(path: Path) -> npt.NDArray[np.uint8]:
    try:
        from PIL import Image
    except ImportError:
        raise DeriveInputError("--calibration", "reading images needs Pillow "
                               "(pip install pillow)", str(path)) from None
    try:
        with Image.open(path) as image:
            return np.asarray(image.convert("RGB"), dtype=np.uint8)
    except OSError as exc:
        raise DeriveInputError("--calibration", f"not a readable image ({exc})",
                               str(path)) from None


def calibration_samples(paths: list[Path], preprocess: str | None) -> Iterator[Sample]:
    """Samples from ``.npz`` files and images, files in directories in name order.

    Raises:
        DeriveInputError: a path that does not exist, no usable file, an image without
            ``preprocess``, or more than 256 files.
    """
    files: list[Path] = []
    for index, path in enumerate(paths):
        if path.is_dir():
            files.extend(sorted(p for p in path.iterdir()
                                if p.suffix.lower() in (".npz", *IMAGE_SUFFIXES)))
        elif path.is_file():
            files.append(path)
        else:
            raise DeriveInputError(f"--calibration[{index}]", "does not exist", str(path))
    if not files:
        raise DeriveInputError("--calibration", "holds no .npz or image file",
                               [str(p) for p in paths])
    if len(files) > _MAX_CALIBRATION:
        raise DeriveInputError("--calibration", f"at most {_MAX_CALIBRATION} files",
                               len(files))
    function = None
    for file in files:
        if file.suffix.lower() == ".npz":
            yield _load_npz(file, "--calibration")
            continue
        if function is None:
            function = _preprocess(preprocess)
        made = function(_image(file))
        if not isinstance(made, Mapping):
            raise DeriveInputError("--preprocess", "must return a mapping of input arrays",
                                   type(made).__name__)
        yield {str(k): np.asarray(v) for k, v in made.items()}
