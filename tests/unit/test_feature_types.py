"""`data.feature_types` and image file paths in tables, without Ray: the default step each type
implies (an image's size inferred from the first image), contradictions named, path columns told
apart from encoded images and read relative to the table, and `rayline validate`'s checks
(`load_spec` against the data: a missing file, a file that is no image, named with its row).

The data stage reading such a table on Ray and batch scoring it are in
tests/integration/test_images.py.
"""

import base64

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from rayline.data.feature_types import MAX_INFERRED_SIDE, with_default_steps
from rayline.data.image_paths import ReadImageFiles, base_of, looks_like_path, path_columns
from rayline.data.images import encode_png
from rayline.errors import DataError, SpecError
from rayline.spec.data_spec import DataSpec

KINDS = {"photo": "binary", "ticket": "string", "city": "string", "zip": "integer", "x": "number"}


def _data(feature_types=None, preprocess=None, features=None):
    return DataSpec.model_validate({"source": {"format": "csv", "path": "unused.csv"}, "label": "y",
                                    "feature_types": feature_types or {}, "preprocess": preprocess or [],
                                    **({"features": features} if features else {})})


def _png(height, width, rgb=False, seed=0):
    shape = (height, width, 3) if rgb else (height, width)
    return encode_png(np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8))


def _resolve(data, kinds=KINDS, first=None):
    calls = []

    def first_image(col):
        calls.append(col)
        return first or _png(20, 10)

    steps, problems = with_default_steps(data, list(kinds), dict(kinds), first_image)
    return [s.model_dump() for s in steps], problems, calls


def test_stated_types_get_their_default_steps_and_binary_columns_are_images():
    steps, problems, calls = _resolve(_data({"ticket": "text", "city": "categorical", "zip": "categorical",
                                             "x": "numeric"}))
    assert problems == []
    assert steps[0]["one_hot"]["columns"] == ["city", "zip"] and steps[0]["one_hot"]["handle_unknown"] == "ignore"
    assert steps[1]["text"]["columns"] == ["ticket"] and steps[1]["text"]["tokenizer"] == "word"
    # photo is binary: an image whether stated or not, sized from its first image (20 x 10, grayscale)
    assert steps[2]["image"]["columns"] == ["photo"]
    assert list(steps[2]["image"]["size"]) == [20, 10] and steps[2]["image"]["channels"] == 1
    assert calls == ["photo"] and len(steps) == 3  # numeric x: no step


