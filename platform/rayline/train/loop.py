"""The per-worker training protocol shared by every backend: resume, report, checkpoint.

A checkpoint directory holds `model/` (framework files, written by the backend) and
`rayline_state.json` (epoch, metrics, the per-epoch history, the epochs training resumed
from, and `starts`). Only rank 0 writes checkpoints; every rank reports, as Ray Train requires.

`starts`: one record per attempt of the lineage (a fresh start, each restart after a failure or
a resumed sweep, PBT's start from a donor's checkpoint), of the state that attempt was about to
train from, read from the LIVE model and optimizer after they were built and restored, before
the first step (`EpochReporter.record_start`): {"epoch": the restored checkpoint's epoch, -1 for
a fresh start; "source": that checkpoint's path, None for a fresh start; and the backend's
evidence: "weights_sha256", "optimizer_sha256" (torch, tensorflow), "rounds", "trees_sha256",
"early_stopping" (xgboost)}. It lets a test check, against the checkpoint files, that a restore
really put the saved weights and optimizer state back (digests: `sha256_of`).

Local copies (the checkpoint being reported, the one restored from) are `owned_tempdir`s in
the node's temp dir: a worker that Ray kills (Tune stopping a trial while rank 0 waits in
`report`, a fault, Ctrl-C) cannot remove its own, so each new worker first removes those of
dead workers on its node (`sweep_orphans`). Ray deletes the reported copy right after its
upload, so the window for such a leftover is the save and upload alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

from rayline.workspace import owned_tempdir, sweep_orphans

__all__ = ["with_last", "Throughput", "TRAINING_STATS", "EpochReporter", "STATE_FILE", "MODEL_DIR", "CKPT_PREFIX", "RESTORE_PREFIX", "read_state", "shard_arrays", "shard_batches",
           "STREAMED", "streamed_preprocessing", "model_ready", "sha256_of", "own_valid_rows", "eval_chunks", "combine_metrics",
           "ShardPlan", "shard_plan", "available_memory", "epoch_order", "fewest_rows"]

STATE_FILE = "rayline_state.json"
MODEL_DIR = "model"
CKPT_PREFIX = "rayline-ckpt-"
RESTORE_PREFIX = "rayline-restore-"
# Beside the validation metrics in every history row (and every MLflow step): how fast the
# epoch trained and at which learning rate. Not model metrics: never ranked or registered as such.
# train_s: the seconds this worker's training loop took that epoch (no validation or checkpoint).
TRAINING_STATS = ("samples_per_s", "samples_per_s_per_worker", "lr", "train_s")


def with_last(items: Iterable) -> Iterator[tuple[object, bool]]:
    """(item, is_last) for every item, looking one ahead."""
    iterator = iter(items)
    try:
        current = next(iterator)
    except StopIteration:
        return
    for following in iterator:
        yield current, False
        current = following
    yield current, True


class Throughput:
    """Training rows per second over one epoch (or report interval) of one worker.

    Total throughput is this worker's rows times the world size over this worker's time: Ray's
    equal split gives every worker the same rows, and a step's all-reduce keeps them in step."""

    def __init__(self):
        self._started = time.perf_counter()
        self.rows = 0
        self.first_step_s: float | None = None  # from the meter's start to its first step's end (the run's timeline)

    def add(self, rows: int) -> None:
        if self.first_step_s is None:
            self.first_step_s = time.perf_counter() - self._started
        self.rows += int(rows)

    def stats(self, world_size: int, lr: float) -> dict:
        """The row's TRAINING_STATS; restarts the clock for the next epoch."""
        seconds = max(time.perf_counter() - self._started, 1e-9)
        per_worker = self.rows / seconds
        self._started, self.rows = time.perf_counter(), 0
        return {"samples_per_s": per_worker * world_size, "samples_per_s_per_worker": per_worker, "lr": float(lr),
                "train_s": seconds}


# The loop config's key for the fitted preprocessing of a train split that comes as read.
STREAMED = "streamed_preprocessing"


def streamed_preprocessing(config: dict):
    """The FittedPreprocessing the workers transform the train split with, batch by batch, when
    the data stage handed it over as read (rayline/data/pipeline.py: images are decoded here,
    each epoch, rather than stored decoded); None when it is model-ready."""
    state = config.get(STREAMED)
    if state is None:
        return None
    from rayline.data.preprocess import FittedPreprocessing

    return FittedPreprocessing.from_dict(state)


def model_ready(preprocessing, frame, num_features: int, label_dtype) -> tuple:
    """A pandas batch of rows as read -> (features float32 (n, d), labels): the data stage's own
    transform (rayline/data/pipeline.py's to_training_batch)."""
    import numpy as np

    from rayline.data.pipeline import to_training_batch

    batch = to_training_batch(preprocessing, frame)
    n = len(batch["label"])
    return (np.asarray(batch["features"], dtype=np.float32).reshape(n, num_features),
            np.asarray(batch["label"], dtype=label_dtype))


