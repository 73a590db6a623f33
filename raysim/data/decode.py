"""Decode encoded images (bytes or files) into one uint8 (N, H, W, C) array with Pillow."""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import psutil
from PIL import Image

from raysim.data.source import one_line
from raysim.errors import RaysimError

_GREY_MODES = {"1", "L", "LA", "La", "I", "I;16", "I;16L", "I;16B", "F"}


def _to_array(im: Image.Image, image_size: int | None) -> np.ndarray:
    if image_size is not None and im.format == "JPEG":
        im.draft("RGB" if im.mode != "L" else "L", (image_size, image_size))  # fast DCT downscale
    grey = im.mode in _GREY_MODES
    im = im.convert("L" if grey else "RGB")
    if image_size is not None and im.size != (image_size, image_size):
        im = im.resize((image_size, image_size), Image.Resampling.BILINEAR)
    return np.asarray(im, dtype=np.uint8)


def decode_images(
    items: Sequence[bytes | str | Path],
    image_size: int | None,
    describe: Callable[[int], str],
    what: str,
) -> np.ndarray:
    """Decode every item (encoded bytes, or a path to an image file).

    Grey images stay one channel unless any image is colour, in which case all
    become RGB.  With ``image_size`` every image is resized to
    image_size x image_size (bilinear, aspect ratio not kept); without it all
    images must share one square size.  ``describe(i)`` names item i in errors,
    ``what`` names the dataset/split.
    """
    if image_size is not None:
        check_memory(len(items), image_size, 1, what)
    arrays: list[np.ndarray] = []
    any_colour = False
    first_shape: tuple[int, int] | None = None
    for i, item in enumerate(items):
        try:
            src = io.BytesIO(item) if isinstance(item, (bytes, bytearray, memoryview)) else item
            with Image.open(src) as im:
                a = _to_array(im, image_size)
        except MemoryError:
            raise RaysimError(
                f"{what}: out of memory decoding image {describe(i)} of {len(items)}"
                + (
                    f" at dataset.image_size={image_size}: give a smaller dataset.image_size"
                    if image_size
                    else ": set dataset.image_size=N to shrink the images, or use a machine with more memory"
                )
            ) from None
        except Exception as exc:  # noqa: BLE001 - any decoder failure becomes one line
            raise RaysimError(
                f"{what}: cannot decode image {describe(i)} ({one_line(exc, 120)}): remove or replace that file"
            ) from None
        hw = a.shape[:2]
        if first_shape is None:
            first_shape = hw
            if image_size is None and hw[0] != hw[1]:
                raise RaysimError(
                    f"{what}: image {describe(i)} is {hw[1]}x{hw[0]}, not square: "
                    f"set dataset.image_size=N to resize all images to NxN"
                )
        elif hw != first_shape:
            raise RaysimError(
                f"{what}: images differ in size ({describe(0)} is {first_shape[1]}x{first_shape[0]}, "
                f"{describe(i)} is {hw[1]}x{hw[0]}): set dataset.image_size=N to resize all images to NxN"
            )
        any_colour = any_colour or a.ndim == 3
        arrays.append(a)
    if not arrays:
        raise RaysimError(f"{what}: no images found: add images or point dataset.root at the right folder")
    h, w = first_shape
    channels = 3 if any_colour else 1
    out = np.empty((len(arrays), h, w, channels), dtype=np.uint8)
    for i, a in enumerate(arrays):
        out[i] = a[..., None] if a.ndim == 2 else a
    return out


def check_memory(count: int, image_size: int, channels: int, what: str) -> None:
    """Refuse, before decoding, `count` images at image_size x image_size that cannot fit in the
    memory free now (the decoded images and the array they are gathered into: twice the array)."""

    need = 2 * count * image_size * image_size * channels
    free = psutil.virtual_memory().available
    if need > free:
        raise RaysimError(
            f"{what}: {count} images at dataset.image_size={image_size} need at least {need / 1e9:.3g} GB of "
            f"memory, more than the {free / 1e9:.3g} GB free: give a smaller dataset.image_size (the papers use "
            f"28 to 64), or unset it"
        )


def resize_array(x: np.ndarray, image_size: int | None) -> np.ndarray:
    """Resize an already-decoded uint8 (N, H, W, C) array to image_size (no-op when None or equal)."""
    if image_size is None or (x.shape[1] == image_size and x.shape[2] == image_size):
        return x
    check_memory(x.shape[0], image_size, x.shape[3], "the dataset")
    out = np.empty((x.shape[0], image_size, image_size, x.shape[3]), dtype=np.uint8)
    for i in range(x.shape[0]):
        img = x[i, :, :, 0] if x.shape[3] == 1 else x[i]
        r = np.asarray(Image.fromarray(img).resize((image_size, image_size), Image.Resampling.BILINEAR))
        out[i] = r[..., None] if r.ndim == 2 else r
    return out
