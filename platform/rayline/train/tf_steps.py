"""How a tensorflow worker spreads its batches over its replicas and turns them into optimizer steps.

Replicas: across Ray Train workers the strategy is MultiWorkerMirroredStrategy (one replica per
worker, or one per local GPU of a multi-GPU worker; its collectives all-reduce across workers).
A run with a single worker that sees several GPUs uses MirroredStrategy over them instead:
the same synchronous data parallelism inside one machine, all-reducing over NCCL with no
cross-worker collective to set up (`make_strategy`).

Inside a worker, each local replica computes on its own slice of the worker's batch (rows
`local_id::L` of L replicas), so L GPUs split a batch instead of each repeating all of it
(`strategy.run` hands every replica the same tensors). Each replica's loss is its rows' sum
divided by the worker's batch size, the number of workers and the accumulation: summed over
every replica of every worker (the all-reduce), the gradient is that of the global batch's
mean, however unevenly a short batch splits over the replicas.

`train.grad_accumulation: N`: each replica sums its micro-batches' gradients in its own copy
(ON_READ variables: written locally, never synchronised) and only the step's
`apply_gradients` all-reduces, once per N micro-batches; a short last group is stepped with its
own mean (`factor`). `train.precision: fp16` wraps the optimizer in a LossScaleOptimizer
(dynamic loss scale); bf16 needs no scaling (the Keras mixed policy is set by the caller).
"""

from __future__ import annotations

import os

__all__ = ["make_strategy", "TfSteps"]


def make_strategy(world_size: int, devices: list[str] | None = None):
    """The tf.distribute strategy for a worker of a `world_size`-worker run.

    `devices`: the worker's accelerators (default: its visible GPUs, which Ray Train limits to
    the worker's own; listed without starting TF's runtime, which MWMS must configure first). MirroredStrategy over them when the run has one worker and several
    devices; MultiWorkerMirroredStrategy otherwise (it reads TF_CONFIG, which rayline's
    TfClusterConfig sets on every worker, and mirrors over each worker's local GPUs itself)."""
    import tensorflow as tf

    if devices is None:
        devices = [f"/gpu:{i}" for i in range(len(tf.config.list_physical_devices("GPU")))]
    if world_size == 1 and len(devices) > 1:
        return tf.distribute.MirroredStrategy(devices=devices)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    # Without the cluster in TF_CONFIG each worker would train alone on its shard, and nothing would say so.
    if strategy.num_replicas_in_sync < world_size:
        raise RuntimeError(f"MultiWorkerMirroredStrategy sees {strategy.num_replicas_in_sync} replica(s) in a "
                           f"{world_size}-worker run: TF_CONFIG names no cluster of {world_size} workers "
                           f"(TF_CONFIG={os.environ.get('TF_CONFIG')!r})")
    return strategy


class TfSteps:
    """The compiled train steps of one worker (its own variables are made in `strategy.scope()`)."""

    def __init__(self, strategy, model, optimizer, *, world_size: int, num_features: int, classification: bool,
                 probabilities: bool = False, l2: float = 0.0, accumulation: int = 1, loss_scaling: bool = False):
        import tensorflow as tf
        import tf_keras as keras

        self.strategy, self.model, self.optimizer = strategy, model, optimizer
        self.accumulation = max(1, int(accumulation))
        self.replicas = strategy.num_replicas_in_sync
        # Replicas of this worker (MWMS: this worker's devices; MirroredStrategy: all of them).
        self.local_replicas = max(1, len(strategy.extended.worker_devices))
        self.steps = 0  # optimizer steps taken
        self._pending = 0  # micro-batches whose gradients await a step
        label_dtype = tf.int64 if classification else tf.float32
        workers, accumulation_ = float(world_size), float(self.accumulation)
        local, replicas = self.local_replicas, float(self.replicas)

        with strategy.scope():
            self.accumulators = [
                tf.Variable(tf.zeros_like(v), trainable=False, synchronization=tf.VariableSynchronization.ON_READ,
                            aggregation=tf.VariableAggregation.SUM)
                for v in model.trainable_variables
            ] if self.accumulation > 1 else []
            # Rows the forward and backward passes ran on, summed over this worker's replicas:
            # the rows fed when the replicas split each batch (one that repeated it would count it again).
            self.rows_computed = tf.Variable(0, dtype=tf.int64, trainable=False,
                                             synchronization=tf.VariableSynchronization.ON_READ,
                                             aggregation=tf.VariableAggregation.SUM)

        def replica_grads(x, y):
            rows = tf.cast(tf.shape(x)[0], tf.float32)  # the worker's batch
            mine = tf.distribute.get_replica_context().replica_id_in_sync_group % local
            x, y = x[mine::local], y[mine::local]
            self.rows_computed.assign_add(tf.cast(tf.shape(x)[0], tf.int64))
            with tf.GradientTape() as tape:
                out = tf.cast(model(x, training=True), tf.float32)  # the loss in fp32 under mixed precision
                if classification:
                    per_row = keras.losses.sparse_categorical_crossentropy(y, out, from_logits=not probabilities)
                else:
                    per_row = tf.square(tf.reshape(out, [-1]) - y)
                loss = tf.reduce_sum(per_row) / (rows * workers * accumulation_)
                if model.losses:  # once per step in all: each replica adds its share
                    loss += tf.add_n([tf.cast(term, tf.float32) for term in model.losses]) / (replicas * accumulation_)
                if loss_scaling:
                    loss = optimizer.get_scaled_loss(loss)
            grads = tape.gradient(loss, model.trainable_variables)
            return optimizer.get_unscaled_gradients(grads) if loss_scaling else grads

        def replica_accumulate(x, y):
            for acc, g in zip(self.accumulators, replica_grads(x, y)):
                if g is not None:
                    acc.assign_add(g)

        def replica_apply(x, y, factor):
            variables = model.trainable_variables
            grads = replica_grads(x, y)
            if self.accumulators:  # + the group's earlier micro-batches; x N/k for a short last group
                grads = [None if g is None else (g + acc.read_value()) * factor for g, acc in zip(grads, self.accumulators)]
            pairs = [(g + (l2 / replicas) * v if l2 else g, v) for g, v in zip(grads, variables) if g is not None]
            optimizer.apply_gradients(pairs)
            for acc in self.accumulators:
                acc.assign(tf.zeros_like(acc))

        batch = [tf.TensorSpec([None, num_features], tf.float32), tf.TensorSpec([None], label_dtype)]

        @tf.function(input_signature=[*batch, tf.TensorSpec([], tf.float32)])
        def train_step(x, y, factor):
            strategy.run(replica_apply, args=(x, y, factor))

        @tf.function(input_signature=batch)
        def accumulate_step(x, y):
            strategy.run(replica_accumulate, args=(x, y))

        self._train_step, self._accumulate_step = train_step, accumulate_step

    def micro_batch(self, x, y, last: bool) -> None:
        """One micro-batch of this worker (x: (n, features) float32, y: labels); steps the optimizer
        at the end of a group of N, or at `last` (the epoch's final micro-batch)."""
        import tensorflow as tf

        self._pending += 1
        if self._pending == self.accumulation or last:
            self._train_step(x, y, tf.constant(self.accumulation / self._pending, tf.float32))
            self._pending = 0
            self.steps += 1
        else:
            self._accumulate_step(x, y)
