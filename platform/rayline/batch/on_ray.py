"""Batch scoring on Ray: Ray Data reads the input with training's readers, an autoscaling pool of
actors scores it, the driver writes the results in input order.
"""

from __future__ import annotations

import time
from pathlib import Path

from rayline.batch.scorer import (BATCH_ROWS, WRITE_ROWS, CountAnswers, Scorer, Source, check_columns, is_ray_error,
                                  parquet_rows, unwrap, write_tables)
from rayline.errors import DataError, ResourceError

__all__ = ["ROW_GROUP_READ_CPUS", "OBJECT_STORE_BUDGET", "plan_scorers", "score_on_ray"]

# A row-group read is mostly decoding: a quarter CPU each, so reads fit beside served models.
ROW_GROUP_READ_CPUS = 0.25


# Object store memory Ray Data may fill with blocks in flight (read ahead, scored, not yet written).
OBJECT_STORE_BUDGET = 512 * 2**20


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
                            f"some to score (got {available_cpus:g} free; allowed: --engine local to score in this "
                            "process without Ray, free CPUs (`rayline serve delete NAME`, fewer replicas), or a "
                            "cluster in RAY_ADDRESS)")
    rest = available_cpus - read_cpus
    if rest < 2.0:
        return 1, round(min(1.0, rest), 2)
    return min(int(rest), 8), 1.0


def score_on_ray(name, version, ws, fmt, files, input_path, schema, features, keep, where, out_columns,
                  probabilities, tmp: Path, progress, statistics: dict | None = None) -> tuple[int, list[str], object]:
    """Read, score on a pool of actors and write `tmp`: (rows written, input columns kept, drift
    counts of the input and the answers against the version's training `statistics` (a dict:
    rayline/monitoring), or None).

    A function of its own so that its Datasets die with its frame: `score` raises a failure from
    its own frame, which the caller's traceback keeps, and must hold no handle on the scorers."""
    import ray.data

    from rayline.data.image_paths import base_of
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
            ds = _read_row_groups(files) if row_groups else read_dataset(Source(fmt, input_path))
        except DataError as exc:
            raise DataError(str(exc).replace("data.source.path", "--input", 1)) from exc
        names = list(schema.names) if row_groups else list(ds.schema().names)
        kept = check_columns(names, features, keep, where, out_columns)
        scored = ds.map_batches(
            Scorer, batch_size=BATCH_ROWS, batch_format="pandas", num_cpus=cpus,
            compute=ray.data.ActorPoolStrategy(min_size=1, max_size=workers),
            fn_constructor_kwargs={"name": name, "version": version, "workspace": ws.location,
                                   "tracking_uri": ws.tracking_uri_override, "probabilities": probabilities,
                                   "keep": kept, "image_base": base_of(input_path)})
        total = parquet_rows(files) if fmt == "parquet" else None
        answers = CountAnswers(statistics)
        rows = _write(scored, tmp, total, progress, unwrap, answers)
        counts = answers.into(_drift_counts(ds, names, statistics) if statistics is not None else None)
    finally:
        ctx.execution_options.preserve_order, ctx.use_datasource_v2 = saved_order, saved_v2
        ctx.execution_options.resource_limits = saved_limits
    return rows, kept, counts


def _drift_counts(ds, names: list[str], statistics: dict):
    """The input's drift counts, from a second read of the summarised feature columns (the
    scoring actors' own counts cannot leave Ray Data's actor pool): one pickled partial per
    block, merged here."""
    import pickle

    from rayline.batch.scorer import CountDrift
    from rayline.monitoring.drift import FeatureCounts

    columns = [c for c in statistics["features"] if c in names]
    merged = FeatureCounts()
    if not columns:
        return merged
    partials = ds.select_columns(columns).map_batches(CountDrift(statistics), batch_format="pandas", batch_size=None)
    for row in partials.iter_rows():
        merged.merge(pickle.loads(row["counts"]))
    return merged


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


def _write(ds, tmp: Path, total: int | None, progress, unwrap, answers: CountAnswers) -> int:
    """Ray Data's scored batches into `tmp`, their answers counted; Ray's errors as our one-line
    DataError."""
    try:
        batches = ds.iter_batches(batch_size=WRITE_ROWS, batch_format="pyarrow", prefetch_batches=1)
        return write_tables(answers.through(batches), tmp, total, progress)
    except DataError:
        raise
    except Exception as exc:
        if not is_ray_error(exc):
            raise
        raise unwrap(exc) from exc
