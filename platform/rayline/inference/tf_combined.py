"""The tensorflow kinds for images and text (`cnn`, `text_cnn`, `transformer`), as the torch ones
(rayline/inference/torch_combined.py): one encoder per image or text feature, their outputs
concatenated with the tabular features and fed to one MLP head. Keras (tf-keras) functional layers:
augmentation is Keras' own random layers (RandomFlip; zero padding then RandomCrop), which change
images in training only (at inference RandomCrop centre-crops the padding away: the image as it is).
"""

from __future__ import annotations

import tensorflow as tf
import tf_keras as keras

__all__ = ["build_combined"]

_NEEDS = {"cnn": ("images", "an image feature", "`- image: {columns: [...], size: [H, W]}`"),
          "text_cnn": ("texts", "a text feature", "`- text: {columns: [...]}`"),
          "transformer": ("texts", "a text feature", "`- text: {columns: [...]}`")}


def _bn():
    # torch's BatchNorm2d momentum (0.1 of each batch): Keras' default (0.01 of each batch) left the
    # running statistics far behind on a small data set, and evaluation 0.43 accurate where training was not.
    return keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-5)


def _columns(start: int, stop: int):
    return keras.layers.Lambda(lambda x: x[:, start:stop])


def _image_encoder(x, segment: dict, widths, blocks: int):
    height, width, channels = (int(v) for v in segment["shape"])
    x = keras.layers.Reshape((height, width, channels))(x)
    augment = segment.get("augment") or {}
    if augment.get("flip"):
        x = keras.layers.RandomFlip("horizontal")(x)
    if augment.get("crop"):
        pad = int(augment["crop"])
        x = keras.layers.ZeroPadding2D(pad)(x)
        x = keras.layers.RandomCrop(height, width)(x)
    x = keras.layers.Conv2D(int(widths[0]), 3, padding="same", use_bias=False)(x)
    x = keras.layers.ReLU()(_bn()(x))
    c_in = int(widths[0])
    for stage, c_out in enumerate(int(w) for w in widths):
        for block in range(int(blocks)):
            stride = 2 if stage > 0 and block == 0 else 1
            y = keras.layers.Conv2D(c_out, 3, strides=stride, padding="same", use_bias=False)(x)
            y = keras.layers.ReLU()(_bn()(y))
            y = _bn()(keras.layers.Conv2D(c_out, 3, padding="same", use_bias=False)(y))
            shortcut = x
            if stride != 1 or c_in != c_out:
                shortcut = _bn()(
                    keras.layers.Conv2D(c_out, 1, strides=stride, use_bias=False)(x))
            x = keras.layers.ReLU()(keras.layers.Add()([y, shortcut]))
            c_in = c_out
    return keras.layers.GlobalAveragePooling2D()(x)


def _text_cnn(x, segment: dict, embedding_dim: int, filters: int, kernel_sizes):
    ids = keras.layers.Lambda(lambda t: tf.cast(t, tf.int32))(x)
    embedded = keras.layers.Embedding(int(segment["vocab_size"]), int(embedding_dim))(ids)
    sizes = [min(int(k), int(segment["length"])) for k in kernel_sizes]
    pooled = [keras.layers.GlobalMaxPooling1D()(keras.layers.Conv1D(int(filters), k, activation="relu")(embedded))
              for k in sizes]
    return pooled[0] if len(pooled) == 1 else keras.layers.Concatenate()(pooled)


class _PositionEmbedding(keras.layers.Layer):
    def __init__(self, length: int, width: int, **kwargs):
        super().__init__(**kwargs)
        self.length, self.width = length, width

    def build(self, shape):
        self.position = self.add_weight(name="position", shape=(1, self.length, self.width), initializer="zeros")

    def call(self, x):
        return x + tf.cast(self.position, x.dtype)


class _MaskedMean(keras.layers.Layer):
    """The mean over the non-padding positions (all of them for an empty text)."""

    def call(self, x, ids):
        keep = tf.cast(tf.not_equal(ids, 0), x.dtype)
        keep = tf.where(tf.reduce_sum(keep, axis=1, keepdims=True) > 0, keep, tf.ones_like(keep))
        return tf.reduce_sum(x * keep[:, :, None], axis=1) / tf.reduce_sum(keep, axis=1, keepdims=True)


def _transformer(x, segment: dict, width: int, heads: int, layers: int):
    ids = keras.layers.Lambda(lambda t: tf.cast(t, tf.int32))(x)
    h = keras.layers.Embedding(int(segment["vocab_size"]), int(width))(ids)
    h = _PositionEmbedding(int(segment["length"]), int(width))(h)
    mask = keras.layers.Lambda(lambda t: tf.cast(tf.not_equal(t, 0), tf.bool)[:, None, :])(ids)
    for _ in range(int(layers)):
        attended = keras.layers.MultiHeadAttention(int(heads), max(1, int(width) // int(heads)))(h, h, attention_mask=mask)
        h = keras.layers.LayerNormalization()(h + attended)
        dense = keras.layers.Dense(int(width))(keras.layers.Dense(2 * int(width), activation="relu")(h))
        h = keras.layers.LayerNormalization()(h + dense)
    return _MaskedMean()(h, ids)


def build_combined(kind: str, num_features: int, num_outputs: int, input_schema: dict | None = None, widths=(32, 64),
                   blocks: int = 1, embedding_dim: int = 64, filters: int = 64, kernel_sizes=(3, 4, 5), width: int = 64,
                   heads: int = 4, layers: int = 2, hidden_sizes=(128,), dropout: float = 0.0):
    wanted, what, step = _NEEDS[kind]
    if not (input_schema or {}).get(wanted):
        from rayline.errors import SpecError

        raise SpecError([f"model.kind: {kind} needs {what} (got none; allowed: add {step} to data.preprocess, "
                         "or model.kind: mlp)"])
    inputs = keras.Input(shape=(num_features,))
    parts = [_image_encoder(_columns(s["start"], s["stop"])(inputs), s, widths, blocks) for s in input_schema["images"]]
    for s in input_schema.get("texts", []):
        x = _columns(s["start"], s["stop"])(inputs)
        parts.append(_transformer(x, s, width, heads, layers) if kind == "transformer"
                     else _text_cnn(x, s, embedding_dim, filters, kernel_sizes))
    tabular = list(input_schema["tabular"])
    if tabular:
        parts.append(keras.layers.Lambda(lambda t: tf.gather(t, tabular, axis=1))(inputs))
    x = parts[0] if len(parts) == 1 else keras.layers.Concatenate()(parts)
    for hidden in hidden_sizes:
        x = keras.layers.Dense(int(hidden), activation="relu")(x)
        if dropout:
            x = keras.layers.Dropout(float(dropout))(x)
    return keras.Model(inputs, keras.layers.Dense(num_outputs)(x))
