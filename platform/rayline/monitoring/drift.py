"""Drift of scored data against the training statistics (monitoring/statistics.py).

`FeatureCounts` counts a frame of raw rows the way the statistics were counted: per numeric
feature the rows in each training bin, the nulls and the values outside the training range; per
categorical feature each training category's rows, the unseen ones and the nulls. Counting is
vectorised per batch (numpy searchsorted, pandas value_counts) and counts merge by addition, so
batches, blocks and windows combine without keeping rows.

`drift` compares counts with the statistics: the population stability index per feature,
PSI = sum over bins of (a - e) * ln(a / e), with e and a the training and scored shares (each at
least PSI_FLOOR, so an empty bin is finite), an unseen category counted as one more bin with a
training share of zero; and the shares of nulls, unseen categories and out-of-range values.
Thresholds (`Thresholds`) flag a feature as warn or alert; 0.1 and 0.25 are the usual PSI levels.

PSI also grows with sampling noise alone: two samples of the same distribution, n and m rows in k
bins, give n*m/(n+m) * PSI ~ chi-square with k - 1 degrees of freedom (PSI is, to second order,
the two-sample chi-square statistic divided by that effective size). With a small reference (a
held-out split of a few hundred rows) or a small batch, that is 0.05-0.1 on its own: digits' 360
test rows against 600 requests drawn like the data gave a prediction PSI of 0.107, a warn.
So a PSI level counts only above `noise_psi`, the PSI that noise reaches once in NOISE_ODDS at
these sample sizes; on the window's 10,000 rows against a large training split that is ~0.003
and changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rayline.monitoring.statistics import TrainingStatistics

__all__ = ["PSI_FLOOR", "NOISE_ODDS", "PREDICTION", "Thresholds", "FeatureCounts", "FeatureDrift", "psi", "noise_psi",
           "drift", "prediction_bins", "answer_bins"]

PSI_FLOOR = 1e-4
PREDICTION = "(prediction)"  # the name prediction drift is reported under, beside the features
NOISE_ODDS = 1000  # a PSI flag needs a PSI that same-distribution samples reach less often than 1 in this
_NOISE_Z = 3.090  # the standard normal's quantile at 1 - 1 / NOISE_ODDS


def psi(expected, actual) -> float:
    """The population stability index of `actual` counts against `expected` counts (same bins)."""
    e = np.asarray(expected, dtype=np.float64)
    a = np.asarray(actual, dtype=np.float64)
    if e.sum() <= 0 or a.sum() <= 0:
        return 0.0
    e = np.maximum(e / e.sum(), PSI_FLOOR)
    a = np.maximum(a / a.sum(), PSI_FLOOR)
    return float(np.sum((a - e) * np.log(a / e)))


def noise_psi(expected, actual) -> float:
    """The PSI two samples of one distribution, of these sizes over these bins, exceed once in
    NOISE_ODDS: the chi-square quantile (Wilson-Hilferty's cube-root approximation: within 3% of
    the exact quantile from 2 degrees of freedom, 1% from 5) over the samples' effective size n*m/(n+m)."""
    e = np.asarray(expected, dtype=np.float64)
    a = np.asarray(actual, dtype=np.float64)
    n, m = e.sum(), a.sum()
    df = int(((e > 0) | (a > 0)).sum()) - 1
    if n <= 0 or m <= 0 or df < 1:
        return 0.0
    c = 2.0 / (9.0 * df)
    quantile = df * max(1.0 - c + _NOISE_Z * np.sqrt(c), 0.0) ** 3
    return float(quantile * (n + m) / (n * m))


@dataclass
class Thresholds:
    psi_warn: float = 0.1
    psi_alert: float = 0.25
    max_null_share: float | None = None  # default: the training share plus 0.05
    max_unseen_share: float = 0.05
    max_out_of_range_share: float = 0.05


