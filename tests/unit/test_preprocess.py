"""Preprocessing fitted on train only, applied identically to any rows (pure pandas, no Ray)."""

import numpy as np
import pandas as pd
import pytest

from rayline.data.preprocess import FeatureInfo, FittedPreprocessing, LabelInfo, fit_preprocessing
from rayline.errors import DataError
from rayline.spec import DataSpec

FEATURES = [FeatureInfo("age", "number"), FeatureInfo("plan", "string"), FeatureInfo("fee", "integer")]
LABEL = LabelInfo("churn", "classification", ["no", "yes"])


def _steps(*steps):
    return DataSpec.model_validate({"source": {"format": "sklearn", "name": "iris"}, "label": "x", "preprocess": list(steps)}).preprocess


def _fit(train, *steps):
    return fit_preprocessing(train, FEATURES, LABEL, _steps(*steps))


TRAIN = pd.DataFrame({"age": [20.0, 40.0, np.nan, 60.0], "plan": ["basic", "pro", "basic", None], "fee": [10, 20, 30, 40]})
VALID = pd.DataFrame({"age": [1000.0, np.nan], "plan": ["enterprise", "pro"], "fee": [500, 0]})


def test_statistics_come_from_train_only_not_valid():
    fitted = _fit(TRAIN, {"impute": {"columns": ["age"], "strategy": "mean"}},
                  {"one_hot": {"columns": ["plan"]}}, {"standard_scale": {"columns": ["age"]}}, {"min_max_scale": {"columns": ["fee"]}})
    impute, one_hot, scale, min_max = fitted.steps
    assert impute.fill == {"age": 40.0}
    assert one_hot.categories == {"plan": ["basic", "pro"]}
    mean, std = scale.stats["age"]
    assert mean == pytest.approx(40.0) and std == pytest.approx(np.std([20, 40, 40, 60]))
    assert min_max.stats["fee"] == [10.0, 40.0]
    # Transforming valid rows uses train statistics: values outside train's range stay outside.
    out = fitted.transform(VALID)
    assert fitted.output_columns == ["age", "plan=basic", "plan=pro", "fee"]
    assert out[0, 0] == pytest.approx((1000 - 40) / std) and out[1, 0] == pytest.approx(0.0)
    assert out[0, 1:3].tolist() == [0.0, 0.0]  # unseen 'enterprise' ignored
    assert out[0, 3] == pytest.approx((500 - 10) / 30)
    assert out.dtype == np.float32


def test_fitting_on_other_rows_gives_other_state():
    a = _fit(TRAIN, {"one_hot": {"columns": ["plan"]}}, {"standard_scale": {"columns": "numeric"}})
    b = _fit(pd.concat([TRAIN, VALID]), {"one_hot": {"columns": ["plan"]}}, {"standard_scale": {"columns": "numeric"}})
    assert a.steps != b.steps


@pytest.mark.parametrize("strategy, value, expected", [("median", None, 40.0), ("constant", -1, -1), ("most_frequent", None, 20.0)])
def test_impute_strategies(strategy, value, expected):
    params = {"columns": ["age"], "strategy": strategy, **({"value": value} if value is not None else {})}
    fitted = _fit(TRAIN, {"impute": params}, {"one_hot": {"columns": ["plan"]}})
    assert fitted.steps[0].fill["age"] == expected
    assert fitted.features[0].nullable is True and fitted.features[2].nullable is False


def test_unknown_category_with_handle_unknown_error_raises():
    fitted = _fit(TRAIN, {"impute": {"columns": ["age"]}}, {"one_hot": {"columns": ["plan"], "handle_unknown": "error"}})
    with pytest.raises(DataError, match="plan: category not seen in training \\(got 'enterprise'; allowed: basic, pro\\)"):
        fitted.transform(VALID)


def test_null_in_column_without_impute_is_named():
    fitted = _fit(TRAIN, {"one_hot": {"columns": ["plan"]}})
    with pytest.raises(DataError, match=r"columns \['age'\] hold nulls that no impute step fills"):
        fitted.transform(TRAIN)


def test_string_feature_without_one_hot_is_rejected():
    with pytest.raises(DataError, match=r"string columns \['plan'\] need encoding"):
        _fit(TRAIN, {"impute": {"columns": ["age"]}})


def test_scaling_a_string_column_is_rejected():
    with pytest.raises(DataError, match=r"standard_scale.columns\[0\]: needs a numeric column \(got 'plan', a string column"):
        _fit(TRAIN, {"standard_scale": {"columns": ["plan"]}})


def test_round_trip_through_json_gives_identical_output(tmp_path):
    fitted = _fit(TRAIN, {"impute": {"columns": ["age"]}}, {"one_hot": {"columns": ["plan"]}}, {"standard_scale": {"columns": "numeric"}})
    fitted.save(tmp_path / "p.json")
    loaded = FittedPreprocessing.load(tmp_path / "p.json")
    assert np.array_equal(fitted.transform(VALID), loaded.transform(VALID))


def test_label_encoding_round_trip_keeps_original_labels():
    fitted = _fit(TRAIN, {"impute": {"columns": ["age"]}}, {"one_hot": {"columns": ["plan"]}})
    ids = fitted.encode_labels(pd.Series(["yes", "no", "yes"]))
    assert ids.tolist() == [1, 0, 1] and fitted.decode(ids) == ["yes", "no", "yes"]
    with pytest.raises(DataError, match="'maybe' is not a known class"):
        fitted.encode_labels(pd.Series(["maybe"]))
