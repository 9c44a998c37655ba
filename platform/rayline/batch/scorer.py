"""What both batch-scoring engines share: the scorer (a model applied to whole pandas batches), the
input's column checks, the output's writer, and Ray's errors as one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rayline.client import PREDICTION_COLUMN, probability_column
from rayline.errors import DataError, RegistryError

__all__ = ["OUTPUT_SUFFIXES", "BATCH_ROWS", "WRITE_ROWS", "Source", "Scorer", "CountDrift", "CountAnswers",
           "check_columns", "parquet_rows", "unwrap", "is_ray_error", "model_meta", "model_statistics",
           "write_tables"]

OUTPUT_SUFFIXES = (".parquet", ".pq")


# Rows per model call in an actor. 8,192 digits rows are 4 MB of float64 input: large enough
# that per-batch overhead (Arrow -> pandas, one torch call) is small, small enough that a few
# in flight per actor keep memory flat.
BATCH_ROWS = 8192


# Rows per Parquet row group in the output (and per driver-side batch).
WRITE_ROWS = 65536


@dataclass
class Source:  # what data.sources.read_dataset reads (the spec's data.source shape)
    format: str
    path: str
    name: str | None = None
    labelled: bool = False  # image_folder: images may sit directly in the folder (no class: label null)


class CountDrift:
    """A picklable map_batches callable for the Ray engine: one pandas block of input rows ->
    one row holding its drift counts (pickled), merged on the driver."""

    def __init__(self, statistics_dict: dict):
        self.statistics_dict = statistics_dict

    def __call__(self, batch):
        import pickle

        from rayline.monitoring.drift import FeatureCounts
        from rayline.monitoring.statistics import TrainingStatistics

        counts = FeatureCounts.of_frame(TrainingStatistics.from_dict(self.statistics_dict), batch)
        return {"counts": [pickle.dumps(counts)]}


class CountAnswers:
    """Counts the answers written, table by table on the driver, into the version's prediction
    reference (rayline/monitoring): both engines write every scored table from this process, so
    prediction drift needs no pass of its own."""

    def __init__(self, statistics_dict: dict | None):
        from rayline.monitoring.statistics import TrainingStatistics

        self.statistics = TrainingStatistics.from_dict(statistics_dict) if statistics_dict is not None else None
        self.counts = None  # FeatureCounts holding only `predictions`, once an answer is counted

    def through(self, tables):
        """`tables`, unchanged, counted as they pass."""
        for table in tables:
            self._count(table)
            yield table

    def _count(self, table) -> None:
        from rayline.monitoring.drift import FeatureCounts, answer_bins

        if self.statistics is None or self.statistics.predictions is None:
            return
        binned = answer_bins(self.statistics, table.column(PREDICTION_COLUMN).to_numpy(zero_copy_only=False))
        self.counts = (self.counts or FeatureCounts()).add_predictions(*binned)

    def into(self, counts):
        """Feature `counts` (or None) with the answers' counts added."""
        if self.counts is None:
            return counts
        if counts is None:
            return self.counts
        counts.predictions = self.counts.predictions
        return counts


class Scorer:
    """One per Ray Data actor: loads the model once, scores pandas batches with numpy."""

    def __init__(self, name: str, version: str, workspace: str, tracking_uri: str | None, probabilities: bool,
                 keep: list[str], image_base: str | None = None, count_drift: bool = False):
        import numpy as np
        import pyarrow as pa

        from rayline import load_model

        self.predictor = load_model(name, version, workspace=workspace, tracking_uri=tracking_uri)
        self.probabilities = probabilities
        self.keep = keep
        prep = self.predictor.preprocessing
        self.features = [f.name for f in prep.features]
        self.required = [f.name for f in prep.features if not f.nullable]
        self.classification = self.predictor.task == "classification"
        classes = [c.item() if isinstance(c, np.generic) else c for c in (prep.label.classes or [])]
        self.labels = pa.array(classes) if self.classification else None
        self.prob_columns = [probability_column(str(c)) for c in classes]
        self.where = f"model {name} v{version}"
        # Image columns may name files, relative to the input's folder (data/image_paths.py).
        self.image_columns = [c for step in prep.steps if step.kind == "image" for c in step.image_columns]
        self.image_base = image_base
        # Drift against the version's training statistics (rayline/monitoring), counted per batch
        # where the counts can be read back: in this process (the local engine). Ray's scoring
        # actors cannot hand them back; that engine counts in a pass of its own (CountDrift).
        from rayline.monitoring.drift import FeatureCounts

        self.statistics = self.predictor.statistics
        self.counts = FeatureCounts() if count_drift and self.statistics is not None else None

    def __call__(self, batch):
        import numpy as np
        import pyarrow as pa

        missing = batch[self.required].isna().any(axis=0)
        if missing.any():
            bad = [c for c, m in missing.items() if m]
            raise DataError(f"--input: column(s) {bad} hold missing values and {self.where} imputes none of them "
                            "(allowed: a value in every row of these columns)")
        inputs = batch[self.features]
        if self.counts is not None:
            from rayline.monitoring.drift import FeatureCounts

            self.counts.merge(FeatureCounts.of_frame(self.statistics, inputs))
        if self.image_columns and self.image_base is not None:
            inputs = self._read_image_files(inputs)  # the kept columns keep the paths
        x = self.predictor.preprocessing.transform(inputs)  # the compiled transform serving runs
        outputs = self.predictor.infer(x)
        columns = {c: pa.array(batch[c], from_pandas=True) for c in self.keep}
        if self.classification:
            columns[PREDICTION_COLUMN] = self.labels.take(pa.array(outputs.argmax(axis=1)))
            if self.probabilities:
                probs = np.asarray(outputs, dtype=np.float64)
                for i, name in enumerate(self.prob_columns):
                    columns[name] = pa.array(probs[:, i])
        else:
            columns[PREDICTION_COLUMN] = pa.array(np.asarray(outputs, dtype=np.float64).reshape(-1))
        return pa.table(columns)


    def _read_image_files(self, batch):
        from rayline.data.image_paths import looks_like_path, read_image_file

        batch = batch.copy()
        for col in (c for c in self.image_columns if c in batch):
            try:
                batch[col] = [read_image_file(v, self.image_base, col) if looks_like_path(v) else v for v in batch[col]]
            except DataError as exc:
                raise DataError(f"--input: {exc}") from None
        return batch


