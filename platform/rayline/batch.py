"""Offline batch scoring: a registered model over a dataset, into one Parquet file.

    rayline predict digits --version 3 --input data/ --output scores.parquet --keep id [--engine auto|local|ray]

Two engines compute the same output, streaming end to end so memory stays bounded by a few
batches whatever the input's size:
- `ray`: Ray Data reads the input with the same readers as training (`data.sources.read_dataset`:
  same types, same missing values) -> `map_batches` on an autoscaling pool of actors, each loading
  the model once (`rayline.load_model`, the Predictor every Serve replica runs) and applying its
  compiled preprocessing to whole pandas batches (numpy, no per-row Python) -> the driver iterates
  the results in input order (`preserve_order`) and writes them.
- `local`: the same `_Scorer` in this process, over batches read by a background thread with
  Arrow's own multi-threaded readers (Parquet row groups; CSV blocks with training's convert
  options). On one machine with no cluster, starting an embedded Ray and its actors was most of
  the time: 1M digits rows took 22.1 s on Ray against 9.2 s for pandas + load_model by hand
  (benchmarks/batch_scoring.py, 2-core machine; Ray start and the actors' model loads alone ~10 s).
- `auto` (the default): `ray` when there is a cluster to use (this process already runs Ray,
  --address, RAY_ADDRESS or a `rayline cluster up` head), or the input is not local Parquet or
  CSV (object storage, JSON); else `local`.
Either way the output is written under a temporary name and renamed when complete, so a failure
never leaves a half-written output. Output rows are in input order; `--keep` columns (default:
all input columns) carry an id to join on as well.

Columns: the kept input columns, `prediction` (the label, as the endpoint answers), and with
probabilities one `probability_<label>` per class (the names `rayline.Client` uses).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from rayline.client import PREDICTION_COLUMN, probability_column
from rayline.errors import DataError, RegistryError, ResourceError

__all__ = ["ScoreResult", "score", "plan_scorers", "input_files", "choose_engine", "ENGINES", "OUTPUT_SUFFIXES",
           "BATCH_ROWS"]

OUTPUT_SUFFIXES = (".parquet", ".pq")
# Rows per model call in an actor. 8,192 digits rows are 4 MB of float64 input: large enough
# that per-batch overhead (Arrow -> pandas, one torch call) is small, small enough that a few
# in flight per actor keep memory flat.
BATCH_ROWS = 8192
# Rows per Parquet row group in the output (and per driver-side batch).
WRITE_ROWS = 65536
# A row-group read is mostly decoding: a quarter CPU each, so reads fit beside served models.
ROW_GROUP_READ_CPUS = 0.25
# Object store memory Ray Data may fill with blocks in flight (read ahead, scored, not yet written).
OBJECT_STORE_BUDGET = 512 * 2**20
ENGINES = ("auto", "local", "ray")
# The local engine: batches read ahead of the scorer by the reader thread (each WRITE_ROWS rows).
LOCAL_READ_AHEAD = 2
# Bytes of CSV Arrow parses per block in the local engine (its own threads parse a block's chunks).
LOCAL_CSV_BLOCK = 16 * 2**20


@dataclass
class ScoreResult:
    output: str
    rows: int
    seconds: float
    model: str
    version: str
    columns: list[str] = field(default_factory=list)
    engine: str = "ray"  # where it ran: "ray" or "local" (choose_engine)

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else float("nan")


def plan_scorers(available_cpus: float, read_cpus: float = 1.0) -> tuple[int, float]:
    """(most scoring actors, CPUs each) for the free logical CPUs of the cluster.

    `read_cpus` stay for Ray Data's read tasks (1 for its CSV/JSON readers, 0.25 for rayline's
    Parquet row-group reads); the actors share the rest (a fraction of a CPU each when less
    than one is left, as on a 2-CPU machine that also serves models). Too few free CPUs: a
    ResourceError now, before anything runs, instead of a job waiting forever for a CPU.
    """
    needed = read_cpus + 0.1
    if available_cpus < needed - 1e-9:
        raise ResourceError(f"batch scoring: needs at least {needed:g} free logical CPUs, {read_cpus:g} to read and "
                            f"some to score (got {available_cpus:g} free; allowed: free CPUs, e.g. delete Serve apps "
                            "or use fewer replicas, or a cluster in RAY_ADDRESS)")
    rest = available_cpus - read_cpus
    if rest < 2.0:
        return 1, round(min(1.0, rest), 2)
    return min(int(rest), 8), 1.0


def input_files(path: str) -> tuple[str, list[str]]:
    """(format, files) of --input: one file (format from its suffix) or a directory of one format."""
    from rayline.data.sources import FORMAT_SUFFIXES, format_of, is_uri

    if is_uri(path):
        return format_of(path), [path]
    if os.path.isfile(path):
        try:
            return format_of(path), [path]
        except DataError as exc:
            raise DataError(f"--input: {exc}") from exc
    if not os.path.isdir(path):
        raise DataError(f"--input: no such file or directory (got {path!r})")
    found: dict[str, list[str]] = {}
    for p in sorted(Path(path).rglob("*")):
        if p.is_file() and not p.name.startswith((".", "_")):
            fmt = next((f for f, sfx in FORMAT_SUFFIXES.items() if p.name.lower().endswith(sfx)), None)
            if fmt:
                found.setdefault(fmt, []).append(str(p))
    allowed = ", ".join(s for sfx in FORMAT_SUFFIXES.values() for s in sfx)
    if not found:
        raise DataError(f"--input: directory holds no data files (got {path!r}; allowed: files ending in {allowed})")
    if len(found) > 1:
        raise DataError(f"--input: directory mixes formats (got {', '.join(sorted(found))} files in {path!r}; "
                        "allowed: files of one format)")
    (fmt, files), = found.items()
    return fmt, files


@dataclass
class _Source:  # what data.sources.read_dataset reads (the spec's data.source shape)
    format: str
    path: str
    name: str | None = None


class _Scorer:
    """One per Ray Data actor: loads the model once, scores pandas batches with numpy."""

    def __init__(self, name: str, version: str, workspace: str, tracking_uri: str | None, probabilities: bool,
                 keep: list[str]):
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

    def __call__(self, batch):
        import numpy as np
        import pyarrow as pa

        missing = batch[self.required].isna().any(axis=0)
        if missing.any():
            bad = [c for c, m in missing.items() if m]
            raise DataError(f"--input: column(s) {bad} hold missing values and {self.where} imputes none of them "
                            "(allowed: a value in every row of these columns)")
        x = self.predictor.preprocessing.transform(batch[self.features])  # the compiled transform serving runs
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


def _check_columns(names: list[str], features: list[str], keep: list[str] | None, where: str,
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


def _parquet_rows(files: list[str]) -> int | None:
    import pyarrow.parquet as pq

    try:
        return sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    except Exception:  # unreadable footers are reported by the read itself
        return None


def choose_engine(engine: str, fmt: str, files: list[str], schema, cluster: bool) -> str:
    """"local" or "ray" for `--engine` (see the module doc); `cluster`: there is a Ray to use
    (this process's, --address, RAY_ADDRESS or a `rayline cluster up` head)."""
    from rayline.data.sources import is_uri

    if engine not in ENGINES:
        raise DataError(f"--engine: unknown engine (got {engine!r}; allowed: {', '.join(ENGINES)})")
    local_ok = fmt in ("parquet", "csv") and schema is not None and not any(is_uri(f) for f in files)
    if engine == "local" and not local_ok:
        raise DataError(f"--engine: local reads local Parquet and CSV files (got {fmt} "
                        f"{'on object storage' if any(is_uri(f) for f in files) else 'files'}; allowed: --engine ray "
                        "or auto for this input)")
    if engine == "auto":
        return "local" if local_ok and not cluster else "ray"
    return engine


def _ray_running() -> bool:
    import sys

    ray = sys.modules.get("ray")  # not imported: not running here (importing it costs ~1 s)
    return ray is not None and ray.is_initialized()


def score(name: str, input_path: str, output: str, *, version: str | None = None, workspace=None,
          probabilities: bool = False, keep: list[str] | None = None, address: str | None = None,
          progress: Callable[[int, int | None], None] | None = None, engine: str = "auto") -> ScoreResult:
    """Score every row of `input_path` with registered model `name` into the Parquet file `output`.

    `engine` (see the module doc): "ray" uses the Ray this process is connected to, else connects
    like `rayline run` (RAY_ADDRESS, a `rayline cluster up` head, else an embedded local Ray, shut
    down when done); "local" scores in this process; "auto" picks.
    `progress(rows_done, rows_total_or_None)` is called as batches are written."""
    from rayline.registry import Registry
    from rayline.workspace import Workspace, workspace as make_workspace

    started = time.monotonic()
    out = Path(output)
    if not out.name.lower().endswith(OUTPUT_SUFFIXES):
        raise DataError(f"--output: batch scoring writes Parquet (got {output!r}; allowed: a file ending in "
                        f"{', '.join(OUTPUT_SUFFIXES)})")
    if not out.parent.is_dir():
        raise DataError(f"--output: no such directory {str(out.parent)!r} (got {output!r})")
    if out.is_dir():
        raise DataError(f"--output: is a directory (got {output!r}; allowed: a file path)")
    fmt, files = input_files(str(input_path))
    ws = workspace if isinstance(workspace, Workspace) else make_workspace(workspace)
    registry = Registry(ws)
    if version is None:  # what production serves: the champion alias, else the newest version
        version = registry.alias_version(name, "champion")
    mv = registry.resolve(name, version)  # RegistryError names an unknown model or version
    predictor_meta = _model_meta(registry, mv)
    features, task, classes = predictor_meta
    out_columns = [PREDICTION_COLUMN] + ([probability_column(str(c)) for c in classes]
                                         if probabilities and task == "classification" else [])
    where = f"model {name!r} v{mv.version}"
    # Columns checked before Ray starts, from Parquet's footer or a bounded sample of the first file.
    from rayline.data.sources import is_uri, source_schema

    schema = None
    if not is_uri(files[0]):
        try:
            schema = source_schema(_Source(fmt, str(input_path)))
        except DataError as exc:
            raise DataError(str(exc).replace("data.source.path", "--input", 1)) from exc
        if schema is not None:
            _check_columns(list(schema.names), features, keep, where, out_columns)

    from rayline.cluster.connection import cluster_address, connect

    chosen = choose_engine(engine, fmt, files, schema, _ray_running() or bool(cluster_address(ws, address)))
    from rayline.files import atomic_path

    if chosen == "local":
        with atomic_path(out) as tmp:
            rows, kept = _score_locally(name, mv.version, ws, fmt, files, schema, features, keep, where, out_columns,
                                        probabilities, tmp, progress)
        return ScoreResult(output=str(out), rows=rows, seconds=time.monotonic() - started, model=name,
                           version=mv.version, columns=kept + out_columns, engine="local")
    connection = connect(ws, address)
    failure = None
    try:
        with atomic_path(out) as tmp:
            rows, kept = _score_on_ray(name, mv.version, ws, fmt, files, str(input_path), schema, features, keep,
                                       where, out_columns, probabilities, tmp, progress)
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt) or not (isinstance(exc, DataError) or _is_ray_error(exc)):
            raise
        failure = _unwrap(exc, _Source(fmt, str(input_path)))  # our one line, from a DataError or Ray's
    finally:
        connection.shutdown()
    if failure is not None:
        # Raised here, outside the handler, as a new error with no link to Ray's: a failed run
        # leaves the scorer actors' handles in reference cycles through Ray Data's executor
        # and the frames of its exception, and each actor kept its CPUs until a garbage
        # collection came by (in a long-lived process, minutes; the test session's next pipeline
        # waited for them). The message is the first line of the scorer's or reader's error.
        import gc

        gc.collect()
        raise failure
    return ScoreResult(output=str(out), rows=rows, seconds=time.monotonic() - started, model=name,
                       version=mv.version, columns=kept + out_columns)