@dataclass
class FeatureCounts:
    """Mergeable counts of scored rows per feature: {name: [rows, nulls, outside, bins...]}, and of
    the answers per bin of the prediction reference (`predictions`: classes, or value bins) when
    answers are counted too."""

    rows: int = 0
    features: dict = field(default_factory=dict)
    predictions: np.ndarray | None = None

    def add_predictions(self, bin_ids, bins: int) -> "FeatureCounts":
        """Count answers by their bin of the statistics' prediction reference (`prediction_bins`)."""
        counts = np.bincount(np.asarray(bin_ids, dtype=np.int64), minlength=bins)[:bins]
        self.predictions = counts if self.predictions is None else self.predictions + counts
        return self

    def subtract(self, other: "FeatureCounts") -> "FeatureCounts":
        """Take `other` (counts merged earlier) out again: a sliding window's oldest chunk."""
        self.rows -= other.rows
        for name, counts in other.features.items():
            self.features[name] = self.features[name] - counts
        if other.predictions is not None and self.predictions is not None:
            self.predictions = self.predictions - other.predictions
        return self

    def to_dict(self) -> dict:
        return {"rows": self.rows, "features": {k: v.tolist() for k, v in self.features.items()},
                "predictions": None if self.predictions is None else self.predictions.tolist()}

    @classmethod
    def from_dict(cls, data: dict) -> "FeatureCounts":
        return cls(rows=int(data["rows"]), features={k: np.asarray(v, np.int64) for k, v in data["features"].items()},
                   predictions=None if data.get("predictions") is None else np.asarray(data["predictions"], np.int64))

    @classmethod
    def of_frame(cls, statistics: TrainingStatistics, frame) -> "FeatureCounts":
        """Counts of a pandas frame's rows (batch scoring)."""
        import pandas as pd

        numeric, categorical = {}, {}
        for name, stats in statistics.features.items():
            if name in frame.columns:
                if stats.kind == "numeric":
                    numeric[name] = pd.to_numeric(frame[name], errors="coerce").to_numpy(dtype=np.float64,
                                                                                          na_value=np.nan)
                else:
                    categorical[name] = frame[name]
        return cls.of_columns(statistics, len(frame), numeric, categorical)

    @classmethod
    def of_columns(cls, statistics: TrainingStatistics, rows: int, numeric: dict, categorical: dict) -> "FeatureCounts":
        """Counts of `rows` rows given as columns: {name: float array, NaN missing} and {name: raw
        values (a pandas column or an object array, None/NaN missing)}."""
        out = cls(rows=rows)
        for name, x in numeric.items():
            stats = statistics.features[name]
            present = x[~np.isnan(x)]
            bins = np.bincount(np.searchsorted(np.asarray(stats.edges), present, side="right"),
                               minlength=len(stats.edges) + 1) if stats.counts else np.zeros(1)
            outside = int(((present < stats.min) | (present > stats.max)).sum()) if stats.min is not None else 0
            out.features[name] = np.concatenate([[len(x), len(x) - len(present), outside], bins]).astype(np.int64)
        for name, column in categorical.items():
            out.features[name] = _category_counts(statistics.features[name], column)
        return out

    def merge(self, other: "FeatureCounts") -> "FeatureCounts":
        self.rows += other.rows
        for name, counts in other.features.items():
            self.features[name] = self.features[name] + counts if name in self.features else counts.copy()
        if other.predictions is not None:
            self.predictions = (other.predictions.copy() if self.predictions is None
                                else self.predictions + other.predictions)
        return self


def prediction_bins(statistics: TrainingStatistics, outputs) -> tuple[np.ndarray, int] | None:
    """(each answer's bin, how many bins) of the model's `outputs` (a batch of class probabilities,
    or of values) in the statistics' prediction reference; None without one."""
    reference = statistics.predictions
    if reference is None:
        return None
    out = np.asarray(outputs, dtype=np.float64)
    if "labels" in reference:  # classification: the predicted class
        return out.reshape(len(out), -1).argmax(axis=1), len(reference["labels"])
    return _value_bins(reference, out)


def _value_bins(reference: dict, values) -> tuple[np.ndarray, int]:
    """Regression answers by the reference's bins (edges at its deciles); NaN and inf left out."""
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    values = values[np.isfinite(values)]
    return np.searchsorted(np.asarray(reference["edges"]), values, side="right"), len(reference["edges"]) + 1


def answer_bins(statistics: TrainingStatistics, answers) -> tuple[np.ndarray, int] | None:
    """(each answer's bin, how many bins) of written answers (batch scoring's prediction column:
    class labels, or values) in the statistics' prediction reference; None without one. A label
    the reference does not hold (none should: both come from the fitted label) is left out."""
    reference = statistics.predictions
    if reference is None:
        return None
    if "labels" in reference:
        import pandas as pd

        from rayline.data.values import value_key

        # value_key: the reference's labels went through JSON (numpy ints became ints, floats
        # stay floats), the answers are the fitted label's values; both sides keyed the same way.
        index = {value_key(label): i for i, label in enumerate(reference["labels"])}
        codes, uniques = pd.factorize(np.asarray(answers))  # hashed in C; keyed once per distinct answer
        lookup = np.array([index.get(value_key(u), -1) for u in uniques] + [-1], dtype=np.int64)
        ids = lookup[codes]  # a missing answer's code, -1, picks the trailing -1
        return ids[ids >= 0], len(reference["labels"])
    return _value_bins(reference, answers)


def _category_counts(stats, column) -> np.ndarray:
    """[rows, nulls, unseen, count per training category..., unseen] of one categorical column."""
    import pandas as pd

    from rayline.data.values import value_key

    index = {key: i for i, key in enumerate(stats.categories)}
    column = column if isinstance(column, pd.Series) else pd.Series(column, dtype=object)
    nulls = int(column.isna().sum())
    counts = np.zeros(len(stats.categories) + 1, np.int64)  # the last: unseen categories
    for value, n in column.dropna().value_counts(sort=False).items():
        counts[index.get(value_key(value), len(stats.categories))] += int(n)
    return np.concatenate([[len(column), nulls, counts[-1]], counts]).astype(np.int64)


