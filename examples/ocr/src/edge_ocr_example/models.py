"""Where the PP-OCR graphs come from: the pinned ``rapidocr-onnxruntime`` wheel, verified.

The wheel (pure Python, 14.9 MB) carries the three ONNX graphs. Installing it would pull
OpenCV and more, so this module never imports it. It takes the graphs from, in order:

1. an explicit wheel file (``wheel=`` or ``$EDGE_OCR_WHEEL``);
2. an installed ``rapidocr_onnxruntime`` package, found with ``importlib.util.find_spec``
   (which locates a top-level package without running it);
3. the wheel in the cache directory (``$EDGE_OCR_CACHE``, else
   ``$XDG_CACHE_HOME/edge-ocr``, else ``~/.cache/edge-ocr``), fetched on first use with
   ``python -m pip download --no-deps --only-binary=:all: rapidocr-onnxruntime==1.4.4``.

Whatever the source, every graph's sha256 must equal the pinned value, so all three routes
yield byte-identical graphs (and a downloaded wheel must match its own pinned hash).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Final

from edge_ocr_example.errors import ModelSourceError

__all__ = [
    "GRAPH_SHA256",
    "RAPIDOCR_VERSION",
    "WHEEL_FILENAME",
    "WHEEL_SHA256",
    "default_cache_dir",
    "fetch_wheel",
    "read_graph",
]

RAPIDOCR_VERSION: Final = "1.4.4"
"""The pinned rapidocr-onnxruntime release."""
WHEEL_FILENAME: Final = f"rapidocr_onnxruntime-{RAPIDOCR_VERSION}-py3-none-any.whl"
"""The wheel's file name on PyPI."""
WHEEL_SHA256: Final = "971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf"
"""sha256 of the pinned wheel file."""
GRAPH_SHA256: Final = {
    "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx": (
        "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9"
    ),
    "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx": (
        "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c"
    ),
    "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx": (
        "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b"
    ),
}
"""sha256 of each graph, keyed by its path inside the wheel."""

_MAX_GRAPH_BYTES: Final = 64 * 1024**2
_PIP_TIMEOUT_S: Final = 300


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def default_cache_dir() -> Path:
    """The directory that holds the downloaded wheel."""
    explicit = os.environ.get("EDGE_OCR_CACHE")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "edge-ocr"


def fetch_wheel(cache_dir: Path | None = None) -> Path:
    """Return the verified wheel in ``cache_dir``, downloading it with pip if absent.

    Raises:
        ModelSourceError: pip failed, or the file's sha256 is not the pinned one.

    """
    cache = cache_dir if cache_dir is not None else default_cache_dir()
    target = cache / WHEEL_FILENAME
    if target.is_file():
        actual = _file_sha256(target)
        if actual != WHEEL_SHA256:
            raise ModelSourceError(str(target), f"sha256 is not {WHEEL_SHA256}", actual)
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as scratch:
        command = [
            sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
            "--only-binary=:all:", "--dest", scratch, f"rapidocr-onnxruntime=={RAPIDOCR_VERSION}",
        ]  # fmt: skip
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=_PIP_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired:
            raise ModelSourceError("pip download", "timed out (s)", _PIP_TIMEOUT_S) from None
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise ModelSourceError("pip download", "failed", " | ".join(tail))
        fetched = Path(scratch) / WHEEL_FILENAME
        if not fetched.is_file():
            raise ModelSourceError(
                "pip download", "wheel not produced", sorted(os.listdir(scratch))
            )
        actual = _file_sha256(fetched)
        if actual != WHEEL_SHA256:
            raise ModelSourceError(str(fetched), f"sha256 is not {WHEEL_SHA256}", actual)
        os.replace(fetched, target)  # atomic: a concurrent reader sees all or nothing
    return target


def _checked(member: str, data: bytes, origin: str) -> bytes:
    actual = _sha256(data)
    if actual != GRAPH_SHA256[member]:
        raise ModelSourceError(origin, f"sha256 is not {GRAPH_SHA256[member]}", actual)
    return data


def _from_wheel(wheel: Path, member: str) -> bytes:
    try:
        with zipfile.ZipFile(wheel) as archive:
            info = archive.getinfo(member)
            if info.file_size > _MAX_GRAPH_BYTES:
                raise ModelSourceError(f"{wheel}!{member}", "larger than the limit", info.file_size)
            data = archive.read(info)
    except (KeyError, zipfile.BadZipFile, OSError) as exc:
        raise ModelSourceError(f"{wheel}!{member}", "cannot read", str(exc)) from None
    return _checked(member, data, f"{wheel}!{member}")


def _from_installed(member: str) -> bytes | None:
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        return None
    relative = Path(member).relative_to("rapidocr_onnxruntime")
    for location in spec.submodule_search_locations:
        candidate = Path(location) / relative
        if candidate.is_file():
            data = candidate.read_bytes()
            if _sha256(data) == GRAPH_SHA256[member]:
                return data
    return None  # another release installed: fall back to the pinned wheel


def read_graph(member: str, *, wheel: Path | None = None, cache_dir: Path | None = None) -> bytes:
    """Return the verified bytes of one graph (a key of :data:`GRAPH_SHA256`).

    Raises:
        ModelSourceError: unknown member, or no source yields bytes with the pinned sha256.

    """
    if member not in GRAPH_SHA256:
        raise ModelSourceError("member", "not a pinned PP-OCR graph", member)
    explicit = wheel if wheel is not None else os.environ.get("EDGE_OCR_WHEEL")
    if explicit:
        return _from_wheel(Path(explicit), member)
    installed = _from_installed(member)
    if installed is not None:
        return installed
    return _from_wheel(fetch_wheel(cache_dir), member)
