"""Image files as users have them -> one ``H x W x 3`` uint8 RGB array, or a typed refusal.

Pillow reads PNG, JPEG, BMP, WebP and TIFF (and whatever else it knows). What comes out is
always RGB on white paper:

* EXIF orientation is honoured (a phone photo stored sideways is turned upright);
* transparency (RGBA, LA, PA, palette images with a transparent index) is composited on
  white, so black text on a transparent background stays black text on white;
* palette, 1-bit, grayscale, CMYK and YCbCr images are converted to RGB;
* 16-bit and 32-bit grayscale (``I;16``, ``I``) and float (``F``) images are scaled to
  0..255 rather than clipped: a 16-bit image from 0 to the white of the bits it uses
  (65535 for 16-bit data, 4095 for 12-bit data stored in 16 bits), a 32-bit integer one
  from 0 (or its minimum, when negative) to its maximum, a float one from its minimum to
  its maximum.

A file that cannot be read raises :class:`ImageInputError` naming the file and the reason:
missing, not a file, empty, not an image (or a format Pillow does not read), truncated or
corrupt, or larger than ``max_pixels`` (a decompression bomb: a few kilobytes that would
decode to gigabytes). The pixel check runs on the header, before anything is decoded.
"""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path
from typing import Final

import numpy as np
from PIL import ExifTags, Image, ImageOps, UnidentifiedImageError

from edge_ocr_example.errors import OcrError

__all__ = ["IMAGE_SUFFIXES", "MAX_PIXELS", "ImageInputError", "read_image", "to_rgb"]

MAX_PIXELS: Final = 64_000_000
"""Default largest image accepted, in pixels (an 8000 x 8000 page); more is refused."""

IMAGE_SUFFIXES: Final = (
    ".bmp", ".gif", ".jpeg", ".jpg", ".png", ".tif", ".tiff", ".webp",
)
"""File name suffixes taken as images when a directory is read (lower case)."""

_PAPER: Final = (255, 255, 255)
_TURNED: Final = frozenset(range(2, 9))
"""EXIF orientations other than upright (1): the image is flipped or turned."""


class ImageInputError(OcrError):
    """An input image file is missing, empty, not an image, truncated or too large.

    ``field`` is the file's path; ``reason`` says what is wrong with it.
    """


def _bit_depth_white(value: float) -> float:
    """The largest value of the fewest whole bits (at least 8) that hold ``value``."""
    bits = max(8, math.ceil(math.log2(max(value, 0.0) + 1.0)))
    return float(2**bits - 1)


def _scaled_to_bytes(image: Image.Image) -> Image.Image:
    """A 16/32-bit integer or float single-channel image, stretched to its range as ``L``."""
    values = np.asarray(image, dtype=np.float64)
    finite = values[np.isfinite(values)]
    low = float(finite.min()) if finite.size else 0.0
    high = float(finite.max()) if finite.size else 0.0
    if image.mode.startswith("I;16") or image.mode == "I":
        low = min(low, 0.0)
        if image.mode.startswith("I;16"):
            # White is the largest value of the bits the image uses: 65535 for 16-bit
            # data, 4095 for a 12-bit scanner's or camera's data in a 16-bit file (whose
            # pages would otherwise come out nearly black, their text unreadable).
            high = max(high, _bit_depth_white(high))
    span = high - low
    scaled = np.zeros(values.shape) if span <= 0 else (values - low) * (255.0 / span)
    pixels = np.clip(np.nan_to_num(scaled), 0, 255).round().astype(np.uint8)
    return Image.fromarray(pixels, mode="L")


def to_rgb(image: Image.Image) -> np.ndarray:
    """Return an opened image as ``H x W x 3`` uint8 RGB: upright, on white, 8-bit.

    Raises:
        ImageInputError: the image has no pixels.

    """
    if image.getexif().get(ExifTags.Base.Orientation, 1) in _TURNED:
        image = ImageOps.exif_transpose(image) or image  # else it would return a copy
    if image.width == 0 or image.height == 0:
        raise ImageInputError("image", "the image has no pixels", image.size)
    if image.mode == "P" or image.mode == "PA":
        image = image.convert("RGBA")
    elif image.mode in ("I", "F") or image.mode.startswith("I;16"):
        image = _scaled_to_bytes(image)
    if image.mode in ("RGBA", "LA", "La", "RGBa"):
        paper = Image.new("RGBA", image.size, (*_PAPER, 255))
        paper.alpha_composite(image.convert("RGBA"))
        image = paper
    rgb = image if image.mode == "RGB" else image.convert("RGB")  # RGB: it would copy
    return np.asarray(rgb, dtype=np.uint8).copy()


def read_image(path: str | os.PathLike[str], *, max_pixels: int = MAX_PIXELS) -> np.ndarray:
    """Read an image file as ``H x W x 3`` uint8 RGB (see the module docstring).

    Raises:
        ImageInputError: the file is missing, not a regular file, empty, not an image,
            truncated or corrupt, or has more than ``max_pixels`` pixels. ``field`` is the
            path as given.

    """
    name = os.fspath(path)
    file = Path(name)
    if not file.exists():
        raise ImageInputError(name, "no such file", name)
    if not file.is_file():
        raise ImageInputError(name, "not a regular file", name)
    size = file.stat().st_size
    if size == 0:
        raise ImageInputError(name, "the file is empty", "0 bytes")
    try:
        with warnings.catch_warnings():
            # Pillow only warns between its own limit and twice it; refuse on our limit.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(file) as image:
                pixels = image.width * image.height
                if pixels > max_pixels:
                    raise ImageInputError(
                        name,
                        f"image of {image.width}x{image.height} pixels exceeds the limit of "
                        f"{max_pixels} pixels (decompression bomb?)",
                        pixels,
                    )
                image.load()
                return to_rgb(image)
    except ImageInputError:
        raise
    except Image.DecompressionBombError as exc:
        raise ImageInputError(name, "decompression bomb refused by Pillow", str(exc)) from exc
    except PermissionError as exc:
        raise ImageInputError(name, "the file cannot be read", str(exc)) from exc
    except UnidentifiedImageError as exc:
        raise ImageInputError(name, "not an image Pillow can read", f"{size} bytes") from exc
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        # Pillow reports truncated data as OSError ("image file is truncated") and broken
        # headers as SyntaxError / ValueError.
        raise ImageInputError(name, "truncated or corrupt image", str(exc)) from exc
