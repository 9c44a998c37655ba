"""The data stage: read -> split -> fit preprocessing on train -> transform every split."""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from rayline.data.preprocess import (
    FEATURES,
    LABEL,
    FeatureInfo,
    FittedPreprocessing,
    LabelInfo,
    column_kind,
    fit_preprocessing,
)
from rayline.data.cache import cache_key, write_block
from rayline.data.progress import PhaseProgress, materialize
from rayline.data.profile import MAX_LABEL_VALUES, ProfileRequest, profile_dataset
from rayline.data.schema_check import infer_task
from rayline.data.split import HASH_COLUMN, TEST, TRAIN, VALID, AddRowHash, Thresholds
from rayline.data.values import value_key, value_rank
from rayline.data.feature_types import image_columns, with_default_steps, with_step_columns
from rayline.data.fingerprint import fingerprint
from rayline.data.in_process import as_dataset, read_in_process
from rayline.data.image_paths import ReadImageFiles, base_of, path_columns
from rayline.monitoring.statistics import TrainingStatistics
from rayline.data.sources import feature_columns, read_dataset, unwrap_data_error
from rayline.errors import DataError
from rayline.data.task_cpus import map_args

__all__ = ["PreparedData", "prepare_data", "prepare_variants", "to_training_batch", "PROBE_ROWS"]

# The probe (rayline/train/probe.py): this many raw rows of the test split, which the training loop
# predicts at every checkpoint and registration checks the artifact against. Bounded on purpose.
PROBE_ROWS = 256

log = logging.getLogger(__name__)


@dataclass
class PreparedData:
    """Model-ready splits (columns `features`, `label`) plus what the model artifact carries."""

    train: object  # ray.data.Dataset, materialized
    valid: object
    # The raw test rows (the valid split's without a test split), materialized in the object
    # store: the registered version's test metrics run the serving Predictor over them where
    # they are (rayline/evaluation/offline.py). No model-ready test split: nothing would read it.
    test_rows: object
    preprocessing: FittedPreprocessing
    fingerprint: str
    rows: dict[str, int]
    # The probe (rayline/train/probe.py): the PROBE_ROWS raw rows of the test split (the valid
    # split when there is none) with the smallest split hashes, in that order (the same rows
    # however the data is laid out in blocks), and the same rows model-ready, transformed
    # through Ray Data as the training data. Bounded, whatever the size of the data.
    probe: object = None  # ray.data.Dataset, materialized, one block
    probe_frame: pd.DataFrame | None = None
    phases: dict | None = None  # seconds per phase of the data stage (read, profile, fit, transform, ...)
    cache_key: str | None = None  # its entry in the data cache (data/cache.py), when the run has a cache
    cached: bool = False  # read back from the cache, not computed
    in_process: bool = False  # read and transformed in the run's process, not by Ray Data's tasks (data/in_process.py)
    # The train split's raw features summarised (rayline/monitoring/statistics.py): saved with the
    # model, the reference that batch scoring and the replicas compare what they see with.
    statistics: object = None

    @property
    def train_streamed(self) -> bool:
        """`train` holds the train split's rows as read (images still encoded), which the training
        workers transform per batch (rayline/train/loop.py), rather than model-ready rows."""
        return self.preprocessing.streams_train

    @property
    def task(self) -> str:
        return self.preprocessing.label.task

    def collect_test_rows(self) -> pd.DataFrame:
        """The raw test rows as one pandas frame in this process, with the dtypes `pd.read_csv`
        gives; for tests and small data (the run itself never gathers them)."""
        return _collect(self.test_rows)


class _Phases:
    """Seconds spent in each phase of the data stage (summed over variants), for the log, the
    progress line and benchmarks."""

    def __init__(self, progress=None):
        self.seconds: dict[str, float] = {}
        self.progress = progress
        self._last = time.monotonic()

    def done(self, phase: str, text: str | None = None, rows: int | None = None) -> None:
        now = time.monotonic()
        took = now - self._last
        self.seconds[phase] = self.seconds.get(phase, 0.0) + took
        self._last = now
        if text and self.progress is not None:
            rate = f", {rows / took:,.0f} rows/s" if rows and took > 0 else ""
            self.progress(f"{text} in {took:.1f} s{rate}")

    def __str__(self) -> str:
        return ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.seconds.items())


