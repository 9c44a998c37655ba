"""One pass over the data that gathers everything the data stage fits: the profile.

Each block yields one small partial (data/partials.py's `block_partials`): rows per split, the
label's nulls and classes, and for the train rows every statistic any step of any preprocessing
variant needs (count, mean and sum of squared deviations, min and max per numeric column; a
quantile sketch where a median is asked for; value counts where categories or a most frequent
value are). The driver merges the partials; nothing it holds grows with the number of rows.

Steps are then fitted in order without another pass: a fitted step tells the statistics what it
did to its columns (`ColumnStats.fill`, `.affine`), and the next step reads them as that step
left them. Moments, ranges, counts and quantiles all follow an imputation (k more values equal
to the fill) and an affine map exactly, so the fitted state equals fitting each step on the
transformed column (tests/unit/test_profile.py checks it against sklearn).

Medians are exact while the train split has at most EXACT_VALUES present values in a column
(the values themselves are kept); above that they come from a KLL sketch (Apache DataSketches,
k=SKETCH_K), whose normalized rank error is about 0.14%: the median returned lies between the
true 49.86th and 50.14th percentiles (99% confidence).
"""

from __future__ import annotations

import copy
import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from rayline.data.split import HASH_COLUMN, SPLITS, TEST, TRAIN, VALID, Thresholds
from rayline.errors import DataError

__all__ = ["ColumnStats", "TrainStats", "Profile", "ProfileRequest", "profile_frame", "profile_dataset", "image_key", "words_key",
           "EXACT_VALUES", "SKETCH_K", "MAX_CATEGORIES", "MAX_LABEL_VALUES", "MONITOR_SAMPLE"]

EXACT_VALUES = 100_000  # per column: up to this many present values, medians are exact
SKETCH_K = 2048  # KLL accuracy parameter: normalized rank error ~0.14% (DataSketches' table)
MAX_CATEGORIES = 10_000  # distinct values kept per counted column; more is an error where counts are used
MAX_LABEL_VALUES = 10_000  # distinct label values kept: more can only be a regression label
_GRID = 8192  # quantiles read off a sketch to combine it with imputed values
MONITOR_SAMPLE = 16  # monitoring's sketch sees one train row in this many (beyond the exact values)


def _plain(value):
    value = value.item() if hasattr(value, "item") and not isinstance(value, (str, bytes)) else value
    return value


def _distinct(series: pd.Series, cap: int) -> tuple[dict, bool]:
    """{value: count} of the non-null values (Python scalars), and whether there were more than `cap`."""
    counts = series.value_counts(dropna=True, sort=False)
    if len(counts) > cap:
        return {}, True
    return {_plain(k): int(v) for k, v in zip(counts.index, counts.to_numpy())}, False


def _merge_sketches(a: bytes | None, b: bytes | None) -> bytes | None:
    """Two serialized KLL sketches as one (either may be None)."""
    if a is None or b is None:
        return a if b is None else b
    from datasketches import kll_doubles_sketch

    kll = kll_doubles_sketch.deserialize(a)
    kll.merge(kll_doubles_sketch.deserialize(b))
    return kll.serialize()


def _merge_counts(a: dict, b: dict) -> dict:
    # Keys by type and value: 1, 1.0 and True stay apart here, as they were read (value_key
    # decides later which of them name the same category).
    out = Counter({(type(k).__name__, k): v for k, v in a.items()})
    for k, v in b.items():
        out[(type(k).__name__, k)] += v
    return {k: v for (_, k), v in out.items()}


# ---------------------------------------------------------------- one column's statistics