def _score_on_ray(name, version, ws, fmt, files, input_path, schema, features, keep, where, out_columns,
                  probabilities, tmp: Path, progress) -> tuple[int, list[str]]:
    """Read, score on a pool of actors and write `tmp`: (rows written, input columns kept).

    A function of its own so that its Datasets die with its frame: `score` raises a failure from
    its own frame, which the caller's traceback keeps, and must hold no handle on the scorers."""
    import ray.data

    from rayline.data.sources import is_uri, read_dataset

    # Output rows in input order: preserve_order, and Ray Data's V1 Parquet reader. Ray 2.60's
    # DataSourceV2 reader (the default) does not keep a file's row groups in order even with
    # preserve_order: a 1M-row file of 20 row groups of 50,000 came back starting at row
    # 250,000, its first 5 row groups last (V1: in order). Both set for the whole run.
    ctx = ray.data.DataContext.get_current()
    saved_order, saved_v2 = ctx.execution_options.preserve_order, ctx.use_datasource_v2
    saved_limits = ctx.execution_options.resource_limits
    ctx.execution_options.preserve_order = True
    ctx.use_datasource_v2 = False
    # Ray Data's own budget is half the object store (~3.5 GB on a 24 GB machine): blocks read
    # ahead of the scorers filled it, and the 1M-row run peaked at 3.4 GB PSS. A fixed
    # budget keeps memory flat whatever the input's size.
    ctx.execution_options.resource_limits = saved_limits.copy(object_store_memory=OBJECT_STORE_BUDGET)
    try:
        row_groups = fmt == "parquet" and not any(is_uri(f) for f in files) and schema is not None
        read_cpus = ROW_GROUP_READ_CPUS if row_groups else 1.0
        # Planned before anything runs: Ray Data waits forever for a CPU that never frees.
        workers, cpus = plan_scorers(_free_cpus(read_cpus + 0.1), read_cpus)
        try:
            ds = _read_row_groups(files) if row_groups else read_dataset(_Source(fmt, input_path))
        except DataError as exc:
            raise DataError(str(exc).replace("data.source.path", "--input", 1)) from exc
        names = list(schema.names) if row_groups else list(ds.schema().names)
        kept = _check_columns(names, features, keep, where, out_columns)
        scored = ds.map_batches(
            _Scorer, batch_size=BATCH_ROWS, batch_format="pandas", num_cpus=cpus,
            compute=ray.data.ActorPoolStrategy(min_size=1, max_size=workers),
            fn_constructor_kwargs={"name": name, "version": version, "workspace": ws.location,
                                   "tracking_uri": ws.tracking_uri_override, "probabilities": probabilities,
                                   "keep": kept})
        total = _parquet_rows(files) if fmt == "parquet" else None
        rows = _write(scored, tmp, total, progress, _unwrap)
    finally:
        ctx.execution_options.preserve_order, ctx.use_datasource_v2 = saved_order, saved_v2
        ctx.execution_options.resource_limits = saved_limits
    return rows, kept


