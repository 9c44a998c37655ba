"""`data.source: {format: image_folder, path: DIR}`: one subfolder per class, its name the label.

The rows have three columns: `image`, the file's bytes as stored (decoding, resizing and
normalising are the `image` preprocessing step's, so a request's image goes through the same
code); `label`, the name of the class folder the file sits in (the first folder under DIR;
deeper folders belong to the same class); and `path`, the file's path under DIR (training reads
only the spec's columns; batch scoring keeps it beside each prediction). Files whose suffix is not
an image's are skipped; a file that is not an image fails the read naming it. For batch scoring
(`labelled=False`) images may also sit directly in DIR: their label is null.
"""

from __future__ import annotations

import os
from pathlib import Path

from rayline.errors import DataError
from rayline.data.task_cpus import map_args, remote_args

__all__ = ["IMAGE_SUFFIXES", "IMAGE_COLUMN", "LABEL_COLUMN", "PATH_COLUMN", "image_files", "has_images", "sample_images",
           "read_image_folder", "image_folder_tables"]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
IMAGE_COLUMN, LABEL_COLUMN, PATH_COLUMN = "image", "label", "path"


def has_images(path: str) -> bool:
    """Whether a directory holds image files (anywhere under it)."""
    return any(p.is_file() and p.name.lower().endswith(IMAGE_SUFFIXES) for p in Path(path).rglob("*"))


def image_files(path: str, labelled: bool = True) -> list[tuple[str, str | None]]:
    """(file, class) of every image under `path`, sorted; DataError naming what is wrong. With
    `labelled=False` an image directly in `path` is allowed, with class None."""
    root = Path(path)
    if not root.is_dir():
        what = "a file" if root.exists() else "no such directory"
        raise DataError(f"data.source.path: an image_folder is a directory with one subfolder per class (got {path!r}: "
                        f"{what})")
    files, loose = [], []
    for file in sorted(root.rglob("*")):
        if not file.is_file() or not file.name.lower().endswith(IMAGE_SUFFIXES):
            continue
        parts = file.relative_to(root).parts
        if len(parts) < 2:
            if labelled:
                loose.append(file.name)
            else:
                files.append((str(file), None))
            continue
        files.append((str(file), parts[0]))
    if loose:
        raise DataError(f"data.source.path: images must sit in one subfolder per class, named after the class (got "
                        f"{loose[0]!r} directly in {path!r}; allowed: {path}/CLASS/{loose[0]})")
    if not files:
        raise DataError(f"data.source.path: no images in {path!r} (allowed: files ending in {', '.join(IMAGE_SUFFIXES)} "
                        "in one subfolder per class)")
    return files


def _check_image(data: bytes, file: str) -> None:
    """The header is an image's (cheap: nothing is decoded); a corrupt body fails where it is decoded."""
    import io

    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)):
            pass
    except (UnidentifiedImageError, OSError) as exc:
        raise DataError(f"{file}: not an image Pillow can read ({exc.__class__.__name__}; allowed: PNG, JPEG, GIF, "
                        "BMP, WebP, TIFF)") from None


def _table(pairs: list[tuple[str, str]], root: str):
    import pyarrow as pa

    images = []
    for file, _ in pairs:
        with open(file, "rb") as fh:
            data = fh.read()
        _check_image(data, file)
        images.append(data)
    return pa.table({IMAGE_COLUMN: pa.array(images, pa.binary()),
                     LABEL_COLUMN: pa.array([label for _, label in pairs], pa.string()),
                     PATH_COLUMN: pa.array([os.path.relpath(file, root) for file, _ in pairs], pa.string())})


def sample_images(path: str, rows: int, labelled: bool = True):
    """At most `rows` images as an Arrow table, taken in turn from each class (a sample that shows
    every class, for `rayline validate` and the schema checks)."""
    by_class: dict = {}
    for pair in image_files(path, labelled):
        by_class.setdefault(pair[1], []).append(pair)
    picked, queues = [], [list(reversed(v)) for v in by_class.values()]
    while len(picked) < rows and any(queues):
        for queue in queues:
            if queue and len(picked) < rows:
                picked.append(queue.pop())
    return _table(picked, path)


def image_folder_tables(path: str, labelled: bool = True, shuffled: bool = True, rows_per_table: int = 256) -> list:
    """The rows `read_image_folder` gives (same order, same columns), read in this process as Arrow
    tables of `rows_per_table` rows (data/in_process.py: a folder small enough for the driver)."""
    import random

    pairs = image_files(path, labelled)
    if shuffled:  # the permutation read_image_folder draws for its list of files
        random.Random(0).shuffle(pairs)
    return [_table(pairs[i:i + rows_per_table], path) for i in range(0, len(pairs), rows_per_table)]


class _Rows:
    """A picklable map_batches callable: Ray's binary-file rows (bytes, path) -> image, label."""

    def __init__(self, root: str):
        self.root = os.path.abspath(root)

    def __call__(self, table):
        import pyarrow as pa

        paths = table.column("path").to_pylist()
        data = table.column("bytes").to_pylist()
        labels, relative = [], []
        for file, raw in zip(paths, data):
            _check_image(raw, file)
            parts = Path(os.path.relpath(os.path.abspath(file), self.root)).parts
            labels.append(parts[0] if len(parts) > 1 else None)
            relative.append(os.path.join(*parts))
        return pa.table({IMAGE_COLUMN: pa.array(data, pa.binary()), LABEL_COLUMN: pa.array(labels, pa.string()),
                         PATH_COLUMN: pa.array(relative, pa.string())})


def read_image_folder(path: str, labelled: bool = True, shuffled: bool = True):
    """Every image as a Ray Dataset of (image, label, path) rows, read by Ray Data's binary reader
    in parallel (files many at a time, never all in the driver). `shuffled=False`: in path order
    (batch scoring's output follows its input)."""
    import random

    import ray.data

    files = [file for file, _ in image_files(path, labelled)]
    # Read in a fixed random order, not folder by folder: each block then mixes the classes, as
    # training needs (its local shuffle buffer spans a few batches, a block thousands of rows).
    # The split does not depend on it (it hashes each row's values).
    if shuffled:
        random.Random(0).shuffle(files)
    ds = ray.data.read_binary_files(files, include_paths=True, file_extensions=None, ray_remote_args=remote_args())
    return ds.map_batches(_Rows(path), batch_format="pyarrow", batch_size=256, **map_args())
