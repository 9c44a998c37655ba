"""Preprocessing steps: the registry, step-order rules at validate, the compiled numpy transform."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from rayline.data.compiled import AffineOp
from rayline.data.preprocess import FeatureInfo, FittedPreprocessing, LabelInfo, fit_preprocessing
from rayline.data.steps import STEP_SPEC_MODELS, STEPS, Step, step_from_state
from rayline.errors import DataError
from rayline.spec import PREPROCESS_KINDS, DataSpec
from tests.cli import rayline as rayline_in_process

ROOT = Path(__file__).resolve().parents[2]
LABEL = LabelInfo("churn", "classification", ["no", "yes"])
FEATURES = [FeatureInfo("age", "number"), FeatureInfo("plan", "string"), FeatureInfo("fee", "integer"),
            FeatureInfo("seats", "integer"), FeatureInfo("region", "string")]
TRAIN = pd.DataFrame({
    "age": [20.0, 40.0, np.nan, 60.0, 35.0],
    "plan": ["basic", "pro", "basic", None, "pro"],
    "fee": [10, 20, 30, 40, 25],
    "seats": [1, 2, 2, 3, 1],
    "region": ["eu", "us", None, "eu", "eu"],
})
# Every step kind, nulls (imputed and not), categories unseen in training, an integer one-hot column.
EVERY_STEP = [
    {"impute": {"columns": ["age"], "strategy": "median"}},
    {"impute": {"columns": ["plan"], "strategy": "most_frequent"}},
    {"impute": {"columns": ["region"], "strategy": "constant", "value": "eu"}},
    {"one_hot": {"columns": ["plan", "seats"], "handle_unknown": "ignore"}},
    {"one_hot": {"columns": ["region"], "handle_unknown": "error"}},
    {"standard_scale": {"columns": ["age"]}},
    {"min_max_scale": {"columns": "numeric"}},
]
ROWS = [
    {"age": 1000.0, "plan": "enterprise", "fee": 500, "seats": 9, "region": "us"},  # unseen plan and seats
    {"age": None, "plan": None, "fee": 0, "seats": 2.0, "region": None},  # nulls; 2.0 is category 2
    {"plan": "pro", "fee": 15, "seats": 1, "region": "eu"},  # an imputed feature omitted
]


def _steps(*steps):
    return DataSpec.model_validate({"source": {"format": "sklearn", "name": "iris"}, "label": "x", "preprocess": list(steps)}).preprocess


def _fit(*steps, train=TRAIN):
    return fit_preprocessing(train, FEATURES, LABEL, _steps(*steps))


def test_every_registered_step_is_a_spec_kind_with_its_own_model():
    assert PREPROCESS_KINDS == tuple(STEPS) == ("impute", "one_hot", "standard_scale", "min_max_scale", "image", "text")
    for kind, cls in STEPS.items():
        assert issubclass(cls, Step) and cls.kind == kind
        assert STEP_SPEC_MODELS[kind].__name__.endswith("Step") and kind in STEP_SPEC_MODELS[kind].model_fields


def test_each_fitted_step_round_trips_through_its_json_state():
    fitted = _fit(*EVERY_STEP)
    assert [s.kind for s in fitted.steps] == ["impute", "impute", "impute", "one_hot", "one_hot", "standard_scale", "min_max_scale"]
    for step in fitted.steps:
        again = step_from_state(json.loads(json.dumps(step.to_dict())))
        assert type(again) is type(step) and again == step


def test_records_and_frames_give_identical_matrices_for_every_step():
    fitted = _fit(*EVERY_STEP[:4], {"one_hot": {"columns": ["region"]}}, *EVERY_STEP[5:])  # handle_unknown: error is tested below
    frame = pd.DataFrame(ROWS)
    from_frame = fitted.transform(frame)
    from_json = fitted.encode_records(json.loads(json.dumps(ROWS)))
    assert from_json.dtype == np.float32 and np.array_equal(from_frame, from_json)
    cols = fitted.output_columns
    assert cols == ["age", "plan=basic", "plan=pro", "fee", "seats=1", "seats=2", "seats=3", "region=eu", "region=us"]
    row = dict(zip(cols, from_json[0]))
    assert row["plan=basic"] == row["plan=pro"] == 0 and row["seats=1"] == row["seats=2"] == row["seats=3"] == 0  # unseen: all zero
    assert row["fee"] == pytest.approx((500 - 10) / 30)  # min-max from train: outside [0, 1] for values outside its range
    second = dict(zip(cols, from_json[1]))
    assert second["plan=basic"] == 1  # null plan imputed with the most frequent value
    assert second["seats=2"] == 1 and second["region=eu"] == 1  # 2.0 is category 2; null region imputed 'eu'
    median = float(np.nanmedian(TRAIN["age"]))
    mean, std = fitted.steps[5].stats["age"]
    assert mean == pytest.approx(np.mean([20, 40, median, 60, 35]))  # scaled after imputing: stats of imputed values
    # the later min_max over `numeric` sees age after standard scaling, and both fuse into one affine op
    assert sum(isinstance(op, AffineOp) for op in fitted.compiled.ops) == 1


@pytest.mark.parametrize("copies", [1, 30])  # 3 rows: a Python lookup per value; 90: pandas' vectorised one
def test_frames_as_readers_give_them_equal_records_on_both_lookup_paths(copies):
    """Arrow-backed `str` columns, integer categories read as floats with gaps, a shifted index:
    the frame path (training, batch scoring) gives the request path's matrix and labels."""
    fitted = _fit(*EVERY_STEP[:4], {"one_hot": {"columns": ["region"]}}, *EVERY_STEP[5:])
    rows = ROWS * copies
    frame = pd.DataFrame(rows, index=range(1000, 1000 + len(rows)))
    frame["plan"] = frame["plan"].astype("str")
    frame["region"] = frame["region"].astype("str")
    frame["seats"] = frame["seats"].astype("float64")
    assert np.array_equal(fitted.transform(frame), fitted.encode_records(json.loads(json.dumps(rows))))
    labels = pd.Series(["yes", "no", "yes"] * copies, index=frame.index, dtype="str")
    assert fitted.encode_labels(labels).tolist() == [1, 0, 1] * copies
    with pytest.raises(DataError, match=r"data.label: value 'maybe' is not a known class"):
        fitted.encode_labels(pd.Series(["yes"] * (len(rows) - 1) + ["maybe"], index=frame.index))
    strict = _fit(*EVERY_STEP)
    with pytest.raises(DataError, match=r"region: category not seen in training \(got 'asia'; allowed: eu, us\)$"):
        strict.transform(frame.assign(region=["eu"] * (len(rows) - 1) + ["asia"]))


