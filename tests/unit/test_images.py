"""Image features without Ray: decoding, the image step (fitting, offline == online, errors), the
image folder source, and the torch `cnn` kind's pieces.

The end-to-end path (an image folder trained, registered and served over HTTP) is
tests/integration/test_images.py.
"""

import base64
import json

import numpy as np
import pandas as pd
import pytest

from rayline.data.images import MAX_IMAGE_PIXELS, decode_image, encode_png, image_bytes
from rayline.data.preprocess import FeatureInfo, FittedPreprocessing, LabelInfo, fit_preprocessing
from rayline.errors import DataError, SpecError
from rayline.spec.data_spec import DataSpec


def _png(seed, size=(6, 5), rgb=False):
    rng = np.random.default_rng(seed)
    shape = (*size, 3) if rgb else size
    return encode_png(rng.integers(0, 256, shape, dtype=np.uint8))


def _frame(n=40, rgb=False, size=(6, 5)):
    return pd.DataFrame({"photo": [_png(i, size, rgb) for i in range(n)], "x": np.arange(n, dtype=float),
                         "y": ["a", "b"] * (n // 2)})


def _steps(**image):
    spec = DataSpec.model_validate({"source": {"format": "csv", "path": "unused.csv"}, "label": "y",
                                    "preprocess": [{"image": {"columns": ["photo"], "size": [4, 3], **image}},
                                                   {"standard_scale": {"columns": ["x"]}}]})
    return spec.preprocess


def _fit(frame, **image):
    features = [FeatureInfo("photo", "binary"), FeatureInfo("x", "number")]
    return fit_preprocessing(frame[["photo", "x"]], features, LabelInfo("y", "classification", ["a", "b"]), _steps(**image))


def _decoded(frame, size, channels):
    return np.stack([decode_image(v, size, channels) for v in frame["photo"]])


def test_values_decode_from_bytes_base64_and_data_urls_alike():
    png = _png(1)
    text = base64.b64encode(png).decode()
    expected = decode_image(png, (6, 5), 1)
    assert expected.shape == (6, 5, 1) and 0.0 <= expected.min() and expected.max() <= 1.0
    for value in (text, f"data:image/png;base64,{text}", bytearray(png), memoryview(png)):
        np.testing.assert_array_equal(decode_image(value, (6, 5), 1), expected)
    # Resized and converted: an RGB image read as grey at another size.
    assert decode_image(_png(2, rgb=True), (3, 4), 1).shape == (3, 4, 1)
    assert decode_image(_png(2), (3, 4), 3).shape == (3, 4, 3)


@pytest.mark.parametrize("value, message", [
    ("not base64!!", "not base64"),
    (base64.b64encode(b"hello, not an image").decode(), "not an image Pillow can decode"),
    ("", "empty"),
    (b"", "empty"),
    (12, r"expected an encoded image as base64 text or bytes \(got int\)"),
    ("data:image/png,abc", "a data: URL that is not base64"),
])
def test_values_that_are_not_images_say_why(value, message):
    with pytest.raises(ValueError, match=message):
        decode_image(value, (4, 4), 1)


def test_a_decompression_bomb_is_refused_before_decoding():
    from PIL import Image
    import io

    buffer = io.BytesIO()
    side = int(MAX_IMAGE_PIXELS ** 0.5) + 10
    Image.new("L", (side, side)).save(buffer, format="PNG")  # a few KB that decode to > 40 M pixels
    assert len(buffer.getvalue()) < 1_000_000
    with pytest.raises(ValueError, match=f"more than {MAX_IMAGE_PIXELS:,}"):
        decode_image(buffer.getvalue(), (4, 4), 1)
    with pytest.raises(ValueError, match="larger than"):
        image_bytes(b"x" * (21 * 1024 * 1024))


@pytest.mark.parametrize("channels", [1, 3])
def test_per_channel_normalisation_is_fitted_on_the_train_pixels(channels):
    frame = _frame(rgb=channels == 3)
    fitted = _fit(frame, channels=channels)
    (image, scale) = fitted.steps
    pixels = _decoded(frame, (4, 3), channels).reshape(-1, channels)
    np.testing.assert_allclose(image.mean, pixels.mean(axis=0), rtol=1e-6)
    np.testing.assert_allclose(image.std, pixels.std(axis=0), rtol=1e-5)
    out = fitted.transform(frame)
    assert out.shape == (len(frame), 4 * 3 * channels + 1)
    assert fitted.output_columns[0] == "photo[0]" and fitted.output_columns[-1] == "x"
    block = out[:, :-1].reshape(len(frame), 4, 3, channels)
    np.testing.assert_allclose(block.reshape(-1, channels).mean(axis=0), 0.0, atol=1e-5)
    np.testing.assert_allclose(block.reshape(-1, channels).std(axis=0), 1.0, atol=1e-4)
    np.testing.assert_allclose(block, (_decoded(frame, (4, 3), channels) - image.mean) / image.std, rtol=1e-5, atol=1e-6)
    assert [f.kind for f in fitted.features] == ["image", "number"]


def test_normalize_none_keeps_pixels_in_unit_range():
    frame = _frame()
    out = _fit(frame, normalize="none", channels=1).transform(frame)
    np.testing.assert_array_equal(out[:, :12].reshape(len(frame), 4, 3, 1), _decoded(frame, (4, 3), 1))


def test_a_block_with_no_rows_of_a_split_transforms_to_no_rows_of_the_full_width():
    """A block of an image folder may hold none of a split's rows (the in-process data stage's last
    block of a few images): its transform is (0, width), not a reshape error."""
    frame = _frame()
    fitted = _fit(frame, channels=3)
    out = fitted.transform(frame.iloc[:0])
    assert out.shape == (0, fitted.transform(frame).shape[1]) == (0, 4 * 3 * 3 + 1)


def test_requests_encode_exactly_as_training_rows_and_the_state_round_trips():
    frame = _frame()
    fitted = _fit(frame, channels=3, augment={"flip": True, "crop": 1})
    offline = fitted.transform(frame)
    rows = [{"photo": base64.b64encode(v).decode(), "x": float(x)} for v, x in zip(frame["photo"], frame["x"])]
    np.testing.assert_array_equal(fitted.encode_records(rows), offline)
    np.testing.assert_array_equal(fitted.encode_records([[r["photo"], r["x"]] for r in rows]), offline)
    loaded = FittedPreprocessing.from_dict(json.loads(fitted.to_json()))
    np.testing.assert_array_equal(loaded.transform(frame), offline)
    schema = loaded.input_schema()
    assert schema["images"] == [{"name": "photo", "start": 0, "stop": 36, "type": "image", "shape": [4, 3, 3],
                                 "augment": {"flip": True, "crop": 1}}]
    assert schema["texts"] == [] and schema["tabular"] == [36] and schema["num_features"] == 37


def test_a_bad_request_image_names_the_row_and_feature():
    fitted = _fit(_frame())
    good = base64.b64encode(_png(0)).decode()
    with pytest.raises(DataError, match=r"^instances\[1\]\.photo: not a usable image: not base64"):
        fitted.encode_records([{"photo": good, "x": 1.0}, {"photo": "%%%", "x": 1.0}])
    with pytest.raises(DataError, match=r"^instances\[0\]\.photo: missing"):
        fitted.encode_records([{"photo": None, "x": 1.0}])
    frame = _frame()
    frame.loc[3, "photo"] = b"GIF89a broken"
    with pytest.raises(DataError, match=r"row 3 of photo: not a usable image"):
        fitted.transform(frame)


@pytest.mark.parametrize("preprocess, message", [
    ([{"image": {"columns": ["x"], "size": [4, 4]}}],
     "data.preprocess[0].image.columns[0]: needs an image column, encoded files as bytes or base64 text (got 'x', a number column"),
    ([{"image": {"columns": ["photo"], "size": [4, 4]}}, {"impute": {"columns": ["photo"], "strategy": "constant", "value": "a"}}],
     "data.preprocess[1].impute.columns[0]: column 'photo' was encoded by the image step data.preprocess[0]"),
    ([{"impute": {"columns": ["photo"], "strategy": "constant", "value": "a"}}, {"image": {"columns": ["photo"], "size": [4, 4]}}],
     "data.preprocess[0].impute.columns[0]: cannot fill 'photo', an image column"),
    ([{"standard_scale": {"columns": ["x"]}}],
     "data.features: binary columns ['photo'] need decoding (allowed: add `- image: {columns: ['photo'], size: [32, 32]}`"),
    ([{"image": {"columns": ["photo"], "size": [4, 4]}}, {"standard_scale": {"columns": ["photo"]}}],
     "data.preprocess[1].standard_scale.columns[0]: column 'photo' was encoded by the image step data.preprocess[0]"),
])
def test_misplaced_image_steps_are_named(preprocess, message):
    from rayline.data.steps import check_steps

    spec = DataSpec.model_validate({"source": {"format": "csv", "path": "unused.csv"}, "label": "y",
                                    "preprocess": preprocess})
    problems = check_steps(["photo", "x"], {"photo": "binary", "x": "number"}, spec.preprocess)
    assert any(p.startswith(message) for p in problems), problems


@pytest.mark.parametrize("image, message", [
    ({"columns": ["photo"], "size": [0, 4]}, "greater than or equal to 1"),
    ({"columns": ["photo"], "size": [4, 4], "channels": 2}, "Input should be 1 or 3"),
    ({"columns": ["photo"]}, "size"),
    ({"columns": ["photo"], "size": [4, 4], "augment": {"crop": -1}}, "greater than or equal to 0"),
    ({"columns": ["photo"], "size": [4, 4], "normalize": "global"}, "'per_channel' or 'none'"),
])
def test_bad_image_settings_are_spec_errors(image, message):
    from rayline.spec import parse_spec

    with pytest.raises(SpecError, match=message) as info:
        parse_spec({"name": "img", "data": {"source": {"format": "csv", "path": "unused.csv"}, "label": "y",
                                             "preprocess": [{"image": image}]},
                    "model": {"framework": "torch", "kind": "cnn"}})
    assert "data.preprocess[0].image" in str(info.value)


# ---------------------------------------------------------------- the image folder source


def _folder(root, classes=("cat", "dog"), per_class=3):
    for label in classes:
        (root / label).mkdir(parents=True)
        for i in range(per_class):
            (root / label / f"{i}.png").write_bytes(_png(hash((label, i)) % 1000))
    return root


def test_an_image_folder_reads_as_image_and_label_rows_from_every_class(tmp_path):
    from rayline.data.image_folder import image_files, sample_images

    root = _folder(tmp_path / "pets")
    (root / "cat" / "notes.txt").write_text("not an image: skipped")
    (root / "dog" / "deeper").mkdir()
    (root / "dog" / "deeper" / "9.png").write_bytes(_png(9))
    files = image_files(str(root))
    assert len(files) == 7 and {label for _, label in files} == {"cat", "dog"}
    assert (str(root / "dog" / "deeper" / "9.png"), "dog") in files
    sample = sample_images(str(root), 4).to_pandas()
    assert sorted(sample["label"]) == ["cat", "cat", "dog", "dog"]  # in turn from each class
    assert sample["image"][0] == (root / "cat" / "0.png").read_bytes()


def test_image_folder_mistakes_are_one_line_each(tmp_path):
    from rayline.data.image_folder import image_files, sample_images

    with pytest.raises(DataError, match="an image_folder is a directory with one subfolder per class .*no such directory"):
        image_files(str(tmp_path / "absent"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no images in"):
        image_files(str(tmp_path / "empty"))
    loose = _folder(tmp_path / "loose")
    (loose / "stray.png").write_bytes(_png(0))
    with pytest.raises(DataError, match=r"got 'stray.png' directly in .*allowed: .*/CLASS/stray.png"):
        image_files(str(loose))
    fake = _folder(tmp_path / "fake")
    (fake / "cat" / "fake.png").write_text("a text file with an image's name")
    with pytest.raises(DataError, match=r"fake\.png: not an image Pillow can read"):
        sample_images(str(fake), 100)


# ---------------------------------------------------------------- the torch cnn kind


def _schema(tabular=0):
    return {"num_features": 48 + tabular, "images": [{"name": "photo", "start": 0, "stop": 48, "type": "image",
                                                      "shape": [4, 4, 3], "augment": {"flip": True, "crop": 1}}],
            "tabular": list(range(48, 48 + tabular))}


def test_the_cnn_combines_images_with_tabular_features_and_augments_only_in_training():
    import torch
    from rayline.inference.torch_model import build_model

    arch = {"num_features": 50, "num_outputs": 3, "input_schema": _schema(tabular=2),
            "model": {"kind": "cnn", "params": {"widths": [4, 8], "hidden_sizes": [8]}}}
    model = build_model(arch)
    x = torch.randn(16, 50)
    assert model(x).shape == (16, 3)
    model.eval()
    first = model(x)
    torch.testing.assert_close(model(x), first)  # evaluation: no augmentation, the same answer every time
    changed = x.clone()
    changed[:, 49] += 5.0  # a tabular feature reaches the head
    assert not torch.allclose(model(changed), first)
    augment = model.encoders[0].augment
    augment.train()
    images = torch.arange(2 * 3 * 4 * 4, dtype=torch.float32).reshape(2, 3, 4, 4)
    torch.manual_seed(0)
    shifted = [augment(images) for _ in range(10)]
    assert any(not torch.equal(s, images) for s in shifted) and all(s.shape == images.shape for s in shifted)
    augment.eval()
    assert torch.equal(augment(images), images)


def test_builders_get_the_input_schema_only_when_they_take_it():
    from rayline.inference.arch import build_from_arch

    seen = {}

    def old(num_features, num_outputs, width=1):
        seen["old"] = (num_features, num_outputs, width)
        return "old"

    def new(num_features, num_outputs, input_schema=None):
        seen["new"] = input_schema
        return "new"

    arch = {"num_features": 48, "num_outputs": 2, "input_schema": _schema(), "model": {"kind": "mlp", "params": {"width": 3}}}
    assert build_from_arch(arch, old) == "old" and seen["old"] == (48, 2, 3)
    assert build_from_arch({**arch, "model": {"kind": "cnn", "params": {}}}, {"mlp": old, "cnn": new}) == "new"
    assert seen["new"] == _schema()


def test_a_cnn_without_an_image_feature_is_refused_naming_the_fix():
    from rayline.inference.torch_model import build_model

    with pytest.raises(SpecError, match="model.kind: cnn needs an image feature"):
        build_model({"num_features": 4, "num_outputs": 2, "input_schema": {"num_features": 4, "images": [], "tabular": [0, 1, 2, 3]},
                     "model": {"kind": "cnn", "params": {}}})
