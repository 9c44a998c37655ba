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

from rayline.inference.arch import ARCH_FILE
from rayline.inference.tensorflow_model import (PREDICT_BATCH, WEIGHTS_FILE, build_model, emits_probabilities,
                                                 import_tensorflow, load_npz, use_legacy_keras)
from rayline.inference.tensorflow_model import outputs as model_outputs
from rayline.train.backend import Backend
from rayline.train.hardware import strategy_text, tf_worker_device
from rayline.train.loop import (EpochReporter, available_memory, combine_metrics, epoch_order, eval_chunks,
                                fewest_rows, model_ready, own_valid_rows, sha256_of, shard_arrays, shard_plan,
                                streamed_preprocessing, with_last)
from rayline.evaluation.metrics import MetricPartials
from rayline.train.probe import probe_features, write_probe
from rayline.train.splits import ARRAYS_KEY, dataset_shard
from rayline.train.tf_steps import TfSteps, make_strategy

__all__ = ["TensorflowBackend", "BACKEND"]

_OPTIMIZER = "optimizer.npz"


def _optimizer(spec: dict):
    """The spec's optimizer; weight_decay is L2 on the gradients for adam and sgd (as torch), decoupled for adamw."""
    import tf_keras as keras

    name = spec["name"]
    if name == "sgd":
        return keras.optimizers.SGD(learning_rate=spec["lr"], momentum=spec["momentum"])
    if name == "adamw":
        return keras.optimizers.AdamW(learning_rate=spec["lr"], weight_decay=spec["weight_decay"], epsilon=1e-8)
    return keras.optimizers.Adam(learning_rate=spec["lr"], epsilon=1e-8)




