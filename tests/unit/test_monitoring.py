"""Training statistics and drift, without Ray: the statistics equal numpy and pandas on the same
data (exact, and from the sketch beyond the exact limit), PSI on known distributions, counts that
merge as one count, and drift that flags exactly the shifted feature and the unseen category.

Batch scoring's drift summary, from a registered version's artifact, is tested end to end in
tests/integration/test_batch_scoring.py.
"""

import json

import numpy as np
import pandas as pd
import pytest

from rayline.data.preprocess import FeatureInfo
from rayline.data.profile import EXACT_VALUES, ProfileRequest, profile_frame
from rayline.monitoring import BINS, FeatureCounts, Thresholds, TrainingStatistics, drift, psi
from rayline.spec.data_spec import DataSpec


def _frame(n=4000, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(10.0, 2.0, n)
    x[rng.random(n) < 0.05] = np.nan
    return pd.DataFrame({"x": x, "k": rng.integers(0, 50, n), "city": rng.choice(["a", "b", "c"], n, p=[0.5, 0.3, 0.2]),
                         "y": rng.integers(0, 2, n)})


def _statistics(frame):
    features = [FeatureInfo("x", "number"), FeatureInfo("k", "integer"), FeatureInfo("city", "string")]
    steps = DataSpec.model_validate({"source": {"format": "csv", "path": "u.csv"}, "label": "y",
                                     "preprocess": [{"one_hot": {"columns": ["city"]}}]}).preprocess
    kinds = {"x": "number", "k": "integer", "city": "string"}
    request = ProfileRequest.for_steps("y", ["x", "k", "city"], kinds, [steps])
    return TrainingStatistics.of_profile(profile_frame(frame, request), features, {"city"})


def test_statistics_equal_numpy_and_pandas():
    frame = _frame()
    stats = _statistics(frame)
    x = stats.features["x"]
    present = frame["x"].dropna().to_numpy()
    assert (x.count, x.nulls) == (len(present), int(frame["x"].isna().sum()))
    assert x.mean == pytest.approx(present.mean()) and x.std == pytest.approx(present.std())
    assert (x.min, x.max) == (present.min(), present.max())
    edges = np.quantile(present, np.arange(1, BINS) / BINS)
    np.testing.assert_allclose(x.edges, edges)
    assert x.counts == np.bincount(np.searchsorted(edges, present, side="right"), minlength=BINS).tolist()
    city = stats.features["city"]
    assert city.categories == ["a", "b", "c"]
    assert city.counts == [int((frame["city"] == c).sum()) for c in "abc"] and city.nulls == 0
    assert stats.features["k"].kind == "numeric" and stats.rows == len(frame)
    # through JSON and back, as the artifact holds it
    again = TrainingStatistics.from_dict(json.loads(json.dumps(stats.to_dict())))
    assert again.to_dict() == stats.to_dict()


def test_beyond_the_exact_limit_the_histogram_comes_from_the_sketch():
    n = EXACT_VALUES + 50_000
    x = np.random.default_rng(1).exponential(3.0, n)
    frame = pd.DataFrame({"x": x, "k": 0, "city": "a", "y": 0})
    stats = _statistics(frame).features["x"]
    exact = np.quantile(x, np.arange(1, BINS) / BINS)
    # The sketch sees 1 row in 16 (9,375 here): a decile's rank has a standard deviation of about
    # 2 / sqrt(n) = 0.5%, plus KLL's 0.14%; each edge sits within 2% of rank of the true decile
    ranks = np.searchsorted(np.sort(x), stats.edges) / n
    np.testing.assert_allclose(ranks, np.arange(1, BINS) / BINS, atol=0.02)
    assert sum(stats.counts) == pytest.approx(n)
    np.testing.assert_allclose(np.asarray(stats.counts) / n, 0.1, atol=0.02)
    assert len(stats.edges) == len(exact)


def test_psi_on_known_distributions():
    assert psi([10, 20, 70], [10, 20, 70]) == 0.0
    assert psi([10, 20, 70], [1, 2, 7]) == pytest.approx(0.0)  # shares, not counts
    e, a = np.array([0.5, 0.5]), np.array([0.25, 0.75])
    assert psi(e * 100, a * 100) == pytest.approx(np.sum((a - e) * np.log(a / e)))
    # an empty bin is floored, not infinite
    assert np.isfinite(psi([50, 50, 0], [40, 40, 20])) and psi([50, 50, 0], [40, 40, 20]) > 1.0
    rng = np.random.default_rng(2)
    train = rng.normal(0, 1, 20_000)
    edges = np.quantile(train, np.arange(1, BINS) / BINS)

    def hist(v):
        return np.bincount(np.searchsorted(edges, v, side="right"), minlength=BINS)

    assert psi(hist(train), hist(rng.normal(0, 1, 5_000))) < 0.02  # the same distribution
    assert psi(hist(train), hist(rng.normal(2, 1, 5_000))) > 1.0  # shifted by two standard deviations


def test_noise_psi_is_the_chi_square_quantile_and_small_samples_of_one_distribution_stay_unflagged():
    """Two samples of one distribution reach a PSI of 0.1 often when one is small (a few hundred
    test rows as the prediction reference); a PSI counts only above the noise level, which is
    scipy's chi-square quantile over the effective sample size, and a real shift still alerts."""
    from scipy.stats import chi2

    from rayline.monitoring.drift import NOISE_ODDS, noise_psi

    for bins, n, m in ((3, 500, 500), (5, 180, 2000), (10, 360, 600), (31, 10_000, 10_000)):
        exact = chi2.ppf(1 - 1 / NOISE_ODDS, bins - 1) * (n + m) / (n * m)
        assert noise_psi(np.full(bins, n / bins), np.full(bins, m / bins)) == pytest.approx(exact, rel=0.03)
    assert noise_psi([0, 10], [0, 10]) == 0.0  # one bin in use: nothing can drift

    stats = _statistics(_frame())
    classes = np.full(10, 0.1)
    rng = np.random.default_rng(8)
    raw = flagged = 0
    for _ in range(300):
        stats.predictions = {"labels": list(range(10)), "counts": rng.multinomial(180, classes).tolist()}
        counts = FeatureCounts(rows=2000).add_predictions(rng.choice(10, 2000), 10)
        (prediction,) = [d for d in drift(stats, counts) if d.name == "(prediction)"]
        raw += prediction.psi >= 0.1
        flagged += prediction.level != "ok"
    assert raw >= 10 and flagged <= 3, (raw, flagged)  # ~7% of such windows reach 0.1; ~0.2% beyond the noise
    # a class that goes from 10% to 40% of the answers is no noise, at the same sizes (PSI ~0.54;
    # the noise level is ~0.17: 180 reference rows cannot tell a shift to 25% from noise)
    stats.predictions = {"labels": list(range(10)), "counts": [18] * 10}
    shifted = rng.choice(10, 2000, p=np.r_[0.4, np.full(9, 0.6 / 9)])
    (prediction,) = [d for d in drift(stats, FeatureCounts(rows=2000).add_predictions(shifted, 10))
                     if d.name == "(prediction)"]
    assert prediction.level == "alert" and prediction.psi > prediction.noise_psi, prediction


def test_written_answers_count_into_the_prediction_reference():
    """Batch scoring counts its output column: class labels by the reference's labels (whatever
    numeric type carries them), values by the reference's bin edges; missing answers are left out."""
    from rayline.monitoring.drift import answer_bins

    stats = _statistics(_frame())
    assert answer_bins(stats, np.array([1, 2])) is None  # no reference: nothing to count
    stats.predictions = {"labels": [0, 1, 2], "counts": [5, 5, 5]}
    ids, bins = answer_bins(stats, np.array([2, 0, 2, 1], dtype=np.int64))
    assert bins == 3 and ids.tolist() == [2, 0, 2, 1]
    ids, _ = answer_bins(stats, np.array([2.0, 1.0, None], dtype=object))
    assert ids.tolist() == [2, 1]
    stats.predictions = {"labels": ["bug", "billing"], "counts": [5, 5]}
    ids, bins = answer_bins(stats, np.array(["billing", "billing", "bug"], dtype=object))
    assert bins == 2 and ids.tolist() == [1, 1, 0]
    stats.predictions = {"edges": [10.0, 20.0], "counts": [1, 1, 1]}
    ids, bins = answer_bins(stats, np.array([5.0, 10.0, 25.0, np.nan]))
    assert bins == 3 and ids.tolist() == [0, 1, 2]


def test_counts_merge_as_one_count_and_drift_names_the_shifted_and_the_unseen():
    frame = _frame()
    stats = _statistics(frame)
    scored = _frame(3000, seed=5)
    whole = FeatureCounts.of_frame(stats, scored)
    parts = FeatureCounts()
    for chunk in (scored.iloc[i:i + 750] for i in range(0, len(scored), 750)):
        parts.merge(FeatureCounts.of_frame(stats, chunk))
    assert parts.rows == whole.rows and all((parts.features[k] == whole.features[k]).all() for k in whole.features)
    assert {d.name: d.level for d in drift(stats, whole)} == {"x": "ok", "k": "ok", "city": "ok"}

    shifted = scored.copy()
    shifted["x"] = shifted["x"] + 2 * 2.0  # two training standard deviations
    shifted.loc[: len(shifted) // 2, "city"] = "zurich"  # a category training never saw
    report = {d.name: d for d in drift(stats, FeatureCounts.of_frame(stats, shifted))}
    assert report["x"].level == "alert" and report["x"].psi > 0.25
    assert report["city"].level == "alert" and any("unseen categories" in r for r in report["city"].reasons)
    assert report["city"].outside_share == pytest.approx((len(shifted) // 2 + 1) / len(shifted))
    assert report["k"].level == "ok"
    assert [d.name for d in drift(stats, FeatureCounts.of_frame(stats, shifted))][0] in ("x", "city")


def test_nulls_beyond_the_training_share_and_values_outside_the_range_are_flagged():
    frame = _frame()
    stats = _statistics(frame)
    scored = _frame(1000, seed=7)
    scored.loc[:300, "k"] = np.nan  # ~30% nulls where training had none
    scored.loc[:99, "x"] = 1e6  # far outside the training range
    report = {d.name: d for d in drift(stats, FeatureCounts.of_frame(stats, scored), Thresholds(psi_alert=10, psi_warn=10))}
    assert any(r.startswith("nulls") for r in report["k"].reasons) and report["k"].level == "alert"
    assert any("outside the training range" in r for r in report["x"].reasons)


# ---------------------------------------------------------------- live: the window and the monitor (no Ray)


def test_the_window_slides_by_whole_chunks_and_keeps_the_most_recent_rows():
    from rayline.monitoring.live import SlidingWindow

    stats = _statistics(_frame())
    window = SlidingWindow(max_rows=1000)
    chunks = [FeatureCounts.of_frame(stats, _frame(300, seed=s)) for s in range(6)]
    for chunk in chunks:
        window.add(chunk)
    # 6 x 300 rows: the oldest chunks go while the rest still hold 1,000 rows -> the last 4 (1,200)
    assert window.total.rows == 1200 and len(window.chunks) == 4
    expected = FeatureCounts()
    for chunk in chunks[2:]:
        expected.merge(chunk)
    assert all((window.total.features[k] == expected.features[k]).all() for k in expected.features)


def test_a_time_window_leaves_out_chunks_older_than_its_seconds():
    from rayline.monitoring.live import SlidingWindow

    stats = _statistics(_frame())
    window = SlidingWindow(max_rows=10_000, max_seconds=900)
    for minute, seed in ((0, 1), (10, 2), (20, 3)):
        window.add(FeatureCounts.of_frame(stats, _frame(100, seed=seed)), now=minute * 60.0)
    window.expire(now=20 * 60.0)  # the last 15 minutes: the chunk of minute 0 goes
    assert window.total.rows == 200 and [t for t, _ in window.chunks] == [600.0, 1200.0]
    window.expire(now=60 * 60.0)  # a quiet hour later: nothing is judged
    assert window.total.rows == 0 and not window.chunks
    assert all((c == 0).all() for c in window.total.features.values())


def _spec(**kw):
    from rayline.spec import MonitoringSpec

    return MonitoringSpec(window_rows=kw.pop("window_rows", 600), min_rows=kw.pop("min_rows", 200), **kw)


def _served(frame):
    """A fitted preprocessing (one_hot city, the numbers as they are), as a replica holds it."""
    from rayline.data.preprocess import LabelInfo, fit_preprocessing

    features = [FeatureInfo("x", "number"), FeatureInfo("k", "integer"), FeatureInfo("city", "string")]
    steps = DataSpec.model_validate({"source": {"format": "csv", "path": "u.csv"}, "label": "y",
                                     "preprocess": [{"impute": {"columns": ["x"]}},
                                                    {"one_hot": {"columns": ["city"]}}]}).preprocess
    return fit_preprocessing(frame, features, LabelInfo("y", "classification", [0, 1]), steps)


def test_the_monitor_counts_requests_off_the_request_path_and_judges_the_window():
    """Request rows go through the compiled preprocessing, which hands the monitor their raw columns
    (a copy: the steps then work in place); the thread's round counts them into the window."""
    from rayline.monitoring.live import LiveMonitor

    frame = _frame()
    stats = _statistics(frame)
    stats.predictions = {"labels": [0, 1], "counts": [500, 500]}
    fitted = _served(frame)
    monitor = LiveMonitor(stats, _spec(), "t", "1", ["x", "k", "city"], kv=False).attach(fitted.compiled)
    try:
        assert monitor.report()["status"] == "collecting"
        rows = _frame(400, seed=11)[["x", "k", "city"]].to_dict("records")
        outputs = np.tile([[0.2, 0.8], [0.7, 0.3]], (2, 1))  # half each class, as in training
        for i in range(0, 400, 4):
            encoded = fitted.encode_records(rows[i:i + 4])
            monitor.observe_outputs(outputs)
        assert encoded.shape == (4, 2 + 3)  # the steps still ran: x, k and city's 3 categories
        assert monitor.window.total.rows == 0  # nothing counted on the request path
        monitor.update()
        report = monitor.report()
        assert report["status"] == "ok" and report["window_rows"] == 400, report
        whole = FeatureCounts.of_frame(stats, pd.DataFrame(rows))
        assert all((monitor.window.total.features[k] == whole.features[k]).all() for k in whole.features)
        assert {f["feature"] for f in report["features"]} == {"x", "k", "city", "(prediction)"}
        # the window slides onto shifted traffic: x + 2 sd, a city never seen, every answer class 1
        shifted = _frame(800, seed=12)
        shifted["x"] += 4.0
        shifted.loc[:399, "city"] = "zurich"
        fitted.encode_records(shifted[["x", "k", "city"]].to_dict("records"))
        monitor.observe_outputs(np.tile([[0.1, 0.9]], (800, 1)))
        monitor.update()
        report = monitor.report()
        levels = {f["feature"]: f["level"] for f in report["features"]}
        assert report["status"] == "drifting" and levels == {"x": "alert", "city": "alert", "k": "ok",
                                                             "(prediction)": "alert"}, report
        city = next(f for f in report["features"] if f["feature"] == "city")
        assert city["unseen_share"] == pytest.approx(400 / 800, abs=0.01)
    finally:
        monitor.close()


def test_regression_answers_drift_against_the_test_splits_predicted_values():
    """A regression version's reference is a decile histogram of its test predictions (registration's
    metric partials, merged across blocks as KLL sketches); live answers count into those bins."""
    from rayline.evaluation.metrics import MetricPartials
    from rayline.monitoring.drift import prediction_bins
    from rayline.monitoring.live import LiveMonitor
    from rayline.monitoring.statistics import value_histogram

    rng = np.random.default_rng(5)
    predicted = rng.normal(150.0, 40.0, 3000)
    parts = [MetricPartials.of("regression", chunk, chunk + 1.0) for chunk in np.array_split(predicted, 3)]
    merged = parts[0].merge(parts[1]).merge(parts[2])
    edges, counts = value_histogram(merged.predicted_sketch())
    ranks = (predicted[:, None] < np.asarray(edges)).mean(axis=0)  # the edges sit at the deciles (KLL rank error)
    assert len(edges) == 9 and np.abs(ranks - np.arange(1, 10) / 10).max() < 0.01, ranks
    assert sum(counts) == pytest.approx(3000) and max(counts) - min(counts) < 60
    frame = _frame()
    stats = _statistics(frame)
    stats.predictions = {"edges": edges, "counts": counts}
    ids, bins = prediction_bins(stats, np.array([[0.0], [(edges[4] + edges[5]) / 2], [1e6], [np.nan]]))
    assert bins == 10 and ids.tolist() == [0, 5, 9]  # a NaN answer is not counted
    fitted = _served(frame)
    monitor = LiveMonitor(stats, _spec(), "t", "1", ["x", "k", "city"], kv=False).attach(fitted.compiled)
    try:
        rows = _frame(400, seed=11)[["x", "k", "city"]].to_dict("records")
        fitted.encode_records(rows)
        monitor.observe_outputs(rng.normal(150.0, 40.0, (400, 1)))
        monitor.update()
        levels = {f["feature"]: f["level"] for f in monitor.report()["features"]}
        assert levels["(prediction)"] == "ok", monitor.report()
        fitted.encode_records(rows)
        monitor.observe_outputs(rng.normal(230.0, 40.0, (400, 1)))  # answers 2 sd higher
        monitor.update()
        report = monitor.report()
        prediction = next(f for f in report["features"] if f["feature"] == "(prediction)")
        assert prediction["level"] == "alert" and report["status"] == "drifting", report
    finally:
        monitor.close()


def test_a_v2_matrix_is_counted_like_rows():
    from rayline.data.preprocess import LabelInfo, fit_preprocessing
    from rayline.monitoring.live import LiveMonitor

    frame = _frame().drop(columns=["city"]).dropna()
    features = [FeatureInfo("x", "number"), FeatureInfo("k", "integer")]
    fitted = fit_preprocessing(frame, features, LabelInfo("y", "classification", [0, 1]), [])
    stats = _statistics(frame.assign(city="a"))
    monitor = LiveMonitor(stats, _spec(min_rows=1), "t", "1", ["x", "k"], kv=False).attach(fitted.compiled)
    try:
        rows = _frame(300, seed=4)[["x", "k"]].dropna()
        fitted.encode_matrix(rows.to_numpy(dtype=np.float64))
        monitor.update()
        by_rows = FeatureCounts.of_frame(stats, rows)
        assert monitor.window.total.rows == len(rows)
        assert (monitor.window.total.features["x"] == by_rows.features["x"]).all()
        assert (monitor.window.total.features["k"] == by_rows.features["k"]).all()
    finally:
        monitor.close()


@pytest.mark.parametrize("raw, message", [
    ({"psi_warn": 0.3}, "serve.monitoring.psi_warn: must be below psi_alert (got 0.3 >= 0.25; allowed: < 0.25)"),
    ({"min_rows": 20000}, "serve.monitoring.min_rows: more than the window holds (got 20000 > 10000"),
    ({"window_rows": 10}, "serve.monitoring.window_rows: Input should be greater than or equal to 100"),
])
def test_the_monitoring_spec_names_bad_settings(raw, message):
    from rayline.errors import SpecError
    from rayline.spec.loading import parse_spec

    spec = {"name": "t", "data": {"source": {"format": "sklearn", "name": "iris"}, "label": "target"},
            "model": {"framework": "torch", "kind": "mlp"}, "serve": {"monitoring": raw}}
    with pytest.raises(SpecError) as caught:
        parse_spec(spec)
    assert message in str(caught.value)
    assert parse_spec({**spec, "serve": {"monitoring": False}}).serve.monitoring.enabled is False


def test_serve_status_prints_one_line_per_monitored_version():
    from rayline.cli.serve import drift_line
    from rayline.monitoring.live import version_report

    stats = _statistics(_frame())
    shifted = _frame(1000, seed=3)
    shifted["x"] += 4.0
    report = version_report(stats, FeatureCounts.of_frame(stats, shifted), _spec(), "t", "2")
    line = drift_line("t", "2", report)
    assert line.startswith("t v2 monitoring: drifting (1,000 rows in the window); drifted: x PSI ")
    assert "[alert]" in line and "out of range" in line
    assert drift_line("t", "2", version_report(stats, FeatureCounts(), _spec(), "t", "2")) == \
        "t v2 monitoring: collecting (0 rows in the window, judged from 200)"