@dataclass
class FeatureDrift:
    name: str
    kind: str
    psi: float
    null_share: float
    train_null_share: float
    outside_share: float  # numeric: outside the training range; categorical: unseen categories
    rows: int
    level: str  # ok | warn | alert
    reasons: list[str] = field(default_factory=list)
    noise_psi: float = 0.0  # the PSI sampling noise alone reaches at these sizes (`noise_psi`): below it, no PSI flag
    train_shares: list[float] = field(default_factory=list)  # per bin / category (+ unseen), for reports
    shares: list[float] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)


def drift(statistics: TrainingStatistics, counts: FeatureCounts, thresholds: Thresholds | None = None) -> list[FeatureDrift]:
    """Each counted feature's drift, the largest PSI first."""
    t = thresholds or Thresholds()
    out = []
    for name, c in counts.features.items():
        stats = statistics.features[name]
        rows, nulls, outside, bins = int(c[0]), int(c[1]), int(c[2]), c[3:]
        present = max(rows - nulls, 0)
        if stats.kind == "numeric":
            expected = np.asarray(stats.counts, dtype=np.float64)
            actual = bins.astype(np.float64)
            labels = _bin_labels(stats.edges)
        else:
            expected = np.asarray(stats.counts + [0], dtype=np.float64)  # unseen: none in training
            actual = bins.astype(np.float64)
            labels = [str(k) for k in stats.categories] + ["(unseen)"]
        value = psi(expected, actual) if present else 0.0
        noise = noise_psi(expected, actual) if present else 0.0
        real = value > noise  # a PSI level needs more than sampling noise
        null_share = nulls / rows if rows else 0.0
        outside_share = outside / present if present else 0.0
        reasons, level = [], "ok"
        max_null = t.max_null_share if t.max_null_share is not None else stats.null_share + 0.05
        limit = t.max_unseen_share if stats.kind == "categorical" else t.max_out_of_range_share
        checks = [(real and value >= t.psi_alert, "alert", f"PSI {value:.3f} >= {t.psi_alert:g}"),
                  (real and t.psi_warn <= value < t.psi_alert, "warn", f"PSI {value:.3f} >= {t.psi_warn:g}"),
                  (null_share > max_null, "alert", f"nulls {null_share:.1%} > {max_null:.1%}"),
                  (outside_share > limit, "alert", ("unseen categories" if stats.kind == "categorical" else
                                                     "outside the training range") + f" {outside_share:.1%} > {limit:.1%}")]
        for hit, lvl, why in checks:
            if hit:
                reasons.append(why)
                level = "alert" if lvl == "alert" or level == "alert" else "warn"
        total_e, total_a = max(expected.sum(), 1.0), max(actual.sum(), 1.0)
        out.append(FeatureDrift(name=name, kind=stats.kind, psi=value, null_share=null_share,
                                train_null_share=stats.null_share, outside_share=outside_share, rows=rows,
                                level=level, reasons=reasons, noise_psi=noise,
                                train_shares=(expected / total_e).tolist(),
                                shares=(actual / total_a).tolist(), labels=labels))
    predicted = statistics.predictions
    if predicted is not None and counts.predictions is not None and counts.predictions.sum() > 0:
        expected = np.asarray(predicted["counts"], dtype=np.float64)
        actual = counts.predictions.astype(np.float64)
        value, noise = psi(expected, actual), noise_psi(expected, actual)
        level = "ok" if value <= noise else "alert" if value >= t.psi_alert else "warn" if value >= t.psi_warn else "ok"
        out.append(FeatureDrift(name=PREDICTION, kind="prediction", psi=value, null_share=0.0, train_null_share=0.0,
                                outside_share=0.0, rows=int(actual.sum()), level=level, noise_psi=noise,
                                reasons=[f"PSI {value:.3f} >= {t.psi_alert if level == 'alert' else t.psi_warn:g}"]
                                if level != "ok" else [],
                                train_shares=(expected / max(expected.sum(), 1.0)).tolist(),
                                shares=(actual / max(actual.sum(), 1.0)).tolist(),
                                labels=([str(v) for v in predicted["labels"]] if "labels" in predicted
                                        else _bin_labels(predicted["edges"]))))
    return sorted(out, key=lambda d: (-d.psi, d.name))


def _bin_labels(edges: list[float]) -> list[str]:
    if not edges:
        return ["all"]
    bounds = [f"{e:.4g}" for e in edges]
    return [f"< {bounds[0]}"] + [f"[{a}, {b})" for a, b in zip(bounds, bounds[1:])] + [f">= {bounds[-1]}"]