class _ToTrainingBatch:
    """Raw pandas batch -> {'features': float32 matrix, 'label': encoded labels}."""

    def __init__(self, preprocessing: FittedPreprocessing):
        self.preprocessing = preprocessing

    def __call__(self, batch: pd.DataFrame) -> dict:
        return to_training_batch(self.preprocessing, batch)


def to_training_batch(preprocessing: FittedPreprocessing, batch: pd.DataFrame) -> dict:
    return {
        FEATURES: preprocessing.transform(batch),
        LABEL: preprocessing.encode_labels(batch[preprocessing.label.name]),
    }


def prepare_data(spec) -> PreparedData:
    """Run the data stage for `spec` on the connected Ray cluster."""
    return prepare_variants(spec, [spec])[0]


def prepare_variants(spec, variants: list, progress=None, cache=None, tick=None) -> list[PreparedData]:
    """The data stage once per preprocessing variant: read and split once, fit and transform each.

    `variants`: specs equal to `spec` but for `data.preprocess` (a whole-pipeline sweep's
    preprocessing configurations). Every variant sees the same rows in the same splits, so
    trials on different preprocessing compare on equal terms.

    The rows are read once (only the columns the spec uses), each tagged with its split's hash
    (data/split.py), and kept in Ray's object store; one pass (data/profile.py) then gathers the
    label's classes, the split sizes, the probe rows and every statistic of every variant's
    steps; each variant is fitted from those statistics on the driver and transforms each split
    in one pass of whole blocks. `progress(text)` hears of each phase as it ends; `tick(text)`
    of the rows done so far in the long ones (reading, transforming), with a rate and the time
    left (data/progress.py).

    `cache` (data/cache.py's DataCache, or None): a variant whose output is there is read back
    instead (when every variant's is, nothing else is read); each one computed is stored.
    """
    phases = _Phases(progress)
    source = spec.data.source
    split = spec.data.split
    data_fingerprint = fingerprint(source)
    keys = [cache_key(v, data_fingerprint) for v in variants] if cache is not None else [None] * len(variants)
    hits = {}
    for i, key in enumerate(keys):
        loaded = cache.load(key) if key is not None else None
        if loaded is not None:
            hits[i] = loaded
    if hits:
        phases.done("cache read", f"{len(hits)} of {len(variants)} variants cached ({', '.join(keys[i] for i in hits)})"
                    if len(variants) > 1 else f"cached ({keys[0]})")
    if len(hits) == len(variants):
        prepared = [_from_cache(hits[i], keys[i], data_fingerprint) for i in range(len(variants))]
        _note_phases(prepared, phases)
        return prepared
    # Data that fits is read and mapped here, without Ray Data's tasks (data/in_process.py).
    ds = read_in_process(source) if spec.data.in_process == "auto" else None
    in_process = ds is not None
    if ds is None:
        ds = read_dataset(source)
    try:
        schema = ds.schema()
    except Exception as exc:
        raise DataError(f"data.source: cannot read {source.format} data: {exc}") from exc
    columns = list(schema.names)
    label = spec.data.label
    if label not in columns:
        raise DataError(f"data.label: no such column in the data (got {label!r}; allowed: {', '.join(columns[:20])})")
    names = feature_columns(spec.data, columns)
    missing = [c for c in names if c not in columns]
    if missing:
        raise DataError(f"data.features: no such columns in the data (got {missing}; allowed: {', '.join(columns[:20])})")
    key = split.key
    if key is not None and key not in columns:
        raise DataError(f"data.split.key: no such column in the data (got {key!r}; allowed: {', '.join(columns[:20])})")
    kinds = dict(zip(schema.names, (column_kind(t) for t in schema.types)))
    ds, variants = _typed(ds, source, names, kinds, variants)
    read = names + [label] + ([key] if key is not None and key not in names and key != label else [])
    hashed = ds.select_columns(read, **map_args()).map_batches(
        AddRowHash([key] if key is not None else names + [label], split.seed), batch_format="pyarrow", batch_size=None,
        **map_args())
    probe_split = TEST if split.test > 0 else VALID
    request = ProfileRequest.for_steps(label, names, kinds, [v.data.preprocess for v in variants],
                                       valid=split.valid, test=split.test, probe_rows=PROBE_ROWS, probe_split=probe_split)
    try:
        # Kept in the object store (spilled to disk beyond it): the profile pass and each split's
        # transform read it there instead of parsing the files again.
        hashed = materialize(hashed, PhaseProgress(tick, "reading") if tick else None)
        phases.done("read", f"read and hashed {hashed.num_blocks()} blocks"
                            + (" in this process (data.in_process)" if in_process else ""))
        profile = profile_dataset(hashed, request)
        total = sum(profile.rows.values())
        phases.done("profile", f"profiled {total:,} rows (train/valid/test {profile.rows[TRAIN]:,}/"
                               f"{profile.rows[VALID]:,}/{profile.rows[TEST]:,})", rows=total)
    except Exception as exc:  # a bad later file or block: Ray's remote traceback -> our one line
        raise unwrap_data_error(exc, source) from exc

    if profile.label_nulls:
        raise DataError(f"data.label: {profile.label_nulls} rows have no label in column {label!r} (allowed: drop them from the data)")
    classes = profile.label_values
    label_kind = kinds[label]
    task = spec.task or infer_task(label_kind, len(classes) if classes is not None else MAX_LABEL_VALUES + 1)
    if task == "classification":
        if classes is None:
            raise DataError(f"data.label: classification with more than {MAX_LABEL_VALUES:,} distinct labels in "
                            f"column {label!r} (allowed: task: regression, or fewer classes)")
        if len(classes) < 2:
            raise DataError(f"data.label: classification needs at least 2 classes (got {list(classes)})")
        label_info = LabelInfo(name=label, task=task, classes=sorted({value_key(c) for c in classes}, key=value_rank))
    else:
        if label_kind in ("string", "boolean"):
            raise DataError(f"task: regression needs a numeric label (got {label!r}, a {label_kind} column)")
        label_info = LabelInfo(name=label, task=task)

    if total < 10:
        raise DataError(f"data.source: too few rows to split into train/valid/test (got {total}; allowed: >= 10)")
    wanted = [TRAIN, VALID] + ([TEST] if split.test > 0 else [])
    empty = [s for s in wanted if not profile.rows[s]]
    if empty:
        raise DataError(f"data.split: the {' and '.join(empty)} split of {total} rows came out empty (the split is by "
                        f"a hash of each row, so its sizes are the fractions only on average; got valid "
                        f"{split.valid:g}, test {split.test:g}; allowed: more rows, or larger fractions)")
    features = [FeatureInfo(name=c, kind=kinds[c]) for c in names]
    probe_frame = None if profile.probe is None else _read_as_pandas_would(profile.probe.drop(columns=[HASH_COLUMN]))
    # With a cache, the tasks that compute each split's blocks also write them into the entries
    # (data/cache.py: no second pass over the data); the raw test rows once, for every entry.
    shared_test_rows = cache.scratch("test-rows") if cache is not None else None
    try:
        try:
            test_rows = as_dataset(hashed.map_batches(
                _SplitRows(split, probe_split, names + [label], shared_test_rows),
                batch_format="pyarrow", batch_size=None, **map_args()).materialize())
        except Exception as exc:
            raise _unwrap_data_error(exc) from exc
        phases.done("test rows")
        prepared = []
        for i, variant in enumerate(variants):
            if i in hits:
                prepared.append(_from_cache(hits[i], keys[i], data_fingerprint))
                continue
            fitted = fit_preprocessing(profile.train_stats(), features, label_info, variant.data.preprocess)
            statistics = TrainingStatistics.of_profile(
                profile, features, {c for step in fitted.steps if step.kind == "one_hot" for c in step.columns})
            phases.done("fit")
            entry = cache.writer(keys[i]) if keys[i] is not None else None
            with entry or contextlib.nullcontext():
                prepared.append(_transformed(hashed, split, fitted, test_rows, data_fingerprint, probe_frame,
                                             profile.rows, entry, tick))
                prepared[-1].statistics = statistics
                prepared[-1].in_process = in_process
                which = f" {len(prepared)}/{len(variants)}" if len(variants) > 1 else ""
                streamed = " (the train split as read: its images are decoded in training, once when they fit its memory)" \
                    if fitted.streams_train else ""
                phases.done("transform", f"transformed{which} {total:,} rows to {len(fitted.output_columns)} features"
                                         + streamed + (" (and stored them in the data cache)" if entry else ""), rows=total)
                if entry is not None:
                    prepared[-1].cache_key = keys[i]
                    entry.link("test_rows", str(shared_test_rows))
                    entry.commit(prepared[-1], {"pipeline": variant.name, "source": source.path or source.name,
                                                "statistics": statistics.to_dict(),
                                                "fingerprint": data_fingerprint, "rows": prepared[-1].rows,
                                                "features": len(fitted.output_columns)})
                    count, size = cache.size()
                    phases.done("cache write", f"stored in the data cache ({keys[i]}; the cache: {count} "
                                               f"entr{'y' if count == 1 else 'ies'}, {size / 2**20:,.1f} MiB, "
                                               "`rayline cache prune` frees it)")
    finally:
        if shared_test_rows is not None:
            cache.remove(shared_test_rows)
    _note_phases(prepared, phases)
    return prepared