def shard_batches(shard, num_features: int, label_dtype, preprocessing=None) -> Iterator[tuple]:
    """One pass over a Ray Train dataset shard's rows, a batch at a time: (features float32 (n, d),
    labels); rows as read are transformed through `preprocessing` (streamed_preprocessing)."""
    import numpy as np

    if preprocessing is not None:
        for frame in shard.iter_batches(batch_size=4096, batch_format="pandas"):
            yield model_ready(preprocessing, frame, num_features, label_dtype)
        return
    for batch in shard.iter_batches(batch_size=65536, batch_format="numpy"):
        n = len(batch["label"])
        yield (np.asarray(batch["features"], dtype=np.float32).reshape(n, num_features),
               np.asarray(batch["label"], dtype=label_dtype))


# A shard goes in memory (`train.in_memory: auto`) when it takes at most this share of the worker's
# budget: the rest is for the model, its gradients and optimizer state, a batch's activations, the
# valid rows, Python and the framework themselves.
_IN_MEMORY_SHARE = 0.5


@dataclass(frozen=True)
class ShardPlan:
    """How one torch or tensorflow worker holds its train shard, and the figures that decided it.

    kind "memory": fetched once (arrays the driver handed off: rayline/train/splits.py, or Ray Data's
    large blocks; rows as read, such as image files' bytes, decoded once through the fitted
    preprocessing as they arrive); each epoch slices mini-batches from
    it in a fresh permutation (`epoch_order`): no Ray Data iterator, collation or local shuffle
    buffer per step, which cost more than a small model's forward and backward (issue 37: 0.31x
    the hand-written DDP loop), and no image decoded again at every epoch (the image benchmark's
    loop: 0.84x the hand-written script streamed). Preprocessing is deterministic (an image's
    training augmentation is the model's, applied in its forward pass), so the decoded rows are
    what every epoch would decode. kind "stream": read from Ray Data every epoch (rows as read are
    decoded per batch), for a shard over the budget or `train.in_memory: never`."""

    kind: str
    shard_rows: int
    estimated_bytes: int  # features (float32) and labels of shard_rows
    budget_bytes: int
    budget_source: str  # "reserved" (resources_per_worker.memory) or "available" (node memory share)
    setting: str  # train.in_memory
    handed_off: bool = False  # the driver gave the split as arrays (rayline/train/splits.py)
    decoded: bool = False  # rows as read (images), held decoded: decoded once, not every epoch

    def as_dict(self) -> dict:
        return {"kind": self.kind, "shard_rows": self.shard_rows, "estimated_bytes": self.estimated_bytes,
                "budget_bytes": self.budget_bytes, "budget_source": self.budget_source, "setting": self.setting,
                "handed_off": self.handed_off, "decoded": self.decoded}