def check_columns(names: list[str], features: list[str], keep: list[str] | None, where: str,
                   out_columns: list[str]) -> list[str]:
    missing = [f for f in features if f not in names]
    if missing:
        shown = ", ".join(names[:8]) + (f", ... ({len(names)} in all)" if len(names) > 8 else "")
        raise DataError(f"--input: missing feature column{'s' if len(missing) > 1 else ''} "
                        f"{', '.join(repr(m) for m in missing[:10])}{' ...' if len(missing) > 10 else ''} that {where} "
                        f"needs (got columns: {shown})")
    if keep is None:
        keep = [n for n in names if n not in out_columns]
    else:
        absent = [k for k in keep if k not in names]
        if absent:
            raise DataError(f"--keep: no such input column {', '.join(repr(a) for a in absent)} "
                            f"(allowed: {', '.join(names[:20])}{' ...' if len(names) > 20 else ''})")
        clash = [k for k in keep if k in out_columns]
        if clash:
            raise DataError(f"--keep: column {clash[0]!r} would clash with an output column "
                            f"(allowed: input columns other than {', '.join(out_columns[:3])}...)")
    return list(dict.fromkeys(keep))


def parquet_rows(files: list[str]) -> int | None:
    import pyarrow.parquet as pq

    try:
        return sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    except Exception:  # unreadable footers are reported by the read itself
        return None


def unwrap(exc: BaseException, source=None) -> DataError:
    """The DataError a scoring or read task raised, through Ray Data's UserCodeException ("UDF
    failed to process a data block") and Ray's RayTaskError, else `unwrap_data_error`'s line."""
    from rayline.data.sources import unwrap_data_error

    seen, marker = [exc], "rayline.errors.DataError: "
    while seen:
        err = seen.pop()
        if isinstance(err, DataError) and not type(err).__name__.startswith("RayTaskError"):
            return DataError(str(err).splitlines()[0])
        if marker in str(err):
            return DataError(str(err).split(marker, 1)[1].strip().splitlines()[0])
        seen += [e for e in (getattr(err, "cause", None), err.__cause__, err.__context__) if isinstance(e, BaseException)]
    return unwrap_data_error(exc, source)


def is_ray_error(exc: BaseException) -> bool:
    module = type(exc).__module__
    # "ray" or "ray.*" only: rayline's own errors (module "rayline.errors") are not Ray's.
    return module == "ray" or module.startswith("ray.") or "RayTaskError" in type(exc).__name__


def model_meta(registry, mv) -> tuple[list[str], str, list]:
    """(feature names, task, class labels) of a version, from its artifact's preprocessing.json."""
    import json

    from rayline.inference.predictor import META_FILE, PREPROCESSING_FILE, artifact_root

    # The files sit at the root (older versions) or under the MLflow pyfunc model's artifacts/;
    # read as JSON, so the driver never imports the model's framework (the actors load it).
    try:
        root = Path(artifact_root(registry.download(mv)))
    except DataError as exc:
        raise RegistryError(f"model {mv.name!r} version {mv.version}: {exc}") from exc
    meta = root / META_FILE
    if not (root / PREPROCESSING_FILE).is_file():
        raise RegistryError(f"model {mv.name!r} version {mv.version}: not a rayline model (no {PREPROCESSING_FILE} "
                            f"in {root})")
    with open(root / PREPROCESSING_FILE) as fh:
        prep = json.load(fh)
    with open(meta) as fh:
        task = json.load(fh)["task"]
    return [f["name"] for f in prep["features"]], task, prep["label"].get("classes") or []


def model_statistics(registry, mv) -> dict | None:
    """A version's training statistics (rayline/monitoring/statistics.py) as a dict, read as JSON
    from its artifact; None for versions registered before they were kept."""
    import json

    from rayline.inference.predictor import artifact_root
    from rayline.monitoring.statistics import STATISTICS_FILE

    path = Path(artifact_root(registry.download(mv))) / STATISTICS_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def write_tables(tables, tmp: Path, total: int | None, progress) -> int:
    """Append Arrow tables to the Parquet file `tmp`, one row group of up to WRITE_ROWS each
    (cast to the first table's schema); returns the rows written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    writer = None
    rows = 0
    try:
        for table in tables:
            if writer is None:
                writer = pq.ParquetWriter(tmp, table.schema)
            elif table.schema != writer.schema:
                try:
                    table = table.cast(writer.schema)
                except (pa.ArrowException, ValueError) as exc:
                    raise DataError(f"--input: a column's type changes between files or blocks ({exc}; allowed: one "
                                    "type per column)") from exc
            writer.write_table(table, row_group_size=WRITE_ROWS)
            rows += table.num_rows
            if progress is not None:
                progress(rows, total)
    finally:
        if writer is not None:
            writer.close()
    if writer is None:
        raise DataError("--input: holds no rows (got 0 rows)")
    return rows