def _typed(ds, source, names: list[str], kinds: dict[str, str], variants: list):
    """(the Dataset with image file paths read into the files' bytes, the variants with the default
    steps of data.feature_types appended: data/feature_types.py). Updates `kinds` in place."""
    import functools

    filled = []  # image and text steps without columns get the data's only column of their kind
    for variant in variants:
        data, problems = with_step_columns(variant.data, names, kinds)
        if problems:
            raise DataError("; ".join(problems))
        filled.append(variant if data is variant.data else variant.model_copy(update={"data": data}))
    variants = filled
    images = sorted({c for v in variants for c in image_columns(v.data, names)})
    strings = [c for c in images if kinds.get(c) == "string"]
    if strings:
        sample = ds.select_columns(strings, **map_args()).take_batch(_PATHS_SAMPLED, batch_format="pyarrow")
        paths = path_columns(sample, strings, "data.source")
        if paths:
            # Small batches: a block of paths may name thousands of files.
            ds = ds.map_batches(ReadImageFiles(paths, base_of(source.path)), batch_format="pyarrow",
                                batch_size=_FILES_PER_BATCH, **map_args())
            kinds.update({c: "binary" for c in paths})

    @functools.cache
    def first_image(col):
        values = [v for v in ds.select_columns([col], **map_args()).take_batch(_PATHS_SAMPLED, batch_format="pyarrow")
                  .column(col).to_pylist() if v is not None]
        if not values:
            raise DataError(f"data.feature_types.{col}: no image in the first rows to infer the size from "
                            "(allowed: an image step with a size)")
        return values[0]

    typed = []
    for variant in variants:
        steps, problems = with_default_steps(variant.data, names, kinds, first_image)
        if problems:
            raise DataError("; ".join(problems))
        typed.append(variant if len(steps) == len(variant.data.preprocess) else variant.model_copy(
            update={"data": variant.data.model_copy(update={"preprocess": steps})}))
    return ds, typed