class TensorflowBackend(Backend):
    name = "tensorflow"

    def train_loop(self, config: dict) -> None:
        use_legacy_keras()
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
            model = build_model(arch)
            optimizer = _optimizer(opt_spec)
            if loss_scaling:  # dynamic loss scale: small fp16 gradients would flush to zero
                optimizer = keras.mixed_precision.LossScaleOptimizer(optimizer)
            optimizer.build(model.trainable_variables)
            if reporter.restore_model_dir:
                model.set_weights(load_npz(os.path.join(reporter.restore_model_dir, WEIGHTS_FILE)))
                saved = os.path.join(reporter.restore_model_dir, _OPTIMIZER)
                values = load_npz(saved) if os.path.exists(saved) else []
                variables = list(optimizer.variables)
                if len(values) == len(variables) and all(v.shape == tuple(a.shape) for v, a in zip(variables, values)):
                    for var, value in zip(variables, values):
                        var.assign(value)
        # What this attempt trains from, read from the live variables (every rank reads: reads can be
        # collectives): the weights in model.get_weights() order, the optimizer's variables (iterations
        # first) in their order; as weights.npz and optimizer.npz hold them.
        streamed = streamed_preprocessing(config)
        # train.in_memory: the shard fetched once and sliced here, or streamed every epoch (loop.py).
        plan = shard_plan(config.get("in_memory", "auto"), config.get("train_rows", 0), reporter.world_size, num_features,
                          streamed=streamed is not None, reserved_bytes=config.get("memory_per_worker"),
                          available_bytes=available_memory(),
                          local_workers=ray.train.get_context().get_local_world_size(),
                          handed_off="train" in (config.get(ARRAYS_KEY) or {}))
        device = tf_worker_device()
        reporter.record_start({
            "weights_sha256": sha256_of(np.ascontiguousarray(w).tobytes() for w in model.get_weights()),
            "optimizer_sha256": sha256_of(np.ascontiguousarray(np.asarray(v.numpy())).tobytes()
                                          for v in optimizer.variables),
            "train_shard": plan.as_dict(),
            "device": device,  # the summary's "trained on" line (rayline/train/hardware.py)
            "strategy": strategy_text("tensorflow", reporter.world_size, precision=precision,
                                      gpus_per_worker=device["count"] if device["type"] == "cuda" else 0),
        })
        probabilities = classification and emits_probabilities(model)
        label_dtype = np.int64 if classification else np.float32
        steps = TfSteps(strategy, model, optimizer, world_size=reporter.world_size, num_features=num_features,
                        classification=classification, probabilities=probabilities, l2=l2,
                        accumulation=accumulation, loss_scaling=loss_scaling)

        @tf.function(input_signature=[tf.TensorSpec([None, num_features], tf.float32)])
        def infer(x):
            return tf.cast(model(x, training=False), tf.float32)

        train_shard = dataset_shard(config, "train")
        # This worker's share of "valid"; the metrics combine every worker's (loop.py).
        valid_x, valid_y, valid_most = own_valid_rows(dataset_shard(config, "valid"), num_features, label_dtype,
                                                      reporter.rank, reporter.world_size)
        dummy_x = np.zeros((1, num_features), np.float32)

        def allreduce_sum(values: np.ndarray) -> np.ndarray:
            # One replica per worker (make_strategy: several workers -> MultiWorkerMirroredStrategy).
            per_replica = strategy.run(lambda: tf.constant(values))
            return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None).numpy()
        probe_x = probe_features(num_features, config)  # the probe rows of the test split (rayline/train/probe.py)
        per_worker_batch = max(1, config["batch_size"] // reporter.world_size)
        if plan.kind == "memory":  # every worker keeps as many rows: MWMS's collectives need as many steps
            resident_x, resident_y = shard_arrays(train_shard, num_features, label_dtype, streamed)  # rows as read: decoded once
            rows = fewest_rows(len(resident_y), reporter.rank, reporter.world_size, allreduce_sum)
            resident_x, resident_y = resident_x[:rows], resident_y[:rows]

        for epoch in range(reporter.start_epoch, config["epochs"]):
            if plan.kind == "memory":
                order = epoch_order(len(resident_y), config["seed"], epoch, reporter.rank)
                batches = ({"features": resident_x[order[i:i + per_worker_batch]],
                            "label": resident_y[order[i:i + per_worker_batch]]}
                           for i in range(0, len(order), per_worker_batch))
            else:
                # Ray's split is equal=True: every worker runs the same number of steps,
                # which MultiWorkerMirroredStrategy's collectives require.
                batches = train_shard.iter_batches(
                    batch_size=per_worker_batch, batch_format="numpy" if streamed is None else "pandas",
                    local_shuffle_buffer_size=per_worker_batch * 4, local_shuffle_seed=config["seed"] + epoch,
                )
            meter = reporter.meter()
            for batch, last in with_last(batches):
                if streamed is not None and plan.kind != "memory":  # rows as read (images): transformed here, batch by batch
                    x, y = model_ready(streamed, batch, num_features, label_dtype)
                else:
                    x = np.asarray(batch["features"], dtype=np.float32).reshape(len(batch["label"]), num_features)
                    y = np.asarray(batch["label"], dtype=label_dtype)
                meter.add(len(y))
                steps.micro_batch(tf.constant(x), tf.constant(y), last)
            # The learning rate is a (mirrored) variable: read its value, not the variable object.
            stats = meter.stats(reporter.world_size, float(np.asarray(tf.convert_to_tensor(optimizer.learning_rate))))

            # As many calls on every worker (eval_chunks: reading variables can be a collective op);
            # a dummy row's output is dropped.
            outputs = [infer(tf.constant(valid_x[s] if s.stop > s.start else dummy_x)).numpy()[:s.stop - s.start]
                       for s in eval_chunks(len(valid_x), valid_most, PREDICT_BATCH)]
            raw = np.concatenate(outputs) if outputs else np.zeros((0, arch["num_outputs"]), np.float32)
            part = MetricPartials.of(config["task"], model_outputs(raw, classification, probabilities), valid_y)
            metrics = combine_metrics(part, reporter.rank, reporter.world_size, allreduce_sum)
            # The live model's outputs on the probe rows, as `load`'s predict computes them (every
            # rank, as above); rank 0's checkpoint holds them. Under train.precision bf16/fp16 the
            # layers compute in that precision here, and in fp32 when served: recorded as such.
            probe = None
            if probe_x is not None and len(probe_x):
                # TensorFloat-32 off (Ampere+ GPUs use it for fp32 by default): the probe must be the
                # IEEE fp32 that serving computes on CPU (rayline/train/torch_backend.py's _ieee_fp32).
                tf32 = tf.config.experimental.tensor_float_32_execution_enabled()
                tf.config.experimental.enable_tensor_float_32_execution(False)
                try:
                    probe = model_outputs(infer(tf.constant(probe_x)).numpy(), classification, probabilities)
                finally:
                    tf.config.experimental.enable_tensor_float_32_execution(tf32)

            # Snapshot on every rank (reads may be collectives); rank 0 writes it.
            weights = model.get_weights()
            optimizer_state = [np.asarray(v.numpy()) for v in optimizer.variables]

            def save(model_dir: str) -> None:
                os.makedirs(model_dir)
                np.savez(os.path.join(model_dir, WEIGHTS_FILE), *weights)
                np.savez(os.path.join(model_dir, _OPTIMIZER), *optimizer_state)
                with open(os.path.join(model_dir, ARCH_FILE), "w") as fh:
                    json.dump(arch, fh)
                write_probe(model_dir, probe, precision)

            reporter.report(epoch, metrics, save, stats)
        reporter.close()

    def trainer_class(self):
        import_tensorflow()  # ray.train.tensorflow imports it, in the driver: its fd-2 lines kept off the terminal
        from ray.train.tensorflow import TensorflowTrainer

        return TensorflowTrainer

    def trainer_options(self) -> dict:
        from rayline.train.tf_cluster import TfClusterConfig

        # Ray's TensorflowConfig would import TensorFlow in Train's controller: rayline/train/tf_cluster.py.
        return {"tensorflow_config": TfClusterConfig()}

    def versions(self) -> dict[str, str]:
        tf = import_tensorflow()  # in the driver (registration): TensorFlow's fd-2 lines kept off its terminal
        import tf_keras

        return {"tensorflow": tf.__version__, "tf_keras": tf_keras.__version__}


BACKEND = TensorflowBackend()
