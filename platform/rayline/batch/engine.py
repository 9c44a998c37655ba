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

from rayline.batch.local import score_locally
from rayline.batch.on_ray import score_on_ray
from rayline.batch.scorer import (OUTPUT_SUFFIXES, Source, check_columns, is_ray_error, model_meta, model_statistics,
                                  unwrap)
from rayline.client import PREDICTION_COLUMN, probability_column
from rayline.errors import DataError

__all__ = ["ENGINES", "ScoreResult", "input_files", "choose_engine", "score"]

ENGINES = ("auto", "local", "ray")


@dataclass
class ScoreResult:
    output: str
    rows: int
    seconds: float
    model: str
    version: str
    columns: list[str] = field(default_factory=list)
    engine: str = "ray"  # where it ran: "ray" or "local" (choose_engine)
    drift: list | None = None  # rayline.monitoring.FeatureDrift per summarised feature, largest PSI first

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else float("nan")


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
    from rayline.data.image_folder import has_images, image_files

    found: dict[str, list[str]] = {}
    for p in sorted(Path(path).rglob("*")):
        if p.is_file() and not p.name.startswith((".", "_")):
            fmt = next((f for f, sfx in FORMAT_SUFFIXES.items() if p.name.lower().endswith(sfx)), None)
            if fmt:
                found.setdefault(fmt, []).append(str(p))
    allowed = ", ".join(s for sfx in FORMAT_SUFFIXES.values() for s in sfx)
    if not found and has_images(path):  # an image folder: rows image, label (its class folder, if any), path
        return "image_folder", [file for file, _ in image_files(path, labelled=False)]
    if not found:
        raise DataError(f"--input: directory holds no data files (got {path!r}; allowed: files ending in {allowed}, "
                        "or images)")
    if len(found) > 1:
        raise DataError(f"--input: directory mixes formats (got {', '.join(sorted(found))} files in {path!r}; "
                        "allowed: files of one format)")
    (fmt, files), = found.items()
    return fmt, files


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
    predictor_meta = model_meta(registry, mv)
    features, task, classes = predictor_meta
    out_columns = [PREDICTION_COLUMN] + ([probability_column(str(c)) for c in classes]
                                         if probabilities and task == "classification" else [])
    where = f"model {name!r} v{mv.version}"
    # Columns checked before Ray starts, from Parquet's footer or a bounded sample of the first file.
    from rayline.data.image_paths import base_of
    from rayline.data.sources import is_uri, source_schema

    schema = None
    if not is_uri(files[0]):
        try:
            schema = source_schema(Source(fmt, str(input_path)))
        except DataError as exc:
            raise DataError(str(exc).replace("data.source.path", "--input", 1)) from exc
        if schema is not None:
            check_columns(list(schema.names), features, keep, where, out_columns)

    from rayline.cluster.connection import cluster_address, connect

    chosen = choose_engine(engine, fmt, files, schema, _ray_running() or bool(cluster_address(ws, address)))
    from rayline.files import atomic_path

    statistics = model_statistics(registry, mv)
    if chosen == "local":
        with atomic_path(out) as tmp:
            rows, kept, counts = score_locally(name, mv.version, ws, fmt, files, schema, features, keep, where,
                                               out_columns, probabilities, tmp, progress, base_of(str(input_path)),
                                               statistics)
        return ScoreResult(output=str(out), rows=rows, seconds=time.monotonic() - started, model=name,
                           version=mv.version, columns=kept + out_columns, engine="local",
                           drift=_drift(statistics, counts))
    connection = connect(ws, address)
    failure = None
    try:
        with atomic_path(out) as tmp:
            rows, kept, counts = score_on_ray(name, mv.version, ws, fmt, files, str(input_path), schema, features,
                                               keep, where, out_columns, probabilities, tmp, progress, statistics)
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt) or not (isinstance(exc, DataError) or is_ray_error(exc)):
            raise
        failure = unwrap(exc, Source(fmt, str(input_path)))  # our one line, from a DataError or Ray's
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
                       version=mv.version, columns=kept + out_columns, drift=_drift(statistics, counts))


def _drift(statistics: dict | None, counts) -> list | None:
    """Each summarised feature's drift against the version's training statistics, or None."""
    if statistics is None or counts is None:
        return None
    from rayline.monitoring import TrainingStatistics, drift

    return drift(TrainingStatistics.from_dict(statistics), counts)