_PATHS_SAMPLED = 20  # rows read to tell path columns apart and to infer an image size
_FILES_PER_BATCH = 256  # image files read per batch of a path column


def _note_phases(prepared: list, phases: "_Phases") -> None:
    for data in prepared:
        data.phases = dict(phases.seconds)
    log.info("data stage: %s", phases)


def _from_cache(loaded, key: str, data_fingerprint: str) -> PreparedData:
    """A variant's output as the cache holds it (data/cache.py)."""
    meta, fitted, datasets, probe_frame = loaded
    return PreparedData(
        train=datasets["train"], valid=datasets["valid"], test_rows=datasets["test_rows"],
        preprocessing=fitted, fingerprint=data_fingerprint, rows=dict(meta["rows"]),
        probe=_probe_dataset(probe_frame, fitted), probe_frame=probe_frame, cache_key=key, cached=True,
        statistics=TrainingStatistics.from_dict(meta["statistics"]) if meta.get("statistics") else None)


def _probe_dataset(probe_frame, fitted):
    """The probe rows model-ready, as one block that keeps the probe frame's order: transformed
    here (a bounded sample: PROBE_ROWS rows) into the Arrow table the transform tasks make of a
    batch (`_training_table`), with its metadata computed here too (`from_blocks`).

    No Ray task: a data stage read from the cache hands training Datasets whose reads are still
    going on, and a task waiting behind them (`from_pandas` runs one for a block's metadata) took
    0.2-0.5 s of a 0.3-0.7 s stage; a lazy transform task needing a CPU waited forever once Train's
    workers held every CPU."""
    import ray.data

    if probe_frame is None:
        return None
    return ray.data.from_blocks([_training_table(to_training_batch(fitted, probe_frame))])