def test_fused_affine_steps_equal_applying_them_one_after_another():
    fitted = _fit({"standard_scale": {"columns": ["age", "fee"]}}, {"min_max_scale": {"columns": ["fee"]}},
                  {"impute": {"columns": ["age"]}}, {"one_hot": {"columns": ["plan", "seats", "region"]}},
                  train=TRAIN.fillna({"age": 30.0}))
    (m_age, s_age), (m_fee, s_fee) = fitted.steps[0].stats["age"], fitted.steps[0].stats["fee"]
    low, high = fitted.steps[1].stats["fee"]
    assert low == pytest.approx((10 - m_fee) / s_fee) and high == pytest.approx((40 - m_fee) / s_fee)
    out = fitted.encode_records([{"age": 50.0, "plan": "pro", "fee": 22, "seats": 1, "region": "eu"}])
    by_hand = (((22 - m_fee) / s_fee) - low) / (high - low)
    assert out[0, fitted.output_columns.index("fee")] == pytest.approx(by_hand, rel=1e-6)
    assert out[0, 0] == pytest.approx((50 - m_age) / s_age, rel=1e-6)


def test_unseen_category_under_handle_unknown_error_names_row_feature_and_allowed_values():
    fitted = _fit(*EVERY_STEP)
    with pytest.raises(DataError, match=r"^instances\[1\]\.region: category not seen in training \(got 'asia'; allowed: eu, us\)$"):
        fitted.encode_records([ROWS[2], {**ROWS[2], "region": "asia"}])


@pytest.mark.parametrize("value, steps", [
    (1e39, []),  # beyond float32 before any step
    (1e37, [{"standard_scale": {"columns": ["age"]}}]),  # within float32, beyond it once scaled by 1/std
])
def test_values_overflowing_float32_name_the_feature(value, steps):
    fitted = fit_preprocessing(TRAIN[["age"]].fillna(0.0) * 1e-3, [FeatureInfo("age", "number")], LABEL, _steps(*steps))
    with pytest.raises(DataError, match=r"^instances\[0\]\.age: value overflows the model's float32 input after preprocessing \(got 1e\+3[79]"):
        fitted.encode_records([{"age": value}])
    assert np.isfinite(fitted.encode_records([{"age": 1.0}])).all()


