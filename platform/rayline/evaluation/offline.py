"""Test metrics of a model artifact, computed where the test rows are.

The registered version's test metrics come from the serving Predictor (compiled preprocessing,
then the model: the code every Serve replica runs) on the raw test rows. The rows stay in Ray's
object store: one Ray Data task per block predicts its rows and returns their
`MetricPartials` (rayline/evaluation/metrics.py), a few KB whatever the block's size; the driver
merges them. Nothing in the driver grows with the test split.

The artifact travels as a tar in the object store (a few MB: the weights and the fitted
preprocessing), so workers on any node can load it; each worker process loads it once.

A test split that is already in the object store and small (IN_PROCESS_BYTES) is predicted in
this process instead, block by block, with the same Predictor and the same partials: the tasks'
fixed cost (a worker that loads the framework and the model, Ray Data's executor) was most of the
register stage (4.4 of ~6 s for digits' 171 test rows on the 2-core machine), and the driver has
imported the framework already to build its trainer.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import tarfile
import tempfile

from rayline.data.task_cpus import map_args

__all__ = ["evaluate_rows"]

_PARTIAL = "partial"
_LOADED: dict[str, object] = {}  # artifact digest -> Predictor, per worker process

# The most bytes of materialized test rows predicted in this process (a few seconds of prediction
# at most); more, or rows still to be computed, go to Ray Data tasks where the blocks are.
IN_PROCESS_BYTES = 32 * 2**20


def evaluate_rows(artifact_dir: str, rows, with_partials: bool = False, in_process: bool | None = None):
    """Metrics of the artifact on `rows` (a Ray Dataset of raw labelled rows: features and label);
    with `with_partials`, (metrics, the merged MetricPartials: its confusion matrix, ...).
    `in_process`: predict here (True), in Ray Data tasks (False), or decide by size (None)."""
    import json

    from rayline.inference.predictor import META_FILE, artifact_root
    from rayline.evaluation.metrics import MetricPartials

    with open(os.path.join(artifact_root(artifact_dir), META_FILE)) as fh:
        task = json.load(fh)["task"]
    if in_process is None:
        in_process = _small(rows)
    total = _here(artifact_dir, rows) if in_process else _in_tasks(artifact_dir, rows)
    total = total or MetricPartials(task)
    return (total.result(), total) if with_partials else total.result()


def _small(rows) -> bool:
    from ray.data.dataset import MaterializedDataset

    return isinstance(rows, MaterializedDataset) and (rows.size_bytes() or 0) <= IN_PROCESS_BYTES


def _here(artifact_dir: str, rows):
    """The merged partials, predicted in this process one block at a time."""
    from rayline.inference.predictor import Predictor

    predictor, total = Predictor(artifact_dir), None
    for batch in rows.iter_batches(batch_format="pyarrow", batch_size=None):
        part = _partials(predictor, batch)
        total = part if total is None else total.merge(part)
    return total


def _partials(predictor, table):
    """One block's raw rows (a pyarrow table) -> their MetricPartials."""
    # ignore_metadata: strings as pandas' default columns, as `pd.read_csv` and serving give them.
    return predictor.metric_partials(table.to_pandas(ignore_metadata=True))


def _in_tasks(artifact_dir: str, rows):
    """The merged partials of one Ray Data task per block."""
    import ray

    blob = _pack(artifact_dir)
    partials = rows.map_batches(_block_partials, fn_kwargs={"artifact": ray.put(blob), "digest": hashlib.sha256(blob).hexdigest()},
                                batch_format="pyarrow", batch_size=None, zero_copy_batch=True, **map_args())
    total = None
    try:
        for batch in partials.iter_batches(batch_format="pyarrow", batch_size=None):
            for data in batch.column(_PARTIAL).to_pylist():
                part = pickle.loads(data)
                total = part if total is None else total.merge(part)
    except Exception as exc:  # a DataError in a task (a test row the model cannot take): its own line
        from rayline.errors import DataError

        # Ray Data re-raises a task's error as RayTaskError(UserCodeException), whose text holds
        # the remote traceback ending in ours.
        marker = "rayline.errors.DataError: "
        if marker not in str(exc):
            raise
        raise DataError(str(exc).split(marker, 1)[1].strip().splitlines()[0]) from exc
    return total


def _block_partials(table, artifact, digest: str):
    """One block's raw rows -> a one-row table holding their pickled MetricPartials."""
    import pyarrow as pa

    part = _partials(_predictor(artifact, digest), table)
    return pa.table({_PARTIAL: pa.array([pickle.dumps(part)], type=pa.binary())})


def _predictor(artifact, digest: str):
    if digest not in _LOADED:
        import ray

        from rayline.inference.predictor import Predictor

        blob = ray.get(artifact)
        with tempfile.TemporaryDirectory(prefix="rayline-eval-") as tmp:
            with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
                tar.extractall(tmp, filter="data")
            _LOADED.clear()  # one artifact at a time: a worker reused by another run frees the last
            _LOADED[digest] = Predictor(tmp)
    return _LOADED[digest]


def _pack(artifact_dir: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in sorted(os.listdir(artifact_dir)):
            tar.add(os.path.join(artifact_dir, name), arcname=name)
    return buffer.getvalue()