class ColumnStats:
    """Statistics of one column of the train split, as the steps fitted so far leave it."""

    def __init__(self):
        self.n = 0  # present (non-missing) values
        self.missing = 0
        self.mean = 0.0
        self.m2 = 0.0  # sum of squared deviations from the mean
        self.min: float | None = None
        self.max: float | None = None
        self.values: list[np.ndarray] | None = []  # exact present values while small, else None
        self.sketch: bytes | None = None  # serialized KLL sketch of the raw present values
        # ... of a 1/MONITOR_SAMPLE sample of them (monitoring's histogram edges; no median reads it)
        self.sampled: bytes | None = None
        self.counts: dict | None = None  # value -> count, when asked for
        self.too_many = False  # more than MAX_CATEGORIES distinct values
        # What the steps did since the raw values were summarised: x -> scale * x + shift,
        # plus imputed point masses (value, count) in the current space.
        self.scale, self.shift = 1.0, 0.0
        self.points: list[tuple[float, int]] = []

    # ------------------------------------------------------------ building, per block and merged

    @classmethod
    def of_numbers(cls, x: np.ndarray, keep_values: bool, sketch: bool) -> "ColumnStats":
        s = cls()
        present = x[~np.isnan(x)]
        s.missing, s.n = len(x) - len(present), len(present)
        if s.n:
            s.mean = float(present.mean())
            s.m2 = float(((present - s.mean) ** 2).sum())
            s.min, s.max = float(present.min()), float(present.max())
        s.values = [present] if keep_values and s.n <= EXACT_VALUES else None
        if sketch and s.n:
            from datasketches import kll_doubles_sketch

            kll = kll_doubles_sketch(SKETCH_K)
            kll.update(present)
            s.sketch = kll.serialize()
        return s

    def sample_sketch(self, sample: np.ndarray) -> None:
        """Sketch `sample` (some of this block's values) into `sampled`."""
        present = sample[~np.isnan(sample)]
        if len(present):
            from datasketches import kll_doubles_sketch

            kll = kll_doubles_sketch(SKETCH_K)
            kll.update(present)
            self.sampled = kll.serialize()

    def merge(self, other: "ColumnStats") -> "ColumnStats":
        """Chan et al.'s parallel update of count, mean and squared deviations; values, sketches and counts joined."""
        n = self.n + other.n
        if other.n and other.min is not None:  # a numeric summary (a counted-only column has no moments)
            if self.n and self.min is not None:
                delta = other.mean - self.mean
                self.mean += delta * other.n / n
                self.m2 += other.m2 + delta * delta * self.n * other.n / n
                self.min, self.max = min(self.min, other.min), max(self.max, other.max)
            else:
                self.mean, self.m2, self.min, self.max = other.mean, other.m2, other.min, other.max
        self.n, self.missing = n, self.missing + other.missing
        if self.values is None or other.values is None or n > EXACT_VALUES:
            self.values = None
        else:
            self.values = self.values + other.values
        self.sketch = _merge_sketches(self.sketch, other.sketch)
        self.sampled = _merge_sketches(self.sampled, other.sampled)
        if other.too_many or self.too_many:
            self.counts, self.too_many = None, True
        elif other.counts is not None:
            merged = other.counts if self.counts is None else _merge_counts(self.counts, other.counts)
            self.counts, self.too_many = (None, True) if len(merged) > MAX_CATEGORIES else (merged, False)
        return self

    # ------------------------------------------------------------ what steps do to the column

    def fill(self, value) -> None:
        """Every missing value becomes `value` (an impute step)."""
        k, self.missing = self.missing, 0
        if not k:
            return
        if self.counts is not None:
            self.counts = _merge_counts(self.counts, {value: k})
        if isinstance(value, (bool, int, float, np.number)) and not isinstance(value, str):
            c = float(value)
            n = self.n + k
            if self.n:
                delta = c - self.mean
                self.mean += delta * k / n
                self.m2 += delta * delta * self.n * k / n
                self.min, self.max = min(self.min, c), max(self.max, c)
            else:
                self.mean, self.m2, self.min, self.max = c, 0.0, c, c
            self.points.append((c, k))
            self.n = n
        else:
            self.n += k

    def affine(self, scale: float, shift: float) -> None:
        """x -> scale * x + shift (a scaling step)."""
        self.mean = scale * self.mean + shift
        self.m2 *= scale * scale
        if self.min is not None:
            self.min, self.max = sorted((scale * self.min + shift, scale * self.max + shift))
        self.scale, self.shift = scale * self.scale, scale * self.shift + shift
        self.points = [(scale * v + shift, k) for v, k in self.points]
        if self.counts is not None:
            self.counts = {scale * float(v) + shift: k for v, k in self.counts.items()}

    # ------------------------------------------------------------ reading

    def median(self) -> float | None:
        if not self.n:
            return None
        if self.values is not None:
            raw = np.concatenate(self.values) if self.values else np.empty(0)
            parts = [raw * self.scale + self.shift] + [np.full(k, v) for v, k in self.points]
            return float(np.median(np.concatenate(parts)))
        if self.sketch is None:
            raise DataError("internal: a median was asked of a column summarised without a sketch")
        from datasketches import kll_doubles_sketch

        kll = kll_doubles_sketch.deserialize(self.sketch)
        ranks = (np.arange(_GRID) + 0.5) / _GRID
        grid = np.asarray(kll.get_quantiles(ranks), dtype=np.float64) * self.scale + self.shift
        weights = np.full(_GRID, kll.n / _GRID)
        if self.points:
            grid = np.concatenate([grid, [v for v, _ in self.points]])
            weights = np.concatenate([weights, [k for _, k in self.points]])
        order = np.argsort(grid, kind="stable")
        cumulative = np.cumsum(weights[order])
        return float(grid[order][np.searchsorted(cumulative, cumulative[-1] / 2)])

    def stat(self, name: str) -> float | None:
        if not self.n:
            return None
        if name == "mean":
            return self.mean
        if name == "std":
            return math.sqrt(max(self.m2, 0.0) / self.n)
        if name == "median":
            return self.median()
        if name in ("min", "max"):
            return getattr(self, name)
        raise ValueError(f"unknown statistic {name!r}")


