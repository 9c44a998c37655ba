"""TensorFlow backend: Ray Train TensorflowTrainer with MultiWorkerMirroredStrategy workers
(MirroredStrategy for a single worker with several GPUs; rayline/train/tf_steps.py).

Models are tf-keras (Keras 2) models: Keras 3's `model.fit` is broken under
MultiWorkerMirroredStrategy (keras-team/keras#20585, ray-project/ray#47464), so the
workers and serving replicas run with TF_USE_LEGACY_KERAS=1, and training is a custom
loop (`strategy.run` of one tf.function step, tf_steps.TfSteps) rather than `model.fit`: that gives the
same epochs, per-worker batches, shuffling, optimizer semantics, validation and
checkpoints as the torch backend.

A model (built-in `mlp` or a `model.import` callable) maps features to logits, like the
torch backend's; a classifier whose last layer already applies softmax is detected and
its outputs are used as probabilities. The saved model directory holds `weights.npz`
(`model.get_weights()`), `optimizer.npz` (optimizer variables, for resume) and
`arch.json` (how to rebuild the model).
"""

from __future__ import annotations

import json
import os

import numpy as np

from rayline.train.backend import Backend, Predict, build_from_arch
from rayline.train.loop import (EpochReporter, Throughput, combine_metrics, eval_chunks, own_valid_rows, sha256_of,
                                with_last)
from rayline.train.metrics import MetricPartials, softmax
from rayline.train.probe import probe_features, write_probe
from rayline.train.tf_steps import TfSteps, make_strategy

__all__ = ["TensorflowBackend", "BACKEND", "build_mlp"]

_WEIGHTS = "weights.npz"
_OPTIMIZER = "optimizer.npz"
_ARCH = "arch.json"
_ENV = {"TF_USE_LEGACY_KERAS": "1"}
_PREDICT_BATCH = 8192


def _use_legacy_keras() -> None:
    """tf.keras must mean tf-keras (Keras 2); set before tensorflow is imported."""
    os.environ.update(_ENV)


def build_mlp(num_features: int, num_outputs: int, hidden_sizes=(128, 64), dropout: float = 0.0):
    """Dense+ReLU(+Dropout) layers and a linear output layer, as torch_backend.build_mlp."""
    import tf_keras as keras

    layers: list = [keras.Input(shape=(num_features,))]
    for size in hidden_sizes:
        layers.append(keras.layers.Dense(int(size), activation="relu"))
        if dropout:
            layers.append(keras.layers.Dropout(float(dropout)))
    layers.append(keras.layers.Dense(num_outputs))
    return keras.Sequential(layers)


def _build(arch: dict):
    """Build the model of `arch` (call inside a strategy scope when training) with its variables."""
    import tensorflow as tf
    import tf_keras as keras

    from rayline.errors import SpecError

    model_spec = arch["model"]
    model = build_from_arch(arch, build_mlp)
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


def _emits_probabilities(model) -> bool:
    """Whether the model's last layer already applies softmax (else its outputs are logits)."""
    import tf_keras as keras

    if not getattr(model, "layers", None):
        return False
    last = model.layers[-1]
    if isinstance(last, keras.layers.Softmax):
        return True
    return getattr(last, "activation", None) is keras.activations.softmax


def _optimizer(spec: dict):
    """The spec's optimizer; weight_decay is L2 on the gradients for adam and sgd (as torch), decoupled for adamw."""
    import tf_keras as keras

    name = spec["name"]
    if name == "sgd":
        return keras.optimizers.SGD(learning_rate=spec["lr"], momentum=spec["momentum"])
    if name == "adamw":
        return keras.optimizers.AdamW(learning_rate=spec["lr"], weight_decay=spec["weight_decay"], epsilon=1e-8)
    return keras.optimizers.Adam(learning_rate=spec["lr"], epsilon=1e-8)




def _load_npz(path: str) -> list[np.ndarray]:
    with np.load(path) as data:
        return [data[f"arr_{i}"] for i in range(len(data.files))]


def _outputs(raw: np.ndarray, classification: bool, probabilities: bool) -> np.ndarray:
    if not classification:
        return raw.reshape(-1)
    raw = raw.reshape(len(raw), -1)
    if probabilities:
        return raw / np.clip(raw.sum(axis=1, keepdims=True), 1e-12, None)
    return softmax(raw)


