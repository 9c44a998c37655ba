"""Writes an image-folder dataset from scikit-learn's bundled digits: one PNG per sample in a
folder named after its class (0-9), upscaled from 8x8 to SIZE x SIZE with bilinear smoothing,
with seeded noise and a random shift of up to one pixel, so the files look like small scans
rather than the 8x8 grid. Nothing is downloaded.

    python pipelines/make_digit_images.py                  # -> pipelines/data/digit-images
    python pipelines/make_digit_images.py OUT --size 32 --copies 2

`pipelines/digits-images-cnn.yaml` trains on the default output.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

DEFAULT_OUT = Path(__file__).resolve().parent / "data" / "digit-images"


def make_digit_images(out: str | Path, *, size: int = 16, copies: int = 1, seed: int = 0, limit: int | None = None) -> int:
    """Write the images under `out`/CLASS/; returns how many were written. Deterministic for a seed."""
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    images, targets = digits.images, digits.target
    if limit is not None:
        images, targets = images[:limit], targets[:limit]
    rng = np.random.default_rng(seed)
    out = Path(out)
    for label in sorted(set(int(t) for t in targets)):
        (out / str(label)).mkdir(parents=True, exist_ok=True)
    written = 0
    for copy in range(copies):
        for index, (pixels, label) in enumerate(zip(images, targets)):
            grey = (pixels / 16.0 * 255.0).astype(np.float32)
            big = np.asarray(Image.fromarray(grey.astype(np.uint8)).resize((size, size), Image.BILINEAR), np.float32)
            dy, dx = rng.integers(-1, 2, size=2)
            big = np.roll(big, (int(dy), int(dx)), axis=(0, 1))
            big = np.clip(big + rng.normal(0.0, 12.0, big.shape), 0, 255).astype(np.uint8)
            path = out / str(int(label)) / f"{index:05d}-{copy}.png"
            tmp = path.with_suffix(".png.tmp")
            Image.fromarray(big).save(tmp, format="PNG")
            os.replace(tmp, path)  # never a half-written image
            written += 1
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default=str(DEFAULT_OUT))
    parser.add_argument("--size", type=int, default=16, help="height and width in pixels (default 16)")
    parser.add_argument("--copies", type=int, default=1, help="noisy copies of each digit (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    count = make_digit_images(args.out, size=args.size, copies=args.copies, seed=args.seed)
    print(f"wrote {count} images to {args.out}")


if __name__ == "__main__":
    main()