def _score_locally(name, version, ws, fmt, files, schema, features, keep, where, out_columns, probabilities,
                   tmp: Path, progress) -> tuple[int, list[str]]:
    """Read, score and write `tmp` in this process: (rows written, input columns kept)."""
    kept = _check_columns(list(schema.names), features, keep, where, out_columns)
    scorer = _Scorer(name, version, ws.location, ws.tracking_uri_override, probabilities, kept)
    columns = list(dict.fromkeys(kept + features))  # only what is scored or kept is read
    total = _parquet_rows(files) if fmt == "parquet" else None
    batches = _ReadAhead(_local_batches(fmt, files, columns), LOCAL_READ_AHEAD)
    try:
        return _write_tables((scorer(batch.to_pandas()) for batch in batches), tmp, total, progress), kept
    finally:
        batches.close()


def _local_batches(fmt: str, files: list[str], columns: list[str]):
    """Arrow record batches of `columns` of local Parquet or CSV `files`, in file and row order,
    parsed as training parses them (data.sources: CSV's empty cells are missing values)."""
    import pyarrow as pa

    for file in files:
        try:
            if fmt == "parquet":
                import pyarrow.parquet as pq

                # One row group at a time: one iter_batches over the whole file (pre_buffer, its
                # default) kept what it had read until the end, so memory grew with the file (a
                # 4.6 GB, 10M-row file peaked at 5.5 GB RSS; per row group it stays at ~1.3 GB).
                with pq.ParquetFile(file) as pf:
                    for group in range(pf.num_row_groups):
                        yield from pf.iter_batches(batch_size=WRITE_ROWS, row_groups=[group], columns=columns)
            else:
                from pyarrow import csv

                from rayline.data.sources import csv_convert_options

                convert = csv_convert_options()
                convert.include_columns = columns
                reader = csv.open_csv(file, read_options=csv.ReadOptions(block_size=LOCAL_CSV_BLOCK),
                                      convert_options=convert)
                yield from reader
        except (OSError, pa.ArrowException, ValueError) as exc:  # Arrow's messages name the row/column
            text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise DataError(f"--input: {file}: cannot read as {fmt} ({text})") from exc


