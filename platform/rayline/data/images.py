"""Image values -> pixel arrays: what the `image` preprocessing step decodes, in training (Ray Data
blocks), in batch scoring and on the replica (requests), with the same code.

A value is the encoded file (PNG, JPEG, ... anything Pillow opens): bytes as read from an image
folder, a Parquet binary column or a V2 BYTES tensor; or a base64 string (JSON requests, CSV
columns), optionally as a `data:image/...;base64,` URL. Decoded images are converted to the
step's channels (1: grayscale, 3: RGB), resized to its size and scaled to [0, 1].
"""

from __future__ import annotations

import base64
import binascii
import io
from typing import Callable

import numpy as np

from rayline.errors import DataError

__all__ = ["MAX_IMAGE_BYTES", "MAX_IMAGE_PIXELS", "image_bytes", "decode_image", "decode_images", "encode_png"]

MAX_IMAGE_BYTES = 20 * 1024 * 1024  # one encoded image; a request's body limit applies first on the replica
MAX_IMAGE_PIXELS = 40_000_000  # decompression bombs: a tiny file that decodes to gigabytes is refused


def image_bytes(value) -> bytes:
    """The encoded image in `value` (bytes, or base64 text); ValueError naming what is wrong."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
    elif isinstance(value, str):
        text = value.strip()
        if text.startswith("data:"):
            head, _, text = text.partition(",")
            if ";base64" not in head:
                raise ValueError("a data: URL that is not base64")
        if len(text) > MAX_IMAGE_BYTES * 4 // 3 + 4:
            raise ValueError(f"larger than {MAX_IMAGE_BYTES // (1024 * 1024)} MiB")
        try:
            data = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("not base64 (allowed: the image file's bytes as standard base64)") from None
    else:
        raise ValueError(f"expected an encoded image as base64 text or bytes (got {type(value).__name__})")
    if not data:
        raise ValueError("empty")
    if len(data) > MAX_IMAGE_BYTES:
        raise ValueError(f"larger than {MAX_IMAGE_BYTES // (1024 * 1024)} MiB")
    return data


def decode_image(value, size: tuple[int, int], channels: int) -> np.ndarray:
    """One image as a (height, width, channels) float32 array in [0, 1]; ValueError if it is not one."""
    from PIL import Image, UnidentifiedImageError

    data = image_bytes(value)
    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
            if width * height > MAX_IMAGE_PIXELS:
                raise ValueError(f"{width}x{height} pixels, more than {MAX_IMAGE_PIXELS:,}")
            image = image.convert("L" if channels == 1 else "RGB")
            if image.size != (size[1], size[0]):
                image = image.resize((size[1], size[0]), Image.BILINEAR)
            pixels = np.asarray(image, dtype=np.float32)
    except UnidentifiedImageError:
        raise ValueError("not an image Pillow can decode (allowed: PNG, JPEG, GIF, BMP, WebP, TIFF ...)") from None
    except (OSError, SyntaxError) as exc:  # truncated or corrupt files
        raise ValueError(f"a corrupt image ({exc})") from None
    pixels = pixels.reshape(size[0], size[1], channels)
    return pixels / 255.0


def decode_images(values, size: tuple[int, int], channels: int, column: str,
                  where: Callable[[int], str]) -> np.ndarray:
    """Every value of an image column as one (n, height, width, channels) float32 array; a
    DataError naming the column and the row (`where(i)`: "instances[3]." for requests) otherwise.
    A missing value is an error too: no step imputes images."""
    from rayline.data.values import is_missing

    values = values.to_numpy(dtype=object) if hasattr(values, "to_numpy") else values
    out = np.empty((len(values), size[0], size[1], channels), np.float32)
    for i, value in enumerate(values):
        prefix = where(i) or f"row {i} of "
        if is_missing(value):
            raise DataError(f"{prefix}{column}: missing (allowed: an encoded image, as base64 text or bytes)")
        try:
            out[i] = decode_image(value, size, channels)
        except ValueError as exc:
            raise DataError(f"{prefix}{column}: not a usable image: {exc}") from None
    return out


def encode_png(pixels: np.ndarray) -> bytes:
    """A (height, width) or (height, width, 3) uint8 array as PNG bytes (examples, tests)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.asarray(pixels, dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()