# ---------------------------------------------------------------- the train split's statistics, as steps see them


class TrainStats:
    """What a step's `fit` reads (numeric statistics, distinct values, counts), for the columns
    as the steps fitted before it leave them; `apply(step)` moves it past a fitted step."""

    def __init__(self, columns: dict[str, ColumnStats], images: dict | None = None, words: dict | None = None):
        self.columns = columns
        self.images = images or {}  # image_key(...) -> [pixels, sum per channel..., sum of squares per channel...]
        self.words = words or {}  # words_key(...) -> Counter of the column's words (rayline/data/text.py)

    def word_counts(self, col: str, lowercase: bool):
        counts = self.words.get(words_key(col, lowercase))
        if counts is None:
            raise DataError(f"internal: word counts of {col!r} were not gathered")
        return counts
        self.where = "data.preprocess"  # the step being fitted, for error messages

    def image_moments(self, columns: list[str], size, channels: int) -> tuple[list[float], list[float]]:
        """Mean and standard deviation of each channel over the train split's pixels of `columns`
        (decoded, converted and resized as the image step does)."""
        total = np.zeros(1 + 2 * channels)
        for col in columns:
            moments = self.images.get(image_key(col, size, channels))
            if moments is None:
                raise DataError(f"internal: pixel statistics of {col!r} were not gathered")
            total += moments
        if total[0] == 0:
            raise DataError(f"{self.where}: columns {columns} have no images in the train split")
        mean = total[1:1 + channels] / total[0]
        var = np.maximum(total[1 + channels:] / total[0] - mean ** 2, 0.0)
        return [float(m) for m in mean], [float(v) for v in np.sqrt(var)]

    def _column(self, col: str) -> ColumnStats:
        return self.columns[col]

    def numeric(self, names: tuple[str, ...], cols: list[str]) -> dict[str, dict[str, float | None]]:
        return {name: {col: self._column(col).stat(name) for col in cols} for name in names}

    def _counts(self, col: str) -> dict:
        stats = self._column(col)
        if stats.too_many:
            raise DataError(
                f"{self.where}: column {col!r} has more than {MAX_CATEGORIES:,} distinct values in the train split "
                f"(allowed: at most {MAX_CATEGORIES:,} for one_hot and impute most_frequent; leave the column out of "
                "data.features, or impute it with mean, median or constant)")
        if stats.counts is None:
            raise DataError(f"internal: counts of {col!r} were not gathered")
        return stats.counts

    def unique(self, col: str) -> list:
        return list(self._counts(col))

    def value_counts(self, col: str) -> list:
        return list(self._counts(col).items())

    def apply(self, step) -> None:
        step.advance_stats(self)


# ---------------------------------------------------------------- the one pass