def test_an_inferred_image_size_keeps_the_shape_under_the_largest_side():
    steps, _, _ = _resolve(_data({"photo": "image"}), {"photo": "binary"}, first=_png(300, 600, rgb=True))
    assert list(steps[0]["image"]["size"]) == [MAX_INFERRED_SIDE // 2, MAX_INFERRED_SIDE]
    assert steps[0]["image"]["channels"] == 3


def test_columns_a_step_names_keep_that_step_and_nothing_is_added():
    preprocess = [{"image": {"columns": ["photo"], "size": [8, 8]}}, {"text": {"columns": ["ticket"]}},
                  {"one_hot": {"columns": ["city"]}}]
    steps, problems, calls = _resolve(_data({"photo": "image", "ticket": "text", "city": "categorical"}, preprocess))
    assert problems == [] and calls == [] and len(steps) == 3


@pytest.mark.parametrize("types, preprocess, message", [
    ({"x": "text"}, [], "data.feature_types.x: a number column cannot be text (got 'text'; allowed: numeric)"),
    ({"photo": "categorical"}, [], "data.feature_types.photo: a binary column cannot be categorical (got 'categorical'; "
                                   "allowed: image)"),
    ({"ticket": "categorical"}, [{"text": {"columns": ["ticket"]}}],
     "data.feature_types.ticket: stated categorical but data.preprocess[0] is a text step, which makes it text"),
    ({"city": "text"}, [{"one_hot": {"columns": ["city"]}}],
     "data.feature_types.city: stated text but data.preprocess[0] is a one_hot step, which makes it categorical"),
    ({"nope": "text"}, [], "data.feature_types.nope: not a feature (got 'nope'; allowed: photo, ticket, city, zip, x)"),
])
def test_contradictions_are_named(types, preprocess, message):
    _, problems, _ = _resolve(_data(types, preprocess))
    assert any(p.startswith(message) for p in problems), problems


@pytest.mark.parametrize("raw, message", [
    ({"feature_types": {"a": "photo"}},
     "data.feature_types.a: Input should be 'numeric', 'categorical', 'text' or 'image' (got 'photo')"),
    ({"feature_types": {"y": "text"}}, "data.feature_types.y: the label is not a feature"),
    ({"features": ["a"], "feature_types": {"b": "text"}}, "data.feature_types.b: not in data.features (got 'b'; allowed: a)"),
])
def test_the_spec_names_a_bad_type_or_column(raw, message):
    from rayline.spec.loading import parse_spec

    spec = {"name": "t", "data": {"source": {"format": "csv", "path": "x.csv"}, "label": "y", **raw},
            "model": {"framework": "torch", "kind": "mlp"}}
    with pytest.raises(SpecError) as caught:
        parse_spec(spec)
    assert message in str(caught.value)


def test_paths_are_told_apart_from_encoded_images():
    encoded = base64.b64encode(_png(4, 4)).decode()
    assert looks_like_path("imgs/cat.png") and looks_like_path("/abs/x.jpeg") and looks_like_path("s3://b/k.png")
    assert not looks_like_path(encoded) and not looks_like_path("data:image/png;base64," + encoded)
    table = pa.table({"a": ["x/1.png", None, "x/2.png"], "b": [encoded, encoded, None], "n": [1, 2, 3]})
    assert path_columns(table, ["a", "b", "n"]) == ["a"]
    with pytest.raises(DataError, match=r"column 'm' mixes image file paths with encoded images \(row 1"):
        path_columns(pa.table({"m": ["x/1.png", encoded]}), ["m"])


def test_paths_are_read_relative_to_the_table_or_as_given(tmp_path):
    (tmp_path / "imgs").mkdir()
    first, second = _png(3, 3, seed=1), _png(3, 3, seed=2)
    (tmp_path / "imgs" / "a.png").write_bytes(first)
    (tmp_path / "b.png").write_bytes(second)
    (tmp_path / "t.csv").write_text("photo\n")
    base = base_of(str(tmp_path / "t.csv"))
    assert base == str(tmp_path) and base_of(str(tmp_path)) == str(tmp_path)
    assert base_of(str(tmp_path / "parts" / "*.csv")) == str(tmp_path / "parts")
    table = ReadImageFiles(["photo"], base)(pa.table({"photo": ["imgs/a.png", str(tmp_path / "b.png"), None,
                                                                f"file://{tmp_path}/imgs/a.png"]}))
    assert table.schema.field("photo").type == pa.binary()
    assert table.column("photo").to_pylist() == [first, second, None, first]
    with pytest.raises(DataError, match=r"column 'photo': no such image file 'imgs/none.png' \(looked for "):
        ReadImageFiles(["photo"], base)(pa.table({"photo": ["imgs/none.png"]}))


def _table_spec(tmp_path, rows, feature_types="{photo: image, shop: categorical}", steps=""):
    pd.DataFrame(rows).to_csv(tmp_path / "table.csv", index=False)
    (tmp_path / "spec.yaml").write_text(
        f"name: t\ndata:\n  source: {{format: csv, path: table.csv}}\n  label: y\n"
        f"  feature_types: {feature_types}\n{steps}"
        "model: {framework: torch, kind: cnn}\ntrain: {epochs: 1}\n")
    return tmp_path / "spec.yaml"


def _image_rows(tmp_path, n=12):
    (tmp_path / "imgs").mkdir(exist_ok=True)
    for i in range(n):
        (tmp_path / "imgs" / f"{i}.png").write_bytes(_png(12, 8, seed=i))
    return {"photo": [f"imgs/{i}.png" for i in range(n)], "shop": ["a", "b", "c"] * (n // 3), "y": [0, 1] * (n // 2)}


def test_validate_accepts_a_table_of_image_paths_with_stated_types(tmp_path):
    from rayline.data.schema_check import check_spec_against_data
    from rayline.spec import load_spec

    spec = load_spec(_table_spec(tmp_path, _image_rows(tmp_path)))  # raises on any problem
    assert check_spec_against_data(spec) == []


@pytest.mark.parametrize("bad, message", [
    ("imgs/missing.png", "data.source: column 'photo': no such image file 'imgs/missing.png'"),
    ("notes.txt", "data.source: column 'photo' row 3 (notes.txt): not a usable image: not an image Pillow can decode"),
])
def test_validate_names_the_file_that_is_not_an_image(tmp_path, bad, message):
    from rayline.spec import load_spec

    rows = _image_rows(tmp_path)
    (tmp_path / "notes.txt").write_text("not an image")
    rows["photo"][3] = bad
    with pytest.raises(SpecError) as caught:
        load_spec(_table_spec(tmp_path, rows))
    assert message in str(caught.value)


def test_validate_asks_for_the_type_of_an_unstated_string_column(tmp_path):
    from rayline.spec import load_spec

    with pytest.raises(SpecError) as caught:
        load_spec(_table_spec(tmp_path, _image_rows(tmp_path), feature_types="{photo: image}"))
    assert "string columns ['shop'] need encoding" in str(caught.value)
    assert "their types in data.feature_types" in str(caught.value)


def _columns_of(data):
    return [next(iter(step.model_dump().values()))["columns"] for step in data.preprocess]


def test_an_image_or_text_step_without_columns_takes_the_only_column_of_its_kind():
    from rayline.data.feature_types import with_step_columns

    # An image folder has one image column (binary) and the documented step names no columns.
    folder = _data(preprocess=[{"image": {"size": [32, 32], "channels": 1, "normalize": "per_channel"}}])
    filled, problems = with_step_columns(folder, ["image"], {"image": "binary"})
    assert problems == [] and _columns_of(filled) == [["image"]]
    # A table: the one binary column; text: the one string column no other step or stated type claims.
    table = _data(preprocess=[{"one_hot": {"columns": ["city"]}}, {"text": {}}, {"image": {"size": [8, 8]}}])
    filled, problems = with_step_columns(table, ["photo", "ticket", "city", "x"], KINDS)
    assert problems == [] and _columns_of(filled) == [["city"], ["ticket"], ["photo"]]
    # A stated type decides among several candidates.
    stated = _data(feature_types={"ticket": "text", "city": "categorical"}, preprocess=[{"text": {}}])
    assert _columns_of(with_step_columns(stated, list(KINDS), KINDS)[0]) == [["ticket"]]
    # Named columns are left as written; a spec without such a step is returned as it is.
    named = _data(preprocess=[{"text": {"columns": ["city"]}}])
    assert with_step_columns(named, list(KINDS), KINDS)[0] is named


def test_a_step_without_columns_where_the_data_has_none_or_several_names_them():
    from rayline.data.feature_types import with_step_columns

    several = _data(preprocess=[{"text": {}}])
    _, problems = with_step_columns(several, ["ticket", "city"], KINDS)
    assert problems == ["data.preprocess[0].text.columns: the data has 2 text columns; name the ones this step "
                        "encodes (got none; allowed: ticket, city)"]
    _, problems = with_step_columns(_data(preprocess=[{"image": {"size": [8, 8]}}]), ["x", "zip"], KINDS)
    assert problems == ["data.preprocess[0].image.columns: the data has no image column to default to (got none; "
                        "allowed: a list of columns: binary image files, or string columns data.feature_types states image)"]
