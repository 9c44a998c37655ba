"""The data stage's one pass: statistics gathered per block and merged, and steps fitted from them
without another pass, equal sklearn fitting each step on the column as the earlier steps left it."""

import numpy as np
import pandas as pd
import pytest
from sklearn.impute import SimpleImputer
from sklearn.preprocessing import MinMaxScaler, StandardScaler

from rayline.data import profile as profile_mod
from rayline.data.preprocess import FeatureInfo, LabelInfo, fit_preprocessing
from rayline.data.profile import Profile, ProfileRequest, profile_frame
from rayline.errors import DataError
from rayline.spec.pipeline_spec import DataSpec

ONE_HOT_C = {"one_hot": {"columns": ["c"]}}
LABEL = LabelInfo(name="y", task="classification", classes=[0, 1])


def _frame(n=2000, seed=3):
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({
        "a": rng.normal(50, 12, n),
        "b": rng.exponential(3.0, n),
        "k": rng.integers(0, 40, n).astype(float),
        "c": rng.choice(["red", "green", "blue"], n, p=[0.5, 0.3, 0.2]).astype(object),
        "y": rng.integers(0, 2, n),
    })
    frame.loc[rng.random(n) < 0.1, "a"] = np.nan
    frame.loc[rng.random(n) < 0.2, "b"] = np.nan
    frame.loc[rng.random(n) < 0.15, "c"] = None
    return frame


FEATURES = [FeatureInfo("a", "number"), FeatureInfo("b", "number"), FeatureInfo("k", "number"), FeatureInfo("c", "string")]


def _steps(*steps):
    return DataSpec.model_validate({"source": {"format": "sklearn", "name": "iris"}, "label": "y",
                                    "preprocess": list(steps)}).preprocess


def _by_blocks(frame, steps, sizes):
    """Fit from the merge of per-block profiles (what the data stage does on Ray)."""
    names = [f.name for f in FEATURES]
    request = ProfileRequest.for_steps(None, names, {f.name: f.kind for f in FEATURES}, [steps])
    merged, start = Profile(), 0
    for size in sizes:
        merged.merge(profile_frame(frame.iloc[start:start + size][names], request), 0)
        start += size
    assert start == len(frame)
    return fit_preprocessing(merged.train_stats(), FEATURES, LABEL, steps)


LAYOUTS = [[2000], [1, 1999], [500] * 4, [0, 7, 0, 1993], [3] * 666 + [2]]


@pytest.mark.parametrize("sizes", LAYOUTS)
def test_impute_median_then_standard_scale_equals_sklearn_fitted_step_by_step(sizes):
    frame = _frame()
    fitted = _by_blocks(frame, _steps({"impute": {"columns": ["a", "b"], "strategy": "median"}},
                                      {"standard_scale": {"columns": ["a", "b", "k"]}}, ONE_HOT_C), sizes)
    imputer = SimpleImputer(strategy="median").fit(frame[["a", "b"]])
    assert fitted.steps[0].fill == pytest.approx(dict(zip("ab", imputer.statistics_)), rel=0, abs=0)
    filled = frame[["a", "b", "k"]].copy()
    filled[["a", "b"]] = imputer.transform(frame[["a", "b"]])
    scaler = StandardScaler().fit(filled)
    for i, col in enumerate("abk"):
        mean, std = fitted.steps[1].stats[col]
        assert mean == pytest.approx(scaler.mean_[i], rel=1e-12)
        assert std == pytest.approx(scaler.scale_[i], rel=1e-12)


@pytest.mark.parametrize("sizes", LAYOUTS[:3])
def test_scale_then_impute_mean_then_min_max_follows_each_step(sizes):
    frame = _frame()
    fitted = _by_blocks(frame, _steps({"standard_scale": {"columns": ["a"]}},
                                      {"impute": {"columns": ["a"], "strategy": "median"}},
                                      {"impute": {"columns": ["b"], "strategy": "mean"}},
                                      {"min_max_scale": {"columns": ["a", "b"]}}, ONE_HOT_C), sizes)
    scaled = StandardScaler().fit_transform(frame[["a"]])  # NaN kept, as sklearn's scalers do
    median = SimpleImputer(strategy="median").fit(scaled).statistics_[0]
    assert fitted.steps[1].fill["a"] == pytest.approx(median, rel=1e-12)
    a = SimpleImputer(strategy="median").fit_transform(scaled)[:, 0]
    b = SimpleImputer(strategy="mean").fit_transform(frame[["b"]])[:, 0]
    assert fitted.steps[2].fill["b"] == pytest.approx(np.nanmean(frame["b"]), rel=1e-12)
    minmax = MinMaxScaler().fit(np.column_stack([a, b]))
    assert fitted.steps[3].stats["a"] == pytest.approx([minmax.data_min_[0], minmax.data_max_[0]], rel=1e-12)
    assert fitted.steps[3].stats["b"] == pytest.approx([minmax.data_min_[1], minmax.data_max_[1]], rel=1e-12)


