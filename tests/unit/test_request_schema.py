"""The request model generated from the training feature schema."""

import json

import pytest
from pydantic import ValidationError

from rayline.data.preprocess import FeatureInfo, FittedPreprocessing, LabelInfo
from rayline.serve.schema import located, build_request_model

PRE = FittedPreprocessing(
    features=[
        FeatureInfo("age", "number", nullable=True),
        FeatureInfo("fee", "integer"),
        FeatureInfo("plan", "string", categories=["basic", "pro"], unknown="error"),
        FeatureInfo("region", "string", categories=["eu", "us"], unknown="ignore"),
        FeatureInfo("active", "boolean"),
    ],
    label=LabelInfo("churn", "classification", ["no", "yes"]),
)
NAMES = [f.name for f in PRE.features]
GOOD = {"age": 30.5, "fee": 10, "plan": "pro", "region": "asia", "active": True}
Request = build_request_model(PRE, max_instances=3)


def _errors(instances, **extra):
    with pytest.raises(ValidationError) as info:
        Request.model_validate({"instances": instances, **extra})
    return [(located(tuple(e["loc"]), NAMES), e["type"]) for e in info.value.errors()]


def test_valid_request_keeps_feature_names():
    body = Request.model_validate({"instances": [GOOD, {**GOOD, "age": None}], "probabilities": True})
    assert body.instances[0].model_dump(by_alias=True) == GOOD
    assert body.probabilities is True


def test_imputed_feature_may_be_omitted():
    row = {k: v for k, v in GOOD.items() if k != "age"}
    assert Request.model_validate({"instances": [row]}).instances[0].model_dump(by_alias=True)["age"] is None


def test_empty_too_many_and_unknown_top_level_keys():
    assert _errors([]) == [(("instances",), "too_short")]
    assert _errors([GOOD] * 4) == [(("instances",), "too_long")]
    assert (("extra",), "extra_forbidden") in _errors([GOOD], extra=1)


# The raw-bytes validator the endpoint runs must agree with the documented model.
from rayline.serve.schema import FLOAT32_MAX, build_request_adapter  # noqa: E402

Adapter = build_request_adapter(PRE, max_instances=3)


def _adapter_errors(instances, **extra):
    with pytest.raises(ValidationError) as info:
        Adapter.validate_json(json.dumps({"instances": instances, **extra}))
    return [(located(tuple(e["loc"]), NAMES), e["type"]) for e in info.value.errors()]


@pytest.mark.parametrize("row, loc, kind", [
    ({k: v for k, v in GOOD.items() if k != "fee"}, ("instances", 0, "fee"), "missing"),
    ({**GOOD, "colour": "red"}, ("instances", 0, "colour"), "extra_forbidden"),
    ({**GOOD, "fee": "10"}, ("instances", 0, "fee"), "float_type"),
    ({**GOOD, "fee": True}, ("instances", 0, "fee"), "float_type"),
    ({**GOOD, "fee": None}, ("instances", 0, "fee"), "float_type"),
    ({**GOOD, "plan": "enterprise"}, ("instances", 0, "plan"), "literal_error"),
    ({**GOOD, "region": 3}, ("instances", 0, "region"), "string_type"),
    ({**GOOD, "active": "yes"}, ("instances", 0, "active"), "bool_type"),
    ({**GOOD, "fee": 1e39}, ("instances", 0, "fee"), "less_than_equal"),
    ({**GOOD, "age": -1e39}, ("instances", 0, "age"), "greater_than_equal"),
])
def test_adapter_and_model_reject_the_same_rows(row, loc, kind):
    assert (loc, kind) in _adapter_errors([row])
    assert (loc, kind) in _errors([row])


def test_adapter_gives_plain_dicts_and_limits():
    body = Adapter.validate_json(json.dumps({"instances": [GOOD], "probabilities": True}))
    assert body == {"instances": [GOOD], "probabilities": True}
    assert Adapter.validate_json(json.dumps({"instances": [{**GOOD, "fee": FLOAT32_MAX}]}))["instances"][0]["fee"] == FLOAT32_MAX
    assert _adapter_errors([]) == [(("instances",), "too_short")]
    assert _adapter_errors([GOOD] * 4) == [(("instances",), "too_long")]
    assert (("extra",), "extra_forbidden") in _adapter_errors([GOOD], extra=1)


def test_float32_bounds_are_in_the_documented_schema():
    props = Request.model_json_schema()["$defs"]["Instance"]["properties"]
    assert props["fee"]["maximum"] == FLOAT32_MAX and props["fee"]["minimum"] == -FLOAT32_MAX


def test_array_rows_validate_by_position_and_errors_name_the_feature():
    import json

    adapter = build_request_adapter(PRE, max_instances=3)
    row = [GOOD[name] for name in NAMES]
    assert list(adapter.validate_json(json.dumps({"instances": [row]}))["instances"][0]) == row
    bad = [row[0], "10", *row[2:]]
    with pytest.raises(ValidationError) as info:
        adapter.validate_json(json.dumps({"instances": [row, bad]}))
    assert [(located(tuple(e["loc"]), NAMES), e["type"]) for e in info.value.errors()] == [(("instances", 1, "fee"), "float_type")]
    with pytest.raises(ValidationError) as info:
        adapter.validate_json(json.dumps({"instances": [row[:-1]]}))
    assert [(located(tuple(e["loc"]), NAMES), e["type"]) for e in info.value.errors()] == [(("instances", 0, "active"), "missing")]