@dataclass
class ProfileRequest:
    """What the pass gathers: derived from the spec's preprocessing variants before reading."""

    label: str | None
    numeric: list[str]  # moments (and exact values while small) of these
    quantiles: list[str]  # ... plus a sketch
    counted: list[str]  # value counts
    images: list = field(default_factory=list)  # (column, height, width, channels): per-channel pixel moments
    texts: list = field(default_factory=list)  # (column, lowercase): word counts
    valid: float = 0.0
    test: float = 0.0
    probe_rows: int = 0
    probe_split: str = TEST

    @classmethod
    def for_steps(cls, label, features, kinds: dict, variants_steps: list[list], **kw) -> "ProfileRequest":
        from rayline.data.steps import NUMERIC_KINDS, ColumnPlan, Image, Impute, OneHot, Text, kind_and_params

        numeric = [c for c in features if kinds.get(c) in NUMERIC_KINDS]
        quantiles, counted, images, texts = set(), set(), set(), set()
        for steps in variants_steps:
            plan = ColumnPlan.of(features, kinds, steps)
            for step_model in steps:
                kind, params = kind_and_params(step_model)
                columns = plan.resolve(params.columns)
                if kind == OneHot.kind:
                    counted.update(columns)
                elif kind == Impute.kind and params.strategy == "median":
                    quantiles.update(columns)
                elif kind == Impute.kind and params.strategy == "most_frequent":
                    counted.update(columns)
                elif kind == Image.kind and params.normalize == "per_channel":
                    images.update((c, *params.size, params.channels) for c in columns if c in features)
                elif kind == Text.kind:
                    texts.update((c, params.lowercase) for c in columns if c in features)
        keep = set(features)
        return cls(label=label, numeric=numeric, quantiles=sorted(quantiles & keep),
                   counted=sorted(counted & keep), images=sorted(images), texts=sorted(texts), **kw)


@dataclass
class Profile:
    """The merged result of the pass."""

    rows: dict[str, int] = field(default_factory=lambda: {s: 0 for s in SPLITS})
    label_nulls: int = 0
    label_values: dict | None = field(default_factory=dict)  # None: more than MAX_LABEL_VALUES distinct
    train: dict[str, ColumnStats] = field(default_factory=dict)
    probe: pd.DataFrame | None = None  # the probe split's rows with the smallest hashes, hash order
    images: dict = field(default_factory=dict)  # image_key -> pixel moments (TrainStats.images)
    words: dict = field(default_factory=dict)  # words_key -> word counts (TrainStats.words)

    def train_stats(self) -> TrainStats:
        """A fresh copy for one variant's fitting (fitting moves it past each step)."""
        return TrainStats(copy.deepcopy(self.train), copy.deepcopy(self.images), self.words)

    def merge(self, other: "Profile", probe_rows: int) -> "Profile":
        for s in SPLITS:
            self.rows[s] += other.rows[s]
        self.label_nulls += other.label_nulls
        if self.label_values is None or other.label_values is None:
            self.label_values = None
        else:
            merged = _merge_counts(self.label_values, other.label_values)
            self.label_values = merged if len(merged) <= MAX_LABEL_VALUES else None
        for col, stats in other.train.items():
            self.train[col] = self.train[col].merge(stats) if col in self.train else stats
        for key, moments in other.images.items():
            self.images[key] = self.images[key] + moments if key in self.images else moments
        if other.words:
            from rayline.data.text import merge_word_counts

            for key, counts in other.words.items():
                self.words[key] = merge_word_counts(self.words[key], counts) if key in self.words else counts
        if other.probe is not None and len(other.probe):
            joined = other.probe if self.probe is None else pd.concat([self.probe, other.probe], ignore_index=True)
            self.probe = joined.sort_values(HASH_COLUMN, kind="stable").head(probe_rows).reset_index(drop=True)
        return self