def _training_table(batch: dict):
    """The Arrow table Ray Data makes of a model-ready batch's dict (features as a tensor column)."""
    import pyarrow as pa
    from ray.data.extensions import ArrowTensorArray

    return pa.table({FEATURES: ArrowTensorArray.from_numpy(batch[FEATURES]), LABEL: batch[LABEL]})


class _SplitRows:
    """A picklable map_batches callable: the raw rows of one split (hash column dropped), also
    written into `folder` (a data cache's, data/cache.py) when given."""

    def __init__(self, split, which: str, columns: list[str], folder=None):
        self.thresholds, self.which, self.columns = Thresholds(split.valid, split.test), which, columns
        self.folder = None if folder is None else str(folder)

    def __call__(self, table):
        rows = _rows_of(table, self.thresholds, self.which)
        out = rows.select(self.columns)
        if self.folder is not None:
            write_block(out, self.folder, rows.column(HASH_COLUMN).to_numpy())
        return out


def _rows_of(table, thresholds: Thresholds, which: str):
    """The rows of an Arrow block (with HASH_COLUMN) that fall in split `which`; the train split's
    in a pseudo-random order (see _SplitToTrainingBatch)."""
    import pyarrow as pa

    hashes = table.column(HASH_COLUMN).to_numpy()
    mask = thresholds.mask(hashes, which)
    rows = table.filter(pa.array(mask))
    if which != TRAIN or rows.num_rows < 2:
        return rows
    # A permutation drawn from the block's own hashes: the same rows give the same order on every
    # run, in O(n) (sorting by hash took 0.18 s per 800,000 rows, a fifth of the transform).
    seed = int(np.bitwise_xor.reduce(hashes[mask]))
    return rows.take(pa.array(np.random.default_rng(seed).permutation(rows.num_rows)))


