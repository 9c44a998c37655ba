"""A Keras (tf-keras, Keras 2) model: built from its arch and loaded for prediction in fp32."""

from __future__ import annotations

import os
import sys

import numpy as np

from rayline.inference.arch import build_from_arch, read_arch
from rayline.inference.outputs import softmax

__all__ = ["WEIGHTS_FILE", "ENV", "PREDICT_BATCH", "BUILDERS", "use_legacy_keras", "import_tensorflow", "build_mlp",
           "build_model", "emits_probabilities", "load_npz", "outputs", "load"]

WEIGHTS_FILE = "weights.npz"
ENV = {"TF_USE_LEGACY_KERAS": "1"}  # tf.keras must mean tf-keras: set before tensorflow is imported
PREDICT_BATCH = 8192  # rows per model call when predicting (training evaluates in the same chunks)


def use_legacy_keras() -> None:
    """tf.keras must mean tf-keras (Keras 2); set before tensorflow is imported."""
    os.environ.update(ENV)


def import_tensorflow():
    """TensorFlow (with tf.keras meaning tf-keras), imported and its devices listed with the absl lines
    both print on fd 2 kept in rayline's log (logger "rayline.tensorflow"), not on the terminal:
    rayline/inference/native_stderr.py. Once per process; later calls return the module."""
    use_legacy_keras()
    if "tensorflow" in sys.modules and "tf_keras" in sys.modules:
        return sys.modules["tensorflow"]
    from rayline.inference.native_stderr import native_stderr_to_log

    with native_stderr_to_log("rayline.tensorflow", "tensorflow"):
        import tensorflow as tf
        import tf_keras  # noqa: F401 - imports TensorFlow's C++ side again, printing the same lines

        tf.config.list_physical_devices()  # where "failed call to cuInit" is printed on a machine without a GPU
    return tf


def build_mlp(num_features: int, num_outputs: int, hidden_sizes=(128, 64), dropout: float = 0.0):
    """Dense+ReLU(+Dropout) layers and a linear output layer, as torch_model.build_mlp."""
    import tf_keras as keras

    layers: list = [keras.Input(shape=(num_features,))]
    for size in hidden_sizes:
        layers.append(keras.layers.Dense(int(size), activation="relu"))
        if dropout:
            layers.append(keras.layers.Dropout(float(dropout)))
    layers.append(keras.layers.Dense(num_outputs))
    return keras.Sequential(layers)


def _combined(kind: str):
    def build(num_features: int, num_outputs: int, input_schema: dict | None = None, **params):
        from rayline.inference.tf_combined import build_combined

        return build_combined(kind, num_features, num_outputs, input_schema=input_schema, **params)

    build.__name__ = f"build_{kind}"
    return build


# model.kind -> builder (frameworks.BACKENDS["tensorflow"].kinds names each one's params)
BUILDERS = {"mlp": build_mlp, "cnn": _combined("cnn"), "text_cnn": _combined("text_cnn"),
            "transformer": _combined("transformer")}


def build_model(arch: dict):
    """Build the model of `arch` (call inside a strategy scope when training) with its variables."""
    import tensorflow as tf
    import tf_keras as keras

    from rayline.errors import SpecError

    model_spec = arch["model"]
    model = build_from_arch(arch, BUILDERS)
    if not isinstance(model, keras.Model):
        raise SpecError(
            [f"model.import: {model_spec.get('import')} returned {type(model).__name__} (allowed: a Keras model (tf_keras.Model))"]
        )
    out = model(tf.zeros((1, arch["num_features"]), tf.float32), training=False)  # creates the variables
    width = int(np.prod(out.shape[1:])) if len(out.shape) > 1 else 1
    if width != arch["num_outputs"]:
        raise SpecError(
            [f"model.import: {model_spec.get('import')} outputs {width} values per row "
             f"(allowed: {arch['num_outputs']}, one per class, or 1 for regression)"]
        )
    return model


def emits_probabilities(model) -> bool:
    """Whether the model's last layer already applies softmax (else its outputs are logits)."""
    import tf_keras as keras

    if not getattr(model, "layers", None):
        return False
    last = model.layers[-1]
    if isinstance(last, keras.layers.Softmax):
        return True
    return getattr(last, "activation", None) is keras.activations.softmax


def load_npz(path: str) -> list[np.ndarray]:
    with np.load(path) as data:
        return [data[f"arr_{i}"] for i in range(len(data.files))]


def outputs(raw: np.ndarray, classification: bool, probabilities: bool) -> np.ndarray:
    if not classification:
        return raw.reshape(-1)
    raw = raw.reshape(len(raw), -1)
    if probabilities:
        return raw / np.clip(raw.sum(axis=1, keepdims=True), 1e-12, None)
    return softmax(raw)


def load(model_dir: str, meta: dict):
    tf = import_tensorflow()

    arch = read_arch(model_dir)
    model = build_model(arch)
    model.set_weights(load_npz(os.path.join(model_dir, WEIGHTS_FILE)))
    classification = meta["task"] == "classification"
    probabilities = classification and emits_probabilities(model)
    num_features = arch["num_features"]

    @tf.function(input_signature=[tf.TensorSpec([None, num_features], tf.float32)])
    def infer(x):
        return model(x, training=False)

    def predict(features: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(features, dtype=np.float32).reshape(len(features), num_features)
        if not len(x):
            return outputs(np.zeros((0, arch["num_outputs"]), np.float32), classification, probabilities)
        raw = np.concatenate([infer(tf.constant(x[i:i + PREDICT_BATCH])).numpy() for i in range(0, len(x), PREDICT_BATCH)])
        return outputs(raw, classification, probabilities)

    return predict
