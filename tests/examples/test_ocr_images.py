"""Image files as users have them: formats, transparency, modes, orientation, bad files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from edge_ocr_example.images import ImageInputError, read_image, to_rgb


def _page() -> np.ndarray:
    """A 40 x 60 white page with a black 10 x 20 block at rows 5..14, columns 30..49."""
    page = np.full((40, 60, 3), 255, np.uint8)
    page[5:15, 30:50] = 0
    return page


@pytest.mark.parametrize("suffix", [".png", ".bmp", ".tiff", ".webp"])
def test_lossless_formats_read_back_exactly(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"page{suffix}"
    options = {"lossless": True} if suffix == ".webp" else {}
    Image.fromarray(_page()).save(path, **options)
    np.testing.assert_array_equal(read_image(path), _page())


def test_jpeg_reads_close_to_the_original(tmp_path: Path) -> None:
    path = tmp_path / "page.jpg"
    Image.fromarray(_page()).save(path, quality=95)
    pixels = read_image(path)
    assert pixels.shape == (40, 60, 3) and pixels.dtype == np.uint8
    assert np.abs(pixels.astype(int) - _page()).mean() < 4


def test_transparent_background_is_composited_on_white(tmp_path: Path) -> None:
    rgba = np.zeros((40, 60, 4), np.uint8)  # black everywhere, fully transparent
    rgba[5:15, 30:50, 3] = 255  # the text block is opaque black
    Image.fromarray(rgba, "RGBA").save(tmp_path / "a.png")
    np.testing.assert_array_equal(read_image(tmp_path / "a.png"), _page())
    la = np.zeros((40, 60, 2), np.uint8)
    la[5:15, 30:50, 1] = 255
    Image.fromarray(la, "LA").save(tmp_path / "la.png")
    np.testing.assert_array_equal(read_image(tmp_path / "la.png"), _page())


def test_half_transparent_ink_blends_with_white(tmp_path: Path) -> None:
    rgba = np.zeros((2, 2, 4), np.uint8)
    rgba[..., 3] = 128
    Image.fromarray(rgba, "RGBA").save(tmp_path / "half.png")
    assert np.abs(read_image(tmp_path / "half.png").astype(int) - 127).max() <= 1


def test_palette_grayscale_and_one_bit_become_rgb(tmp_path: Path) -> None:
    page = Image.fromarray(_page())
    page.convert("P").save(tmp_path / "p.png")
    page.convert("L").save(tmp_path / "l.png")
    page.convert("1").save(tmp_path / "one.png")
    for name in ("p.png", "l.png", "one.png"):
        np.testing.assert_array_equal(read_image(tmp_path / name), _page(), err_msg=name)


def test_palette_with_a_transparent_index_is_on_white(tmp_path: Path) -> None:
    image = Image.new("P", (4, 2), 0)
    image.putpalette([0, 0, 0, 10, 20, 30])
    image.putpixel((1, 0), 1)
    image.info["transparency"] = 0
    image.save(tmp_path / "pt.png", transparency=0)
    pixels = read_image(tmp_path / "pt.png")
    assert pixels[1, 0].tolist() == [255, 255, 255]
    assert pixels[0, 1].tolist() == [10, 20, 30]


def test_sixteen_bit_grayscale_keeps_its_range(tmp_path: Path) -> None:
    deep = np.full((40, 60), 65535, np.uint16)
    deep[5:15, 30:50] = 0
    deep[0, 0] = 32768  # mid grey
    Image.fromarray(deep).save(tmp_path / "deep.png")
    pixels = read_image(tmp_path / "deep.png")
    assert pixels[20, 10].tolist() == [255, 255, 255]
    assert pixels[10, 40].tolist() == [0, 0, 0]
    assert pixels[0, 0].tolist() == [128, 128, 128]


def test_twelve_bit_data_in_a_sixteen_bit_file_is_white_at_4095(tmp_path: Path) -> None:
    # a 12-bit scanner's page stored as 16-bit PNG: paper 4095, ink 0 (65535 as white
    # would make the paper 16 of 255 and the text all but invisible)
    deep = np.full((40, 60), 4095, np.uint16)
    deep[5:15, 30:50] = 0
    deep[0, 0] = 2048
    Image.fromarray(deep).save(tmp_path / "deep12.png")
    pixels = read_image(tmp_path / "deep12.png")
    assert pixels[20, 10].tolist() == [255, 255, 255]
    assert pixels[10, 40].tolist() == [0, 0, 0]
    assert pixels[0, 0].tolist() == [128, 128, 128]


def test_a_dark_sixteen_bit_image_is_not_stretched_past_its_bits(tmp_path: Path) -> None:
    deep = np.full((40, 60), 40000, np.uint16)  # 16-bit data: white stays 65535
    deep[5:15, 30:50] = 0
    Image.fromarray(deep).save(tmp_path / "dark16.png")
    pixels = read_image(tmp_path / "dark16.png")
    assert pixels[20, 10].tolist() == [156, 156, 156]
    assert pixels[10, 40].tolist() == [0, 0, 0]


def test_exif_orientation_is_honoured(tmp_path: Path) -> None:
    stored = np.ascontiguousarray(np.rot90(_page()))  # stored turned a quarter left
    image = Image.fromarray(stored)
    exif = image.getexif()
    exif[0x0112] = 6  # "rotate 90 CW to display"
    image.save(tmp_path / "phone.png", exif=exif.tobytes())
    np.testing.assert_array_equal(read_image(tmp_path / "phone.png"), _page())


def test_a_missing_file_names_itself(tmp_path: Path) -> None:
    path = tmp_path / "nope.png"
    with pytest.raises(ImageInputError, match=r"nope\.png: no such file") as caught:
        read_image(path)
    assert caught.value.field == str(path)


def test_a_directory_is_not_a_file(tmp_path: Path) -> None:
    with pytest.raises(ImageInputError, match="not a regular file"):
        read_image(tmp_path)


def test_an_empty_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty.png").write_bytes(b"")
    with pytest.raises(ImageInputError, match=r"empty\.png: the file is empty: '0 bytes'"):
        read_image(tmp_path / "empty.png")


def test_a_text_file_is_not_an_image(tmp_path: Path) -> None:
    (tmp_path / "notes.png").write_text("not an image at all\n")
    with pytest.raises(ImageInputError, match=r"notes\.png: not an image Pillow can read"):
        read_image(tmp_path / "notes.png")


@pytest.mark.parametrize("suffix", [".png", ".jpg"])
def test_a_truncated_file_is_refused(tmp_path: Path, suffix: str) -> None:
    noisy = np.random.default_rng(0).integers(0, 255, (200, 200, 3), dtype=np.uint8)
    whole = tmp_path / f"whole{suffix}"
    Image.fromarray(noisy).save(whole)
    cut = tmp_path / f"cut{suffix}"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    with pytest.raises(ImageInputError, match=rf"cut\{suffix}: truncated or corrupt image"):
        read_image(cut)


def test_a_decompression_bomb_is_refused_before_decoding(tmp_path: Path) -> None:
    Image.new("L", (3000, 3000), 255).save(tmp_path / "bomb.png")  # 9 Mpx in a few kB
    assert (tmp_path / "bomb.png").stat().st_size < 100_000
    with pytest.raises(ImageInputError, match=r"3000x3000 pixels exceeds the limit of 1000000"):
        read_image(tmp_path / "bomb.png", max_pixels=1_000_000)


def test_an_upright_rgb_image_is_read_as_its_own_pixels_into_an_array_of_its_own() -> None:
    pixels = np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3)
    image = Image.fromarray(pixels)
    exif = image.getexif()
    exif[0x0112] = 1  # upright: nothing to turn
    image.info["exif"] = exif.tobytes()
    rgb = to_rgb(image)
    assert np.array_equal(rgb, pixels) and rgb.flags.writeable
    rgb[0, 0] = 255  # the caller's image is not changed
    assert np.array_equal(np.asarray(image), pixels)
