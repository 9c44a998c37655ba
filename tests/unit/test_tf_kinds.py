"""The tensorflow kinds for images and text (rayline/inference/tf_combined.py): built from an arch
as training and serving build them, tabular features reaching the head, augmentation in training
mode only, an all-padding text answered, and a kind without its feature refused."""

import os

import numpy as np
import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
import tensorflow as tf  # noqa: E402 - a declared dependency (rayline[tensorflow], in .[all]): imported plainly, never skipped

IMAGES = {"num_features": 50, "images": [{"name": "photo", "start": 0, "stop": 48, "type": "image", "shape": [4, 4, 3],
                                          "augment": {"flip": True, "crop": 1}}], "texts": [], "tabular": [48, 49]}
TEXTS = {"num_features": 9, "images": [], "texts": [{"name": "text", "start": 0, "stop": 8, "type": "text", "length": 8,
                                                     "vocab_size": 30}], "tabular": [8]}


def _build(schema, kind, params, outputs=3):
    from rayline.inference.tensorflow_model import build_model

    tf.keras.utils.set_random_seed(0)
    return build_model({"num_features": schema["num_features"], "num_outputs": outputs, "input_schema": schema,
                        "model": {"kind": kind, "params": params}})


def test_the_cnn_augments_in_training_only_and_reads_the_tabular_features():
    model = _build(IMAGES, "cnn", {"widths": [4, 8], "hidden_sizes": [8]})
    x = np.random.default_rng(0).normal(size=(6, 50)).astype("float32")
    first = model(x, training=False).numpy()
    np.testing.assert_array_equal(model(x, training=False).numpy(), first)  # inference: the image as it is
    shifted = [model(x, training=True).numpy() for _ in range(4)]
    assert any(not np.allclose(s, shifted[0]) for s in shifted[1:])  # random flips and crops while training
    changed = x.copy()
    changed[:, 49] += 5.0
    assert not np.allclose(model(changed, training=False).numpy(), first)


@pytest.mark.parametrize("kind, params", [("text_cnn", {"embedding_dim": 8, "filters": 4, "kernel_sizes": [2, 3]}),
                                          ("transformer", {"width": 8, "heads": 2, "layers": 1})])
def test_text_kinds_read_the_tokens(kind, params):
    model = _build(TEXTS, kind, params, outputs=4)
    ids = np.array([[3, 4, 5, 0, 0, 0, 0, 0, 2.0], [0] * 9], dtype="float32")
    out = model(ids, training=False).numpy()
    assert out.shape == (2, 4) and np.isfinite(out).all()  # an all-padding text answers too
    other = ids.copy()
    other[0, 1] = 11
    assert not np.allclose(model(other, training=False).numpy()[0], out[0])


def test_a_kind_without_its_feature_is_refused():
    from rayline.errors import SpecError

    with pytest.raises(SpecError, match="model.kind: text_cnn needs a text feature"):
        _build(IMAGES, "text_cnn", {})