class BlockProfile:
    """A picklable per-block callable: one block (pandas) -> its `Profile`."""

    def __init__(self, request: ProfileRequest):
        self.request = request

    def __call__(self, batch: pd.DataFrame) -> Profile:
        req, out = self.request, Profile()
        hashes = batch[HASH_COLUMN].to_numpy(dtype=np.uint64) if HASH_COLUMN in batch.columns else None
        train_hashes = None
        if hashes is None:  # a dataset that is all train rows (fit_preprocessing on a plain Dataset)
            out.rows[TRAIN] = len(batch)
            train = batch
        else:
            thresholds = Thresholds(req.valid, req.test)
            out.rows = thresholds.counts(hashes)
            in_train = thresholds.mask(hashes, TRAIN)
            train, train_hashes = batch[in_train], hashes[in_train]
            if req.probe_rows:
                mask = thresholds.mask(hashes, req.probe_split)
                candidates = batch[mask]
                order = np.argsort(hashes[mask], kind="stable")[: req.probe_rows]
                out.probe = candidates.iloc[order].reset_index(drop=True)
        if req.label is not None and req.label in batch.columns:
            column = batch[req.label]
            out.label_nulls = int(column.isna().sum())
            values, too_many = _distinct(column, MAX_LABEL_VALUES)
            out.label_values = None if too_many else values
        # Monitoring's histogram edges (rayline/monitoring/statistics.py) beyond the exact values:
        # a sketch of a fixed 1/MONITOR_SAMPLE of the train rows, picked by their split hash (the
        # same rows on every run, uniform over blocks). A sketch of every value cost 5x the moments.
        sample = None
        for col in req.numeric:
            x = train[col].to_numpy(dtype=np.float64, na_value=np.nan)
            stats = out.train[col] = ColumnStats.of_numbers(x, keep_values=True, sketch=col in req.quantiles)
            if col not in req.quantiles and len(x) > MONITOR_SAMPLE:
                if sample is None:
                    sample = _monitor_sample(train_hashes, len(x))
                stats.sample_sketch(x[sample])
        for col in req.counted:
            stats = out.train.get(col)
            if stats is None:
                stats = out.train[col] = ColumnStats()
                stats.missing = int(train[col].isna().sum())
                stats.n = len(train) - stats.missing
                stats.values = None
            counts, too_many = _distinct(train[col], MAX_CATEGORIES)
            stats.counts, stats.too_many = (None, True) if too_many else (counts, False)
        for col, height, width, channels in req.images:
            out.images[image_key(col, (height, width), channels)] = _pixel_moments(train[col], (height, width), channels, col)
        if req.texts:
            from rayline.data.text import word_counts

            for col, lowercase in req.texts:
                out.words[words_key(col, lowercase)] = word_counts(train[col], lowercase, col)
        return out


def _monitor_sample(train_hashes, rows: int) -> np.ndarray:
    """Which train rows of a block feed the monitoring sketch: those whose hash, scrambled, falls
    in the first 1/MONITOR_SAMPLE of the range (every MONITOR_SAMPLE-th row without hashes)."""
    if train_hashes is None:
        return np.arange(rows) % MONITOR_SAMPLE == 0
    scrambled = train_hashes.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    return scrambled < np.uint64(2**64 // MONITOR_SAMPLE)


def words_key(col: str, lowercase: bool) -> str:
    return f"{col}|{'lower' if lowercase else 'cased'}"


def image_key(col: str, size, channels: int) -> str:
    return f"{col}|{int(size[0])}x{int(size[1])}x{int(channels)}"


def _pixel_moments(values, size, channels: int, col: str) -> np.ndarray:
    """[pixels, sum per channel, sum of squares per channel] of one block's images, decoded as the
    image step decodes them (an undecodable one is the same error, naming its row)."""
    from rayline.data.images import decode_images

    values = values.to_numpy(dtype=object) if hasattr(values, "to_numpy") else values
    total = np.zeros(1 + 2 * channels)
    for start in range(0, len(values), _IMAGE_CHUNK):  # bounded memory whatever the block's size
        pixels = decode_images(values[start:start + _IMAGE_CHUNK], size, channels, col,
                               lambda i, start=start: f"row {start + i} of ").reshape(-1, channels).astype(np.float64)
        total += np.concatenate([[len(pixels)], pixels.sum(axis=0), (pixels ** 2).sum(axis=0)])
    return total


_IMAGE_CHUNK = 256  # images decoded at once while profiling


def profile_frame(frame: pd.DataFrame, request: ProfileRequest) -> Profile:
    """The profile of a pandas frame (unit tests, small local data): the same code as a block."""
    return BlockProfile(request)(frame)


def profile_dataset(ds, request: ProfileRequest) -> Profile:
    """The profile of a Ray Dataset, in one pass of per-block partials merged on the driver."""
    from rayline.data.partials import block_partials

    merged = Profile()
    for partial in block_partials(ds, BlockProfile(request)):
        merged.merge(partial, request.probe_rows)
    return merged
