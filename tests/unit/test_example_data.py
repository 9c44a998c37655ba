"""The example data the image and text reference pipelines train on is committed (so they validate
and run from a fresh clone, as the sklearn ones do) and is exactly what its seeded scripts write."""

import filecmp
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _script(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "pipelines" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_tickets_are_what_make_tickets_writes(tmp_path):
    _script("make_tickets").make_tickets(tmp_path / "tickets.csv")
    assert filecmp.cmp(tmp_path / "tickets.csv", ROOT / "pipelines" / "data" / "tickets.csv", shallow=False)


def test_the_committed_digit_images_are_what_make_digit_images_writes(tmp_path):
    assert _script("make_digit_images").make_digit_images(tmp_path) == 1797
    committed = ROOT / "pipelines" / "data" / "digit-images"
    made = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.png"))
    assert made == sorted(p.relative_to(committed) for p in committed.rglob("*.png"))
    assert all(filecmp.cmp(tmp_path / p, committed / p, shallow=False) for p in made)