class _SplitToTrainingBatch:
    """A picklable map_batches callable: one split's rows of a block, model-ready.

    The train split's rows come out in the order of their hashes: a pseudo-random permutation
    within each block, the same on every run. With the blocks' order randomized too (below) and
    the training loops' local shuffle buffer, training does not see a sorted file in its order
    (iris is sorted by class); the split by hash alone kept it."""

    def __init__(self, split, which: str, preprocessing: FittedPreprocessing, folder: str | None = None):
        self.thresholds, self.which, self.preprocessing = Thresholds(split.valid, split.test), which, preprocessing
        self.folder = folder  # the split's folder in a data cache entry being written, or None

    def __call__(self, table):
        rows = _rows_of(table, self.thresholds, self.which)
        batch = to_training_batch(self.preprocessing, rows.drop_columns([HASH_COLUMN]).to_pandas())
        # The Arrow table Ray Data would make of the batch's dict, made here to be written too.
        out = _training_table(batch)
        if self.folder is not None:
            write_block(out, self.folder, rows.column(HASH_COLUMN).to_numpy())
        return out


def _read_as_pandas_would(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with the dtypes pd.read_csv gives: Ray Data's pandas batches hold strings as
    `string[pyarrow]` (pd.NA), a reader's as `str` (NaN)."""
    import pyarrow as pa

    return pa.Table.from_pandas(frame, preserve_index=False).to_pandas(ignore_metadata=True)


def _collect(rows) -> pd.DataFrame:
    """A dataset of raw rows as one pandas frame with numpy dtypes, as `pd.read_csv` would give.

    Joined here rather than by `Dataset.to_pandas`, which gave Arrow-backed columns for some
    block layouts and `object` for others (files whose readers inferred int64 and double)."""
    import pyarrow as pa
    import ray

    tables = ray.get(rows.to_arrow_refs())
    # ignore_metadata: strings as pandas' default `str` columns, as pd.read_csv gives them (pandas
    # metadata some blocks carry made them `string[pyarrow]` with pd.NA instead).
    return pa.concat_tables(tables, promote_options="permissive").to_pandas(ignore_metadata=True)


def _transformed(hashed, split, fitted, test_rows, data_fingerprint, probe_frame, rows, entry=None,
                 tick=None) -> PreparedData:
    """The train and valid splits model-ready through `fitted`: one pass of whole blocks each,
    which also writes them into the cache `entry` (data/cache.py's EntryWriter) when given."""

    def convert(which):
        folder = entry.folder(which) if entry is not None else None
        if which == TRAIN and fitted.streams_train:  # the rows as read: transformed per batch in training
            columns = [f.name for f in fitted.features] + [fitted.label.name]
            step = _SplitRows(split, TRAIN, columns, folder)
        else:
            step = _SplitToTrainingBatch(split, which, fitted, folder)
        ds = hashed.map_batches(step, batch_format="pyarrow", batch_size=None, **map_args())
        out = materialize(ds, PhaseProgress(tick, f"transforming {which}", total_rows=rows[which]) if tick else None)
        # The blocks' order shuffled once they are all there: a reordering of their references,
        # no data moves. (Inside the plan, before the progress count, it held back every block
        # until the last was done: 100M rows showed one line, "~4,921 s left", for 100 s.)
        return as_dataset(out.randomize_block_order(seed=split.seed).materialize() if which == TRAIN else out)

    try:
        train, valid = convert(TRAIN), convert(VALID)
        probe = _probe_dataset(probe_frame, fitted)
    except Exception as exc:  # surface our DataError from inside Ray Data tasks
        raise _unwrap_data_error(exc) from exc
    return PreparedData(
        train=train,
        valid=valid,
        test_rows=test_rows,
        preprocessing=fitted,
        fingerprint=data_fingerprint,
        rows={"train": rows[TRAIN], "valid": rows[VALID], "test": rows[TEST] if split.test > 0 else 0},
        probe=probe,
        probe_frame=probe_frame,
    )


def _unwrap_data_error(exc: Exception) -> Exception:
    text = str(exc)
    marker = "rayline.errors.DataError: "
    if marker in text:
        return DataError(text.split(marker, 1)[1].strip().splitlines()[0])
    cause = exc
    while cause is not None:
        if isinstance(cause, DataError):
            return cause
        cause = cause.__cause__
    return DataError(f"data.preprocess: transforming the data failed: {text.splitlines()[0] if text else exc!r}")

