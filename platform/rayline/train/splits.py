"""How the training workers get the splits: small ones as arrays in Ray's object store, the rest as
Ray Data datasets (Ray Train splits "train" over the workers).

A worker's first read of a Ray Data split is a Ray Data execution, and splitting "train" takes a
SplitCoordinator actor (one more process per run, per trial in a sweep): measured on the 2-core
machine for digits (1,797 rows, 2 workers), 1.4 s to read "valid" and 3.4 s to fetch the train
shard, 5 of the 7 s a worker spent before its first step, for 0.5 MB of data. Splits whose
model-ready arrays take at most HANDOFF_BYTES together go instead as one object each, put once
by the driver (before the sweep: every trial shares them) and read by each worker with one
`ray.get`. A worker's share of "train" is rows rank, rank + world, ... truncated to the same count
on every worker (as Ray's equal split: DDP and MultiWorkerMirroredStrategy need as many steps
everywhere); "valid" and "probe" are read whole, as their Ray Data datasets are.

When every split is handed off, the trainer gets no datasets, and Ray Train's DatasetsCallback, which
starts a DatasetManager actor for every run whatever its datasets (one more Python process per run,
per trial in a sweep), is left out (`without_dataset_manager`).

Not handed off: rows as read (images, decoded in the workers: loop.py's shard_plan), a spec that asks to
stream (`train.in_memory: never`), and anything larger: data beyond RAM keeps streaming.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

__all__ = ["HANDOFF_BYTES", "ARRAYS_KEY", "hand_off", "handed_off_bytes", "dataset_shard", "ArrayShard",
           "without_dataset_manager"]

# The most bytes of model-ready rows (float32 features, a label) the driver hands over as arrays.
HANDOFF_BYTES = 64 * 2**20
# The loop config's key for {split name: ObjectRef of its arrays}.
ARRAYS_KEY = "split_arrays"


def handed_off_bytes(rows: int, num_features: int, probe_rows: int = 0) -> int:
    """What the arrays of `rows` model-ready rows and `probe_rows` probe rows take (float32 features, an 8-byte label)."""
    return (rows + probe_rows) * (num_features * 4 + 8)


def hand_off(data, in_memory: str, datasets: dict) -> dict | None:
    """{split: ObjectRef} for the splits of `data` (PreparedData) the workers read as arrays, or None
    when they stay Ray Data datasets (see the module doc). `datasets`: the trainer's datasets by name
    (rayline/train/run.py's datasets_of: train, valid and the probe). Called once by the driver per
    prepared data."""
    import ray

    from rayline.train.loop import shard_arrays

    if in_memory == "never" or getattr(data, "train_streamed", False):
        return None
    num_features = len(data.preprocessing.output_columns)
    rows = data.rows.get("train", 0) + data.rows.get("valid", 0)
    probe_rows = data.rows.get("test", 0) if len(datasets) > 2 else 0  # at most that many (PROBE_ROWS)
    if handed_off_bytes(rows, num_features, probe_rows) > HANDOFF_BYTES:
        return None
    label = np.int64 if data.task == "classification" else np.float32
    refs = {}
    for name, dataset in datasets.items():
        # The probe's labels are never read (probe_features): float64 holds whatever they are.
        features, labels = shard_arrays(dataset, num_features, label if name in ("train", "valid") else np.float64)
        refs[name] = ray.put({"features": features, "label": labels})
    return refs


def without_dataset_manager(trainer):
    """`trainer` (a Ray Train V2 trainer given no datasets) without Ray's DatasetsCallback.

    Ray Train 2.60 adds that callback to every run, and it starts a DatasetManager actor at the worker
    group's start even for `datasets={}`: a Python process that imports Ray Data and serves nothing
    when every split came as arrays (`dataset_shard` never asks Ray Train for one then). A Ray that
    renames either leaves the trainer as it is; so does a trainer with datasets."""
    try:
        from ray.train.v2._internal.callbacks import DatasetsCallback
    except ImportError:
        return trainer
    defaults = getattr(trainer, "_create_default_callbacks", None)
    if defaults is None or getattr(trainer, "datasets", None):
        return trainer
    trainer._create_default_callbacks = lambda: [c for c in defaults() if not isinstance(c, DatasetsCallback)]
    return trainer


def dataset_shard(config: dict, name: str):
    """This worker's split `name`: an ArrayShard when the driver handed it off, else Ray Train's own
    shard (a DataIterator); KeyError when the run has no such split (as Ray Train)."""
    import ray
    import ray.train

    refs = config.get(ARRAYS_KEY) or {}
    if name not in refs:
        return ray.train.get_dataset_shard(name)
    context = ray.train.get_context()
    return ArrayShard(ray.get(refs[name]), rank=context.get_world_rank(), world=context.get_world_size(),
                      split=name == "train")


class ArrayShard:
    """A handed-off split, read as loop.py's readers read a Ray Data shard (`iter_batches`)."""

    def __init__(self, arrays: dict, *, rank: int = 0, world: int = 1, split: bool = False):
        features, labels = arrays["features"], arrays["label"]
        if split:  # this worker's rows: rank, rank + world, ..., as many on every worker
            each = len(labels) // max(1, world)
            features, labels = features[rank::world][:each], labels[rank::world][:each]
        self.features, self.labels = features, labels

    def iter_batches(self, *, batch_size: int | None = None, batch_format: str = "numpy", **_) -> Iterator[dict]:
        """{"features", "label"} batches of `batch_size` rows (all rows when None), numpy only."""
        if batch_format != "numpy":
            raise ValueError(f"a handed-off split is read as numpy batches (got {batch_format!r})")
        step = batch_size or max(1, len(self.labels))
        for start in range(0, len(self.labels), step):
            yield {"features": self.features[start:start + step], "label": self.labels[start:start + step]}