def shard_plan(setting: str, train_rows: int, world_size: int, num_features: int, *, streamed: bool,
               reserved_bytes: float | None, available_bytes: int, local_workers: int,
               handed_off: bool = False) -> ShardPlan:
    """Decide, before reading, how a worker holds its shard (`train.in_memory`: auto | always | never).
    The budget is the worker's reserved Ray memory when it reserves some, else the node's available
    memory divided among this run's workers on the node (as xgboost's matrix_plan). `handed_off`: the
    driver gave the split as arrays (rayline/train/splits.py), in memory whatever the budget says.
    `streamed`: the split holds rows as read (images' bytes); the estimate is of the decoded rows
    (`num_features` float32 each) the worker would hold."""
    shard_rows = -(-max(0, int(train_rows)) // max(1, world_size))
    estimate = shard_rows * (num_features * 4 + 8)
    if reserved_bytes:
        budget, source = int(reserved_bytes), "reserved"
    else:
        budget, source = int(available_bytes // max(1, local_workers)), "available"
    if handed_off:
        kind = "memory"
    elif setting == "never":
        kind = "stream"
    elif setting == "always":
        kind = "memory"
    else:
        kind = "memory" if estimate <= _IN_MEMORY_SHARE * budget else "stream"
    return ShardPlan(kind, shard_rows, estimate, budget, source, setting, handed_off,
                     decoded=kind == "memory" and streamed and not handed_off)


def available_memory() -> int:
    import psutil

    return int(psutil.virtual_memory().available)


def epoch_order(rows: int, seed: int, epoch: int, rank: int):
    """The order an in-memory shard's rows train in at `epoch` on `rank`: a permutation drawn anew
    every epoch, the same for the same seed (a resumed run's epoch trains its rows in the order the
    interrupted one would have)."""
    import numpy as np

    return np.random.default_rng([int(seed), int(epoch), int(rank)]).permutation(rows)


def fewest_rows(rows: int, rank: int, world: int, allreduce_sum: Callable) -> int:
    """The fewest rows any worker holds (over the framework's collective, as combine_metrics): an
    in-memory shard keeps that many, since DDP's and MultiWorkerMirroredStrategy's collectives need
    the same number of steps on every worker. Ray's split is equal already; this makes sure."""
    import numpy as np

    if world == 1:
        return int(rows)
    table = np.zeros(world, dtype=np.int64)
    table[rank] = rows
    return int(np.asarray(allreduce_sum(table), dtype=np.int64).reshape(world).min())


def shard_arrays(shard, num_features: int, label_dtype, preprocessing=None):
    """All rows of a Ray Train dataset shard in memory: (features float32 (n, d), labels); rows as
    read go through `preprocessing` (streamed_preprocessing) once, on the way in."""
    import numpy as np

    batches = list(shard_batches(shard, num_features, label_dtype, preprocessing))
    if not batches:
        return np.zeros((0, num_features), np.float32), np.zeros((0,), label_dtype)
    return np.concatenate([x for x, _ in batches]), np.concatenate([y for _, y in batches])


def own_valid_rows(shard, num_features: int, label_dtype, rank: int, world: int):
    """This worker's share of the valid split: (features (n, d), labels, most rows any worker holds).

    Every worker reads the unsplit "valid" dataset once and keeps rows rank, rank + world, ... of
    each batch: disjoint shares covering every row, whatever the number of workers (elastic
    runs change it between restarts), held 1/world each. Ray's own split (`equal=True`) would
    drop rows and make the metric differ from the one on the whole split. The most rows any
    worker holds tells each how many forward calls to make (`eval_chunks`)."""
    import numpy as np

    xs, ys, most = [], [], np.zeros(world, dtype=np.int64)
    for batch in shard.iter_batches(batch_size=65536, batch_format="numpy"):
        n = len(batch["label"])
        most += [len(range(r, n, world)) for r in range(world)]
        labels = np.asarray(batch["label"][rank::world], dtype=label_dtype)
        xs.append(np.asarray(batch["features"][rank::world], dtype=np.float32).reshape(len(labels), num_features))
        ys.append(labels)
    if not xs:
        return np.zeros((0, num_features), np.float32), np.zeros((0,), label_dtype), 0
    return np.concatenate(xs), np.concatenate(ys), int(most.max())


def eval_chunks(rows: int, most: int, chunk: int) -> list[slice]:
    """Slices of a worker's `rows` valid rows, `chunk` at a time, as many as the worker holding the
    `most` rows needs: a forward pass can be a collective (FSDP gathers its shards, reading a
    MultiWorkerMirroredStrategy variable can sync), so every worker makes the same number of
    calls; a worker with fewer rows makes some on empty slices (callers run those on a dummy row)."""
    return [slice(min(i, rows), min(i + chunk, rows)) for i in range(0, max(most, 1), chunk)]


def combine_metrics(part, rank: int, world: int, allreduce_sum: Callable) -> dict:
    """The metrics of every worker's rows: each worker's MetricPartials (rayline/evaluation/metrics.py)
    gathered to all workers over the training collective, merged in rank order, so every worker
    gets the same numbers, equal to the metrics of all rows in one process.

    `allreduce_sum(int64 array) -> the array summed over the workers` is the framework's own
    collective (torch.distributed, tf.distribute, xgboost.collective). A gather is built from it:
    each worker writes its pickled partials into its own row of a zero table, so the sum holds
    every worker's bytes exactly."""
    import pickle

    import numpy as np

    if world == 1:
        return part.result()
    blob = pickle.dumps(part)
    sizes = np.zeros(world, dtype=np.int64)
    sizes[rank] = len(blob)
    sizes = np.asarray(allreduce_sum(sizes), dtype=np.int64).reshape(world)
    table = np.zeros((world, -(-int(sizes.max()) // 8)), dtype=np.int64)
    table[rank].view(np.uint8)[:len(blob)] = np.frombuffer(blob, dtype=np.uint8)
    # reshape: xgboost's allreduce gives a 2-D array back flat
    table = np.asarray(allreduce_sum(table), dtype=np.int64).reshape(table.shape)
    total = None
    for r in range(world):
        other = pickle.loads(table[r].view(np.uint8)[:int(sizes[r])].tobytes())
        total = other if total is None else total.merge(other)
    return total.result()


def sha256_of(chunks: Iterable[bytes]) -> str:
    """The hex sha256 of `chunks` concatenated (a `starts` record's digests)."""
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(chunk)
    return digest.hexdigest()


def read_state(checkpoint_dir: str) -> dict | None:
    """The state file of a checkpoint: a local directory, or one on the run's storage (s3://, gs://);
    None for a checkpoint being written, or not ours."""
    from rayline.storage import join, read_json

    state = read_json(join(checkpoint_dir, STATE_FILE))
    return state if isinstance(state, dict) else None


class EpochReporter:
    """Restore from Ray Train's latest checkpoint and report each epoch with a checkpoint."""

    def __init__(self, initial_checkpoint: str | None = None):
        """`initial_checkpoint`: where a new run starts (a Train checkpoint's path or URI) when
        Ray Train has no checkpoint of this run to restore (PBT's exploit: rayline.tune.handoff)."""
        import ray.train

        self._train = ray.train
        context = ray.train.get_context()
        self.rank = context.get_world_rank()
        self.world_size = context.get_world_size()
        self.history: list[dict] = []
        self.resumed_from: list[int] = []
        self.starts: list[dict] = []
        self.start_epoch = 0
        # When this attempt's worker began and reported (wall clock), for the run's phases
        # (rayline/pipeline/phases.py): rank 0's checkpoint state holds it.
        self.timeline: dict = {"started_at": time.time(), "loop_at": None, "first_step_s": None, "reports": []}
        self._meter: Throughput | None = None
        self._source: str | None = None
        self._restore_dir: str | None = None
        for prefix in (CKPT_PREFIX, RESTORE_PREFIX):
            sweep_orphans(tempfile.gettempdir(), prefix)
        checkpoint = ray.train.get_checkpoint()
        if checkpoint is None and initial_checkpoint:
            checkpoint = ray.train.Checkpoint(initial_checkpoint)
        if checkpoint is not None:
            # Copy locally: the model loads after this returns, and storage may be remote.
            self._restore_dir = owned_tempdir(tempfile.gettempdir(), RESTORE_PREFIX)
            local = checkpoint.to_directory(self._restore_dir)
            state = read_state(local) or {}
            self.history = state.get("history", [])
            self.resumed_from = state.get("resumed_from", []) + [state.get("epoch", -1)]
            self.starts = list(state.get("starts", []))
            self.start_epoch = state.get("epoch", -1) + 1
            self._source = checkpoint.path

    def meter(self) -> Throughput:
        """A new epoch's (or report interval's) Throughput; the first one's first step goes in the timeline."""
        if self.timeline["loop_at"] is None:  # the worker's setup is over: its first epoch begins
            self.timeline["loop_at"] = time.time()
        self._meter = Throughput()
        return self._meter

    @property
    def restore_model_dir(self) -> str | None:
        """The model directory to resume from, or None on a fresh start."""
        return os.path.join(self._restore_dir, MODEL_DIR) if self._restore_dir else None

    def record_start(self, evidence: dict) -> None:
        """Record the state this attempt trains from (see the module doc): call once the model and
        optimizer are built and restored, before the first step, with digests of the live objects."""
        # pid: the process that trained (a sweep's trials that train in process share theirs: rayline/tune/sweep.py).
        self.starts.append({"epoch": self.start_epoch - 1, "source": self._source, "workers": self.world_size,
                            "pid": os.getpid(), **evidence})

    def report(self, epoch: int, metrics: dict, save_model: Callable[[str], None], stats: dict | None = None) -> None:
        """Report `metrics` for `epoch` with a checkpoint made by `save_model(dir)` on rank 0;
        `stats`: the epoch's TRAINING_STATS (Throughput.stats), kept in the same row."""
        # `resumed`: restarts so far; rows trained before a restart keep the lower count.
        row = {"epoch": epoch, **{k: float(v) for k, v in metrics.items()}, **(stats or {}),
               "resumed": len(self.resumed_from)}
        self.history.append(row)
        reported = row
        if self.timeline["first_step_s"] is None and self._meter is not None:
            self.timeline["first_step_s"] = self._meter.first_step_s
        self.timeline["reports"].append({"epoch": epoch, "at": time.time(), "train_s": (stats or {}).get("train_s")})
        if self.rank != 0:
            self._train.report(reported, checkpoint=None)
            return
        tmp = owned_tempdir(tempfile.gettempdir(), CKPT_PREFIX)
        try:
            save_model(os.path.join(tmp, MODEL_DIR))
            state = {"epoch": epoch, "metrics": row, "history": self.history, "resumed_from": self.resumed_from,
                     "starts": self.starts, "timeline": self.timeline}
            with open(os.path.join(tmp, STATE_FILE), "w") as fh:
                json.dump(state, fh)
            # Deleted by Ray once uploaded, before report waits for the controller to take the
            # result (where a stopped trial's worker is killed).
            self._train.report(reported, checkpoint=self._train.Checkpoint.from_directory(tmp),
                               delete_local_checkpoint_after_upload=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def close(self) -> None:
        if self._restore_dir is not None:
            shutil.rmtree(self._restore_dir, ignore_errors=True)
            self._restore_dir = None
