"""A challenger version judged against the champion on the same labelled rows, by one metric.

Both versions are scored here by the offline Predictor (the code every Serve replica runs: the
version's own fitted preprocessing, then its model) on the same raw rows, so the comparison holds
however each version was trained or on which data. The challenger qualifies when it is better by at
least `min_delta` in the metric's own direction (0: no worse; negative: a bounded loss accepted).
The judgement is recorded on the challenger as a version tag (JUDGEMENT_TAG, JSON), which
`rayline models show` prints.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from typing import Optional

from rayline.errors import DataError, RegistryError
from rayline.registry.registered import JUDGEMENT_TAG

__all__ = ["Judgement", "judge", "judge_on_test_split", "record_judgement", "read_rows"]

_READERS = {".csv": "read_csv", ".parquet": "read_parquet", ".pq": "read_parquet"}


@dataclass(frozen=True)
class Judgement:
    name: str
    challenger: str
    champion: str
    metric: str
    mode: str  # "max" or "min": which way the metric is better
    challenger_score: float
    champion_score: float
    min_delta: float
    rows: int
    data: str  # what the rows were (a file path), for the record

    @property
    def gain(self) -> float:
        """How much better the challenger scored, in the metric's own direction (negative: worse)."""
        diff = self.challenger_score - self.champion_score
        return diff if self.mode == "max" else -diff

    @property
    def qualifies(self) -> bool:
        return self.gain >= self.min_delta

    def line(self) -> str:
        verdict = "qualifies" if self.qualifies else "does not qualify"
        return (f"{self.name}: challenger version {self.challenger} {self.metric}={self.challenger_score:.4f}, "
                f"champion version {self.champion} {self.metric}={self.champion_score:.4f} on the same {self.rows} rows: "
                f"gain {self.gain:+.4f} ({self.mode} is better), needed >= {self.min_delta:+.4f}: {verdict}")

    def to_dict(self) -> dict:
        return {**asdict(self), "gain": self.gain, "qualifies": self.qualifies}


def read_rows(path: str):
    """Labelled raw rows from a CSV or Parquet file, as pandas reads them (as `rayline predict` does)."""
    import pandas as pd

    reader = _READERS.get(os.path.splitext(path)[1].lower())
    if reader is None:
        raise DataError(f"--data: unknown file type (got {path!r}; allowed: {', '.join(sorted(_READERS))})")
    if not os.path.isfile(path):
        raise DataError(f"--data: no such file (got {path!r})")
    try:
        return getattr(pd, reader)(path)
    except (ValueError, OSError, pd.errors.ParserError) as exc:
        raise DataError(f"--data: {path} could not be read ({' '.join(str(exc).split())[:300]})") from exc


def judge(ws, name: str, challenger: str, rows, *, data: str, champion: Optional[str] = None,
          metric: Optional[str] = None, min_delta: float = 0.0, record: bool = True) -> Judgement:
    """Score `challenger` and `champion` (default: the version the `champion` alias names) of model
    `name` on `rows` (a DataFrame of raw features and the label) by `metric` (default: the metric the
    challenger was trained for); record the judgement on the challenger when `record`."""
    import math

    from rayline.inference.predictor import Predictor
    from rayline.registry import Registry
    from rayline.spec import metric_mode

    registry = Registry(ws)
    champion = champion or registry.alias_version(name, "champion")
    if champion is None:
        raise RegistryError(f"model {name!r}: no champion to judge against (no version has been deployed as the "
                            "champion); name one with --champion VERSION")
    if str(champion) == str(challenger):
        raise RegistryError(f"--champion: the challenger itself (got version {challenger} for both)")
    versions = {role: registry.version_details(name, v)[0] for role, v in (("challenger", challenger), ("champion", champion))}
    tags = versions["challenger"].tags or {}
    metric = metric or tags.get("metric")
    if not metric:
        raise RegistryError(f"model {name!r} version {challenger}: records no metric; name one with --metric")
    predictors = {role: Predictor(registry.download(registry.resolve(name, str(mv.version))), version=str(mv.version))
                  for role, mv in versions.items()}
    label = predictors["challenger"].preprocessing.label.name
    if label not in rows.columns:
        raise DataError(f"--data: no label column {label!r} (the column version {challenger} was trained to predict); "
                        f"columns: {', '.join(map(str, rows.columns[:20]))}")
    if not len(rows):
        raise DataError("--data: no rows to judge on")
    scores = {}
    for role, predictor in predictors.items():
        if predictor.task != predictors["challenger"].task:
            raise RegistryError(f"model {name!r}: version {predictor.version} is a {predictor.task} model and version "
                                f"{challenger} a {predictors['challenger'].task} one; they cannot be compared")
        missing = [f.name for f in predictor.preprocessing.features if f.name not in rows.columns]
        if missing:
            raise DataError(f"--data: missing feature columns of version {predictor.version}: {missing[:10]}")
        metrics = predictor.evaluate(rows)
        if metric not in metrics:
            raise DataError(f"--metric: {metric!r} is not a metric of this {predictor.task} model "
                            f"(allowed: {', '.join(sorted(metrics))})")
        if not math.isfinite(metrics[metric]):
            raise DataError(f"--data: {metric} of version {predictor.version} is not a number on these rows")
        scores[role] = float(metrics[metric])
    result = Judgement(name=name, challenger=str(challenger), champion=str(champion), metric=metric,
                       mode=metric_mode(metric), challenger_score=scores["challenger"],
                       champion_score=scores["champion"], min_delta=float(min_delta), rows=len(rows), data=data)
    if record:
        record_judgement(registry, result)
    return result


def record_judgement(registry, judged: Judgement) -> None:
    """The judgement on the challenger version (JUDGEMENT_TAG), with the time it was made."""
    entry = {**judged.to_dict(), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    registry.set_version_tag(judged.name, judged.challenger, JUDGEMENT_TAG, json.dumps(entry))


def judge_on_test_split(registry, name: str, challenger: str, challenger_metrics: dict, test_rows, *, metric: str,
                        rows: int, data: str, min_delta: float = 0.0) -> tuple[Judgement | None, str]:
    """At registration: the new version against the champion on the run's own test split (a Ray
    Dataset of raw labelled rows), the champion scored by rayline.evaluation.offline like the new
    version was. Returns (the judgement, "") or (None, why none was made: "" when there is no
    champion yet, a line when it cannot score these rows: other features, another task). Never
    raises for the champion's sake: the version is registered already, and the run must not fail."""
    from rayline.errors import RaylineError
    from rayline.evaluation.offline import evaluate_rows
    from rayline.spec import metric_mode

    champion = registry.alias_version(name, "champion")
    if champion is None or str(champion) == str(challenger):
        return None, ""
    try:
        champion_metrics = evaluate_rows(registry.download(registry.resolve(name, champion)), test_rows)
    except Exception as exc:  # noqa: BLE001 - whatever the old version cannot do, the new one stays registered
        detail = str(exc) if isinstance(exc, RaylineError) else f"{type(exc).__name__}: {exc}"
        return None, f"not judged: champion version {champion} could not score this run's test split ({' '.join(detail.split())[:300]})"
    if metric not in champion_metrics or metric not in challenger_metrics:
        return None, f"not judged: champion version {champion} has no {metric} on this run's test split"
    judged = Judgement(name=name, challenger=str(challenger), champion=str(champion), metric=metric,
                       mode=metric_mode(metric), challenger_score=float(challenger_metrics[metric]),
                       champion_score=float(champion_metrics[metric]), min_delta=float(min_delta), rows=rows, data=data)
    record_judgement(registry, judged)
    return judged, ""