def test_missing_value_without_impute_names_row_and_feature():
    fitted = _fit({"one_hot": {"columns": ["plan", "region"]}})
    with pytest.raises(DataError, match=r"^instances\[0\]\.age: missing, and no impute step fills this feature"):
        fitted.encode_records([{"age": None, "plan": "pro", "fee": 1, "seats": 1, "region": "eu"}])


def test_compiled_transform_is_rebuilt_after_pickling_and_loading(tmp_path):
    import pickle

    fitted = _fit(*EVERY_STEP[:4], {"one_hot": {"columns": ["region"]}}, *EVERY_STEP[5:])
    expected = fitted.encode_records(ROWS)
    fitted.save(tmp_path / "p.json")
    for again in (pickle.loads(pickle.dumps(fitted)), FittedPreprocessing.load(tmp_path / "p.json")):
        assert np.array_equal(again.encode_records(ROWS), expected)


# ---------------------------------------------------------------- step-order rules at validate

CSV = "age,plan,fee,region\n30,basic,10,eu\n41,pro,20,\n,basic,15,us\n"


def _spec_file(tmp_path, steps, csv=CSV):
    (tmp_path / "data.csv").write_text(csv)
    raw = {"name": "churn", "data": {"source": {"format": "csv", "path": "data.csv"}, "label": "fee", "preprocess": steps},
           "task": "regression", "model": {"framework": "torch", "kind": "mlp"}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


ORDER_MISTAKES = [
    ([{"one_hot": {"columns": ["plan", "region"]}}, {"impute": {"columns": ["plan"], "strategy": "most_frequent"}}, {"impute": {"columns": ["age"]}}],
     "data.preprocess[1].impute.columns[0]: column 'plan' was one-hot encoded by data.preprocess[0], so no later step can use it "
     "(got impute after one_hot; allowed: impute before one_hot, scaling only on numeric columns)"),
    ([{"impute": {"columns": ["age"]}}, {"one_hot": {"columns": ["plan", "region"]}}, {"one_hot": {"columns": ["region"]}}],
     "data.preprocess[2].one_hot.columns[0]: column 'region' was one-hot encoded by data.preprocess[1], so no later step can use it"),
    ([{"impute": {"columns": ["plan"], "strategy": "constant", "value": 3}}, {"one_hot": {"columns": ["plan", "region"]}}, {"impute": {"columns": ["age"]}}],
     "data.preprocess[0].impute.columns[0]: constant value for string column 'plan' must be a string (got 3; allowed: a string)"),
    ([{"impute": {"columns": ["age"], "strategy": "constant", "value": "unknown"}}, {"one_hot": {"columns": ["plan", "region"]}}],
     "data.preprocess[0].impute.columns[0]: constant value for integer column 'age' must be a number (got 'unknown'; allowed: a number)"),
    ([{"impute": {"columns": ["age"]}}, {"one_hot": {"columns": ["region"]}}, {"standard_scale": {"columns": ["age", "plan"]}}],
     "data.preprocess[2].standard_scale.columns[1]: needs a numeric column (got 'plan', a string column; allowed: age)"),
    ([{"impute": {"columns": ["age"]}}, {"min_max_scale": {"columns": ["age", "region"]}}, {"one_hot": {"columns": ["plan", "region"]}}],
     "data.preprocess[1].min_max_scale.columns[1]: needs a numeric column, and 'region' is one-hot encoded by data.preprocess[2]"),
    ([{"impute": {"columns": ["age"]}}, {"one_hot": {"columns": ["plan", "plan"]}}],
     "data.preprocess[1].one_hot.columns[1]: column named twice in one step (got 'plan'; allowed: each column once)"),
]


@pytest.mark.parametrize("steps, expected", ORDER_MISTAKES, ids=range(len(ORDER_MISTAKES)))
def test_step_order_mistakes_fail_validate_naming_the_step(tmp_path, steps, expected):
    path = _spec_file(tmp_path, steps)
    proc = rayline_in_process("validate", path, cwd=ROOT)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert expected in " ".join(proc.stderr.split()), proc.stderr
    assert "Traceback" not in proc.stderr


def test_handle_unknown_error_on_a_column_without_values_fails_validate(tmp_path):
    from rayline.errors import SpecError
    from rayline.spec import load_spec

    csv = "age,plan,fee,region\n30,basic,10,\n41,pro,20,\n35,basic,15,\n"
    path = _spec_file(tmp_path, [{"one_hot": {"columns": ["plan", "region"], "handle_unknown": "error"}}], csv=csv)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert any("data.preprocess[0].one_hot.columns[1]: column 'region' has no values in the data, so with handle_unknown: error"
               in p for p in info.value.problems), info.value.problems


def test_fit_reports_the_same_step_order_mistakes_before_touching_data():
    with pytest.raises(DataError, match=r"data.preprocess\[1\].standard_scale.columns\[0\]: column 'plan' was one-hot encoded"):
        _fit({"one_hot": {"columns": ["plan", "region"]}}, {"standard_scale": {"columns": ["plan"]}})


def test_a_correct_order_validates(tmp_path):
    path = _spec_file(tmp_path, [{"impute": {"columns": ["region"], "strategy": "constant", "value": "eu"}},
                                 {"one_hot": {"columns": ["plan", "region"], "handle_unknown": "error"}},
                                 {"impute": {"columns": ["age"]}}, {"standard_scale": {"columns": "numeric"}}])
    proc = rayline_in_process("validate", path, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr


def test_array_rows_in_feature_order_equal_object_rows():
    fitted = _fit(*EVERY_STEP[:4], {"one_hot": {"columns": ["region"]}}, *EVERY_STEP[5:])
    names = [f.name for f in FEATURES]
    arrays = [[row.get(n) for n in names] for row in ROWS]
    assert np.array_equal(fitted.encode_records(arrays), fitted.encode_records(ROWS))
    numeric = fit_preprocessing(TRAIN[["fee", "seats"]], [FEATURES[2], FEATURES[3]], LABEL, _steps({"standard_scale": {"columns": "numeric"}}))
    assert np.array_equal(numeric.encode_records([[1, 2], [3, 4]]), numeric.encode_records([{"fee": 1, "seats": 2}, {"fee": 3, "seats": 4}]))
    with pytest.raises(DataError, match=r"^instances\[1\]: expected 2 values in feature order \(got 3\)$"):
        numeric.encode_records([[1, 2], [1, 2, 3]])
    with pytest.raises(DataError, match=r"^instances\[0\]\.seats: value overflows .* \(got 1e\+39"):
        numeric.encode_records([[1, 1e39]])


def test_a_request_matrix_encodes_as_its_rows_do():
    """The V2 route hands numbers-only models one float64 matrix (CompiledTransform.transform_matrix):
    the same model input as the same values sent as rows, and the same error for an overflow."""
    numeric = [FeatureInfo("age", "number", nullable=True), FeatureInfo("fee", "integer"), FeatureInfo("seats", "integer")]
    train = TRAIN[["age", "fee", "seats"]].assign(age=TRAIN["age"] * 1e-3)  # a small spread: 1/std is large
    fitted = fit_preprocessing(train, numeric, LABEL, _steps(
        {"impute": {"columns": ["age"], "strategy": "median"}}, {"standard_scale": {"columns": ["age"]}},
        {"min_max_scale": {"columns": "numeric"}}))
    assert fitted.compiled.takes_matrix and not _fit(*EVERY_STEP).compiled.takes_matrix
    rows = [[31.0, 10, 2], [70.5, 45, 1], [0.0, -3, 9]]
    matrix = np.array(rows, dtype=np.float64)
    assert np.array_equal(fitted.encode_matrix(matrix.copy()), fitted.encode_records(rows))
    big = [[1e38, 1, 1]]  # within float32, beyond it once scaled by 1/std
    with pytest.raises(DataError) as by_rows:
        fitted.encode_records(big)
    with pytest.raises(DataError) as by_matrix:
        fitted.encode_matrix(np.array(big), lambda row, name: big[row][["age", "fee", "seats"].index(name)])
    assert str(by_matrix.value) == str(by_rows.value) and "instances[0].age" in str(by_rows.value)
    with pytest.raises(ValueError, match="matrix of a numbers-only model"):
        _fit(*EVERY_STEP).encode_matrix(np.zeros((1, 5)))
