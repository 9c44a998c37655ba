"""A tensorflow worker's replicas and steps (rayline/train/tf_steps.py).

MirroredStrategy inside one worker runs here over two logical CPU devices standing in for two
GPUs (TF splits the host CPU when asked before its runtime starts, so each case runs in a
fresh process): the mirrored step must give the update of the single-device step on the
same batch, and its two replicas must split the batch rather than both compute all of it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import tensorflow  # noqa: F401  declared in pyproject.toml: a broken install fails, not skips

_CASE = textwrap.dedent("""
    import json, os, sys
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import numpy as np
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import tf_keras as keras
    from rayline.train.tf_steps import TfSteps, make_strategy

    case = json.loads(sys.argv[1])
    rng = np.random.default_rng(0)
    x = rng.normal(size=(case["rows"], 5)).astype(np.float32)
    y = rng.integers(0, 3, size=case["rows"]).astype(np.int64)

    def train(strategy, micro_batches):
        with strategy.scope():
            keras.utils.set_random_seed(1)
            model = keras.Sequential([keras.Input(shape=(5,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)])
            optimizer = keras.optimizers.SGD(learning_rate=0.5)
            optimizer.build(model.trainable_variables)
            steps = TfSteps(strategy, model, optimizer, world_size=1, num_features=5, classification=True,
                            accumulation=len(micro_batches), l2=case["l2"])
        for i, (lo, hi) in enumerate(micro_batches):
            steps.micro_batch(tf.constant(x[lo:hi]), tf.constant(y[lo:hi]), last=i == len(micro_batches) - 1)
        return model.get_weights(), int(steps.rows_computed.read_value()), steps

    mirrored = make_strategy(1, ["/cpu:0", "/cpu:1"])
    single = tf.distribute.OneDeviceStrategy("/cpu:0")
    split = case["split"]
    got, rows, steps = train(mirrored, split)
    want, single_rows, _ = train(single, [(0, case["rows"])])
    print(json.dumps({
        "strategy": type(mirrored).__name__, "replicas": steps.replicas, "local": steps.local_replicas,
        "steps": steps.steps, "rows": rows, "single_rows": single_rows,
        "max_diff": max(float(np.max(np.abs(a - b))) for a, b in zip(got, want)),
        "moved": max(float(np.max(np.abs(a - b))) for a, b in zip(got, train(single, [])[0])),
        "multi_worker": isinstance(make_strategy(1, ["/cpu:0"]), tf.distribute.MultiWorkerMirroredStrategy),
    }))
""")


# train.precision bf16 and train.grad_accumulation in TfSteps: what the model computes in, and how
# many optimizer steps it takes. The tensorflow backend sets the Keras mixed policy before building
# the model (as here); TfSteps must run the forward pass in it and step once per N micro-batches.
_TECHNIQUES = textwrap.dedent("""
    import json, os, sys
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import numpy as np
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import tf_keras as keras
    from rayline.train.tf_steps import TfSteps, make_strategy

    SEEN = []

    class Probe(keras.layers.Layer):
        # Passes its input on and records its dtype when the step is traced: the hidden layer's output.
        def __init__(self):
            super().__init__(autocast=False)  # sees the dtype it is given, not one cast to its own
        def call(self, x):
            SEEN.append(x.dtype.name)
            return x

    rng = np.random.default_rng(0)
    x = rng.normal(size=(20, 5)).astype(np.float32)
    y = rng.integers(0, 3, size=20).astype(np.int64)
    out = {}
    for policy, accumulation in (("float32", 1), ("mixed_bfloat16", 2)):
        keras.mixed_precision.set_global_policy(policy)
        strategy = make_strategy(1, ["/cpu:0", "/cpu:1"])
        with strategy.scope():
            keras.utils.set_random_seed(1)
            model = keras.Sequential([keras.Input(shape=(5,)), keras.layers.Dense(8, activation="relu"), Probe(),
                                      keras.layers.Dense(3)])
            optimizer = keras.optimizers.Adam(learning_rate=0.01)
            optimizer.build(model.trainable_variables)
            steps = TfSteps(strategy, model, optimizer, world_size=1, num_features=5, classification=True,
                            accumulation=accumulation)
        SEEN.clear()  # from here on, what TfSteps' traced steps compute in
        for i in range(5):  # 5 micro-batches of 4 rows
            steps.micro_batch(tf.constant(x[4 * i:4 * i + 4]), tf.constant(y[4 * i:4 * i + 4]), last=i == 4)
        out[policy] = {
            "seen": sorted(set(SEEN)),
            # The optimizer's own step counter, the first of the variables a checkpoint's optimizer.npz holds.
            "iterations": int(optimizer.iterations.numpy()),
            "first_saved": int(np.asarray(optimizer.variables[0].numpy())),
            "variables": sorted({v.dtype.name for v in model.variables}),
        }
    print(json.dumps(out))
""")


def test_bf16_computes_the_forward_pass_in_bf16_and_accumulation_steps_once_per_group():
    result = _run({}, _TECHNIQUES)
    # fp32: the hidden layer outputs float32; 5 micro-batches, 5 optimizer steps.
    assert result["float32"] == {"seen": ["float32"], "iterations": 5, "first_saved": 5, "variables": ["float32"]}
    # bf16 (mixed_bfloat16): the forward pass inside TfSteps' step computes in bfloat16, the variables
    # stay float32; 2 micro-batches per step: 3 steps for 5 (the last group has 1), the count a checkpoint keeps.
    assert result["mixed_bfloat16"] == {"seen": ["bfloat16"], "iterations": 3, "first_saved": 3, "variables": ["float32"]}


def _run(case: dict, script: str = _CASE) -> dict:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(case)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", [
    # 8 rows in one step: each of the two replicas computes 4.
    {"rows": 8, "split": [[0, 8]], "l2": 0.0},
    # 7 rows: an uneven split (4 and 3) still weighs every row alike; with L2 weight decay.
    {"rows": 7, "split": [[0, 7]], "l2": 0.01},
    # 2 accumulated micro-batches of 4 rows (2 per replica): one step, the update of the 8 rows.
    {"rows": 8, "split": [[0, 4], [4, 8]], "l2": 0.0},
], ids=["one-batch", "uneven-l2", "accumulated"])
def test_one_worker_with_two_devices_mirrors_and_splits_each_batch(case):
    result = _run(case)
    assert result["strategy"] == "MirroredStrategy" and result["replicas"] == 2 and result["local"] == 2
    assert result["multi_worker"] is True  # one device: MultiWorkerMirroredStrategy, as across workers
    assert result["steps"] == 1
    # The two replicas computed the batch's rows once between them, not once each.
    assert result["rows"] == result["single_rows"] == case["rows"]
    # The update of one device on the whole batch (and a real update, not none at all).
    assert result["moved"] > 1e-3
    assert result["max_diff"] < 1e-5, result