class _ReadAhead:
    """Iterates `source` on a background thread, up to `depth` items ahead: Arrow decodes the
    next batch (releasing the GIL) while this thread scores the current one. An error in the
    source is raised where the item would have been."""

    _END = object()

    def __init__(self, source, depth: int):
        import queue
        import threading

        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._source = source
        self._thread = threading.Thread(target=self._run, name="rayline-read-ahead", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for item in self._source:
                if not self._put(item):
                    return
            self._put(self._END)
        except BaseException as exc:  # handed to the consumer, raised there
            self._put(exc)

    def _put(self, item) -> bool:
        import queue

        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self):
        while True:
            item = self._queue.get()
            if item is self._END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        """Stop the reader (a consumer that failed or finished early) and wait for it."""
        self._stop.set()
        self._thread.join()
        close = getattr(self._source, "close", None)
        if close is not None:
            close()


def _row_group_table(batch) -> "pa.Table":
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = []
    for file, group in zip(batch["file"], batch["row_group"]):
        with pq.ParquetFile(str(file)) as pf:
            tables.append(pf.read_row_group(int(group)))
    return pa.concat_tables(tables)


def _read_row_groups(files: list[str]):
    """A Dataset of local Parquet files read one row group per task, in file and row-group order.

    Ray Data's V1 Parquet reader read a 1M-row, 461 MiB file in one task (its worker peaked at
    1.8 GB PSS, growing with the file) and its V2 reader does not keep row groups in order
    (see `score`); a row group is Parquet's unit of reading, so memory is bounded by the
    largest row group, whatever the file's size."""
    import pyarrow.parquet as pq
    import ray.data

    pieces = []
    for file in files:
        try:
            groups = pq.ParquetFile(file).metadata.num_row_groups
        except Exception as exc:  # pyarrow's ArrowInvalid / OSError: not a Parquet file
            raise DataError(f"--input: {file}: cannot read as parquet ({str(exc).splitlines()[0]})") from exc
        pieces += [{"file": file, "row_group": i} for i in range(groups)]
    if not pieces:
        raise DataError(f"--input: holds no rows (got {len(files)} Parquet file(s) without row groups)")
    return ray.data.from_items(pieces, override_num_blocks=len(pieces)).map_batches(
        _row_group_table, batch_size=1, batch_format="numpy", num_cpus=ROW_GROUP_READ_CPUS)