class TensorflowBackend(Backend):
    name = "tensorflow"

    def train_loop(self, config: dict) -> None:
        _use_legacy_keras()
        import ray.train
        import tensorflow as tf

        # Threads first: both settings only apply before TF's runtime starts.
        tf.config.threading.set_intra_op_parallelism_threads(config["threads"])
        tf.config.threading.set_inter_op_parallelism_threads(max(2, config["threads"]))
        # Before anything starts TF's runtime (MWMS configures its collectives at startup):
        # MultiWorkerMirroredStrategy across the workers; MirroredStrategy for one worker with
        # several GPUs (rayline/train/tf_steps.py).
        strategy = make_strategy(ray.train.get_context().get_world_size())
        import tf_keras as keras

        keras.utils.set_random_seed(config["seed"])
        # The optimizer's hyperparameters (learning rate, momentum) are not among the variables
        # restored below: a run restarted with a new config (PBT's explore) trains with its own.
        reporter = EpochReporter(config.get("initial_checkpoint"))
        classification = config["task"] == "classification"
        arch = config["arch"]
        num_features = arch["num_features"]
        opt_spec = config["optimizer"]
        l2 = 0.0 if opt_spec["name"] == "adamw" else float(opt_spec["weight_decay"])

        precision = config.get("precision", "fp32")
        accumulation = max(1, int(config.get("grad_accumulation", 1)))
        if precision != "fp32":
            # Layers built from here on compute in bf16/fp16 and keep fp32 variables: the saved
            # weights are fp32, and serving builds the model without a policy.
            keras.mixed_precision.set_global_policy("mixed_bfloat16" if precision == "bf16" else "mixed_float16")
        loss_scaling = precision == "fp16"

        with strategy.scope():
            # Variables are created here: MWMS broadcasts rank 0's initial values.
            model = _build(arch)
            optimizer = _optimizer(opt_spec)
            if loss_scaling:  # dynamic loss scale: small fp16 gradients would flush to zero
                optimizer = keras.mixed_precision.LossScaleOptimizer(optimizer)
            optimizer.build(model.trainable_variables)
            if reporter.restore_model_dir:
                model.set_weights(_load_npz(os.path.join(reporter.restore_model_dir, _WEIGHTS)))
                saved = os.path.join(reporter.restore_model_dir, _OPTIMIZER)
                values = _load_npz(saved) if os.path.exists(saved) else []
                variables = list(optimizer.variables)
                if len(values) == len(variables) and all(v.shape == tuple(a.shape) for v, a in zip(variables, values)):
                    for var, value in zip(variables, values):
                        var.assign(value)
        # What this attempt trains from, read from the live variables (every rank reads: reads can be
        # collectives): the weights in model.get_weights() order, the optimizer's variables (iterations
        # first) in their order; as weights.npz and optimizer.npz hold them.
        reporter.record_start({
            "weights_sha256": sha256_of(np.ascontiguousarray(w).tobytes() for w in model.get_weights()),
            "optimizer_sha256": sha256_of(np.ascontiguousarray(np.asarray(v.numpy())).tobytes()
                                          for v in optimizer.variables),
        })
        probabilities = classification and _emits_probabilities(model)
        label_dtype = np.int64 if classification else np.float32
        steps = TfSteps(strategy, model, optimizer, world_size=reporter.world_size, num_features=num_features,
                        classification=classification, probabilities=probabilities, l2=l2,
                        accumulation=accumulation, loss_scaling=loss_scaling)

        @tf.function(input_signature=[tf.TensorSpec([None, num_features], tf.float32)])
        def infer(x):
            return tf.cast(model(x, training=False), tf.float32)

        train_shard = ray.train.get_dataset_shard("train")
        # This worker's share of "valid"; the metrics combine every worker's (loop.py).
        valid_x, valid_y, valid_most = own_valid_rows(ray.train.get_dataset_shard("valid"), num_features, label_dtype,
                                                      reporter.rank, reporter.world_size)
        dummy_x = np.zeros((1, num_features), np.float32)

        def allreduce_sum(values: np.ndarray) -> np.ndarray:
            # One replica per worker (make_strategy: several workers -> MultiWorkerMirroredStrategy).
            per_replica = strategy.run(lambda: tf.constant(values))
            return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None).numpy()
        probe_x = probe_features(num_features)  # the probe rows of the test split (rayline/train/probe.py)
        per_worker_batch = max(1, config["batch_size"] // reporter.world_size)

        for epoch in range(reporter.start_epoch, config["epochs"]):
            # Ray's split is equal=True: every worker runs the same number of steps,
            # which MultiWorkerMirroredStrategy's collectives require.
            batches = train_shard.iter_batches(
                batch_size=per_worker_batch, batch_format="numpy",
                local_shuffle_buffer_size=per_worker_batch * 4, local_shuffle_seed=config["seed"] + epoch,
            )
            meter = Throughput()
            for batch, last in with_last(batches):
                meter.add(len(batch["label"]))
                x = tf.constant(np.asarray(batch["features"], dtype=np.float32).reshape(len(batch["label"]), num_features))
                steps.micro_batch(x, tf.constant(np.asarray(batch["label"], dtype=label_dtype)), last)
            # The learning rate is a (mirrored) variable: read its value, not the variable object.
            stats = meter.stats(reporter.world_size, float(np.asarray(tf.convert_to_tensor(optimizer.learning_rate))))

            # As many calls on every worker (eval_chunks: reading variables can be a collective op);
            # a dummy row's output is dropped.
            outputs = [infer(tf.constant(valid_x[s] if s.stop > s.start else dummy_x)).numpy()[:s.stop - s.start]
                       for s in eval_chunks(len(valid_x), valid_most, _PREDICT_BATCH)]
            raw = np.concatenate(outputs) if outputs else np.zeros((0, arch["num_outputs"]), np.float32)
            part = MetricPartials.of(config["task"], _outputs(raw, classification, probabilities), valid_y)
            metrics = combine_metrics(part, reporter.rank, reporter.world_size, allreduce_sum)
            # The live model's outputs on the probe rows, as `load`'s predict computes them (every
            # rank, as above); rank 0's checkpoint holds them. Under train.precision bf16/fp16 the
            # layers compute in that precision here, and in fp32 when served: recorded as such.
            probe = None
            if probe_x is not None and len(probe_x):
                probe = _outputs(infer(tf.constant(probe_x)).numpy(), classification, probabilities)

            # Snapshot on every rank (reads may be collectives); rank 0 writes it.
            weights = model.get_weights()
            optimizer_state = [np.asarray(v.numpy()) for v in optimizer.variables]

            def save(model_dir: str) -> None:
                os.makedirs(model_dir)
                np.savez(os.path.join(model_dir, _WEIGHTS), *weights)
                np.savez(os.path.join(model_dir, _OPTIMIZER), *optimizer_state)
                with open(os.path.join(model_dir, _ARCH), "w") as fh:
                    json.dump(arch, fh)
                write_probe(model_dir, probe, precision)

            reporter.report(epoch, metrics, save, stats)
        reporter.close()

    def trainer_class(self):
        from ray.train.tensorflow import TensorflowTrainer

        return TensorflowTrainer

    def load(self, model_dir: str, meta: dict) -> Predict:
        _use_legacy_keras()
        import tensorflow as tf

        with open(os.path.join(model_dir, _ARCH)) as fh:
            arch = json.load(fh)
        model = _build(arch)
        model.set_weights(_load_npz(os.path.join(model_dir, _WEIGHTS)))
        classification = meta["task"] == "classification"
        probabilities = classification and _emits_probabilities(model)
        num_features = arch["num_features"]

        @tf.function(input_signature=[tf.TensorSpec([None, num_features], tf.float32)])
        def infer(x):
            return model(x, training=False)

        def predict(features: np.ndarray) -> np.ndarray:
            x = np.ascontiguousarray(features, dtype=np.float32).reshape(len(features), num_features)
            if not len(x):
                return _outputs(np.zeros((0, arch["num_outputs"]), np.float32), classification, probabilities)
            raw = np.concatenate([infer(tf.constant(x[i:i + _PREDICT_BATCH])).numpy() for i in range(0, len(x), _PREDICT_BATCH)])
            return _outputs(raw, classification, probabilities)

        return predict

    def versions(self) -> dict[str, str]:
        _use_legacy_keras()
        import tensorflow as tf
        import tf_keras

        return {"tensorflow": tf.__version__, "tf_keras": tf_keras.__version__}

    def worker_env(self) -> dict[str, str]:
        return dict(_ENV)


BACKEND = TensorflowBackend()