@pytest.mark.parametrize("sizes", LAYOUTS[:3])
def test_most_frequent_and_constant_fills_then_one_hot_categories_and_counts(sizes):
    frame = _frame()
    fitted = _by_blocks(frame, _steps({"impute": {"columns": ["c"], "strategy": "most_frequent"}},
                                      {"impute": {"columns": ["k"], "strategy": "most_frequent"}},
                                      {"one_hot": {"columns": ["c"]}}), sizes)
    assert fitted.steps[0].fill == {"c": SimpleImputer(strategy="most_frequent").fit(frame[["c"]]).statistics_[0]}
    assert fitted.steps[1].fill == {"k": SimpleImputer(strategy="most_frequent").fit(frame[["k"]]).statistics_[0]}
    assert fitted.steps[2].categories == {"c": ["blue", "green", "red"]}


def test_fitting_from_a_frame_and_from_blocks_gives_the_same_state():
    frame = _frame()
    steps = _steps({"impute": {"columns": "numeric", "strategy": "median"}}, {"one_hot": {"columns": ["c"]}},
                   {"standard_scale": {"columns": "numeric"}})
    whole = fit_preprocessing(frame, FEATURES, LABEL, steps)
    blocks = _by_blocks(frame, steps, [700, 600, 700])
    assert whole.steps[0] == blocks.steps[0] and whole.steps[1] == blocks.steps[1]
    for col, (mean, std) in whole.steps[2].stats.items():
        assert blocks.steps[2].stats[col] == pytest.approx([mean, std], rel=1e-12)


def test_a_median_beyond_the_exact_limit_comes_from_the_sketch_within_its_rank_error(monkeypatch):
    monkeypatch.setattr(profile_mod, "EXACT_VALUES", 1000)
    rng = np.random.default_rng(0)
    n = 200_000
    frame = pd.DataFrame({"a": rng.lognormal(0, 1, n), "b": 0.0, "k": 0.0, "c": "x", "y": 0})
    frame.loc[rng.random(n) < 0.3, "a"] = np.nan
    fitted = _by_blocks(frame, _steps({"standard_scale": {"columns": ["a"]}},
                                      {"impute": {"columns": ["a"], "strategy": "median"}}, ONE_HOT_C), [50_000] * 4)
    present = np.sort(((frame["a"] - frame["a"].mean()) / frame["a"].std(ddof=0)).dropna().to_numpy())
    rank = np.searchsorted(present, fitted.steps[1].fill["a"]) / len(present)
    # KLL with k=2048: normalized rank error ~0.14% (99% confidence); the grid adds 1/8192.
    assert abs(rank - 0.5) < 0.003


@pytest.mark.parametrize("exact", [True, False])
def test_a_median_after_imputing_counts_the_filled_values(monkeypatch, exact):
    if not exact:
        monkeypatch.setattr(profile_mod, "EXACT_VALUES", 100)
    # 6,000 values 1..6000 and 4,000 gaps filled with 0: the filled column's median is 1000.5
    # (the raw values' is 3000.5).
    a = np.r_[np.arange(1, 6001, dtype=float), np.full(4000, np.nan)]
    request = ProfileRequest(label=None, numeric=["a"], quantiles=["a"], counted=[])
    merged = Profile()
    for start in range(0, 10_000, 2500):
        merged.merge(profile_frame(pd.DataFrame({"a": a[start:start + 2500]}), request), 0)
    stats = merged.train_stats()
    assert stats.numeric(("median",), ["a"])["median"]["a"] == pytest.approx(3000.5, abs=0 if exact else 20)
    stats.columns["a"].fill(0)
    filled = np.nan_to_num(a)
    assert stats.numeric(("median", "mean", "std"), ["a"]) == {
        "median": {"a": pytest.approx(np.median(filled), abs=0 if exact else 20)},
        "mean": {"a": pytest.approx(filled.mean(), rel=1e-12)},
        "std": {"a": pytest.approx(filled.std(), rel=1e-12)},
    }


def test_a_one_hot_column_with_too_many_categories_names_the_step_and_column(monkeypatch):
    monkeypatch.setattr(profile_mod, "MAX_CATEGORIES", 10)
    frame = _frame()
    frame["c"] = [f"v{i % 50}" for i in range(len(frame))]
    with pytest.raises(DataError, match=r"data.preprocess\[0\].one_hot: column 'c' has more than 10 distinct values"):
        _by_blocks(frame, _steps({"one_hot": {"columns": ["c"]}}), [1000, 1000])


def test_the_profile_holds_no_rows_of_the_train_split():
    """Nothing that grows with the rows: exact values are dropped past the limit, counts past the cap."""
    frame = _frame(n=5000)
    request = ProfileRequest.for_steps(None, ["a", "c"], {"a": "number", "c": "string"},
                                       [_steps({"one_hot": {"columns": ["c"]}})])
    merged = Profile()
    old = profile_mod.EXACT_VALUES
    try:
        profile_mod.EXACT_VALUES = 100
        for start in range(0, 5000, 1000):
            merged.merge(profile_frame(frame.iloc[start:start + 1000][["a", "c"]], request), 0)
    finally:
        profile_mod.EXACT_VALUES = old
    assert merged.train["a"].values is None
    assert merged.train["c"].counts == frame["c"].value_counts().to_dict()
