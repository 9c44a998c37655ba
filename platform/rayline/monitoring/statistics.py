"""Training statistics: what the train split looked like, per raw feature, saved with every version.

Computed on the driver from the data stage's one pass (data/profile.py), never from another:
- a numeric feature: count, nulls, mean, standard deviation, min, max, and a histogram of
  BINS bins whose edges are the train split's deciles: exact while the profile kept the values
  (up to 100,000), else read off a KLL sketch, whose mass between the edges is the histogram:
  the full sketch where a median step made one, else one of a fixed 1 in 16 of the train rows
  (picked by their split hash: a decile's rank is off by about 2 / sqrt(n), 0.5% at 150,000
  values, 0.2% at a million);
- a categorical feature (one a one_hot step encodes): each category's count (the categories the
  step saw, keyed as it keys them) and the nulls.
Image and text features are not summarised.

Saved in the model artifact as STATISTICS_FILE beside the preprocessing, logged to MLflow, and
read by the drift checks (monitoring/drift.py): batch scoring's summary and the replicas' windows.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import numpy as np

__all__ = ["BINS", "STATISTICS_FILE", "NumericStats", "CategoricalStats", "TrainingStatistics", "value_histogram"]

BINS = 10
STATISTICS_FILE = "statistics.json"


class _Nulls:
    count: int
    nulls: int

    @property
    def null_share(self) -> float:
        return self.nulls / max(self.count + self.nulls, 1)


@dataclass
class NumericStats(_Nulls):
    count: int  # present values
    nulls: int
    mean: float | None
    std: float | None
    min: float | None
    max: float | None
    edges: list[float] = field(default_factory=list)  # inner bin edges, increasing: len(edges) + 1 bins
    counts: list[float] = field(default_factory=list)  # train values per bin (estimated from the sketch beyond 100,000)

    kind = "numeric"


@dataclass
class CategoricalStats(_Nulls):
    count: int
    nulls: int
    categories: list = field(default_factory=list)  # the one_hot step's keys, in its order
    counts: list[int] = field(default_factory=list)

    kind = "categorical"


@dataclass
class TrainingStatistics:
    rows: int  # train rows
    features: dict  # name -> NumericStats | CategoricalStats
    # The registered model's predictions on the held-out test split (registration's test metrics
    # pass): classification, rows per predicted class {"labels": [...], "counts": [...]}; regression,
    # a histogram of the predicted values {"edges": inner edges at their deciles, "counts": [...]}.
    predictions: dict | None = None

    @classmethod
    def of_profile(cls, profile, features: list, categorical: set) -> "TrainingStatistics":
        """From the data stage's merged profile: `features` the FeatureInfo list (name, kind),
        `categorical` the columns a one_hot step encodes (their counts are in the profile)."""
        from rayline.data.values import value_key, value_rank

        out = {}
        for feature in features:
            stats = profile.train.get(feature.name)
            if stats is None:
                continue
            if feature.name in categorical:
                if stats.counts is None:
                    continue  # more than MAX_CATEGORIES distinct values: one_hot refused them anyway
                merged: dict = {}
                for value, n in stats.counts.items():
                    key = value_key(value)
                    merged[key] = merged.get(key, 0) + int(n)
                keys = sorted(merged, key=value_rank)
                out[feature.name] = CategoricalStats(count=int(stats.n), nulls=int(stats.missing), categories=keys,
                                                     counts=[merged[k] for k in keys])
            elif feature.kind in ("integer", "number", "boolean") and stats.min is not None:
                edges, counts = _histogram(stats)
                out[feature.name] = NumericStats(count=int(stats.n), nulls=int(stats.missing), mean=float(stats.mean),
                                                 std=float(stats.stat("std")), min=float(stats.min),
                                                 max=float(stats.max), edges=edges, counts=counts)
            elif feature.kind in ("integer", "number", "boolean"):
                out[feature.name] = NumericStats(count=0, nulls=int(stats.missing), mean=None, std=None, min=None,
                                                 max=None)
        return cls(rows=int(profile.rows.get("train", 0)), features=out)

    def to_dict(self) -> dict:
        return {"rows": self.rows, "predictions": self.predictions,
                "features": {name: {"kind": s.kind, **asdict(s)} for name, s in self.features.items()}}

    @classmethod
    def from_dict(cls, data: dict) -> "TrainingStatistics":
        features = {}
        for name, entry in data["features"].items():
            entry = dict(entry)
            kind = entry.pop("kind")
            features[name] = (NumericStats if kind == "numeric" else CategoricalStats)(**entry)
        return cls(rows=int(data["rows"]), features=features, predictions=data.get("predictions"))

    def save(self, path: str) -> None:
        with open(path, "w") as fh:
            json.dump(self.to_dict(), fh)

    @classmethod
    def load(cls, path: str) -> "TrainingStatistics":
        with open(path) as fh:
            return cls.from_dict(json.load(fh))


def _histogram(stats) -> tuple[list[float], list[float]]:
    """(inner edges at the deciles, train values per bin) of a raw numeric column's statistics."""
    ranks = np.arange(1, BINS) / BINS
    if stats.values is not None:
        values = np.concatenate(stats.values) if stats.values else np.empty(0)
        edges = np.unique(np.quantile(values, ranks)) if len(values) else np.empty(0)
        counts = np.bincount(np.searchsorted(edges, values, side="right"), minlength=len(edges) + 1)
        return edges.tolist(), counts.astype(float).tolist()
    sketch = stats.sketch if stats.sketch is not None else stats.sampled  # every value, else 1 in MONITOR_SAMPLE
    if sketch is None:
        return [], [float(stats.n)]
    from datasketches import kll_doubles_sketch

    return value_histogram(kll_doubles_sketch.deserialize(sketch), stats.n)


def value_histogram(kll, n: float | None = None) -> tuple[list[float], list[float]]:
    """(inner edges at the deciles, values per bin) read off a KLL sketch: its mass between the
    edges times `n` (default: the values it saw)."""
    edges = np.unique(np.asarray(kll.get_quantiles(np.arange(1, BINS) / BINS), dtype=np.float64))
    masses = np.asarray(kll.get_pmf(edges.tolist()), dtype=np.float64)  # [left, right) intervals, as searchsorted
    return edges.tolist(), (masses * (kll.n if n is None else n)).tolist()