def _free_cpus(needed: float, wait_s: float = 10.0) -> float:
    """Free logical CPUs, waiting up to `wait_s` for `needed`: a Ray just started, or a task just
    finished, may not show all its CPUs yet (an embedded 2-CPU Ray once showed 1 free)."""
    import ray

    deadline = time.monotonic() + wait_s
    while True:
        free = ray.available_resources().get("CPU", 0.0)
        if free >= needed or time.monotonic() >= deadline:
            return free
        time.sleep(0.2)


def _unwrap(exc: BaseException, source=None) -> DataError:
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


def _is_ray_error(exc: BaseException) -> bool:
    module = type(exc).__module__
    # "ray" or "ray.*" only: rayline's own errors (module "rayline.errors") are not Ray's.
    return module == "ray" or module.startswith("ray.") or "RayTaskError" in type(exc).__name__


def _model_meta(registry, mv) -> tuple[list[str], str, list]:
    """(feature names, task, class labels) of a version, from its artifact's preprocessing.json."""
    import json

    from rayline.model import META_FILE, PREPROCESSING_FILE, artifact_root

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


def _write(ds, tmp: Path, total: int | None, progress, unwrap) -> int:
    """Ray Data's scored batches into `tmp`; Ray's errors as our one-line DataError."""
    try:
        return _write_tables(ds.iter_batches(batch_size=WRITE_ROWS, batch_format="pyarrow", prefetch_batches=1),
                             tmp, total, progress)
    except DataError:
        raise
    except Exception as exc:
        if not _is_ray_error(exc):
            raise
        raise unwrap(exc) from exc


def _write_tables(tables, tmp: Path, total: int | None, progress) -> int:
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
