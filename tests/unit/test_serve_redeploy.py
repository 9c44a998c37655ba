"""`rayline serve deploy --set` (rayline/serve/settings.py) and what a redeploy compares and records
(rayline/serve/applications.py); the in-place update itself, under load on a real Serve:
tests/integration/test_versions.py."""

import pytest

from rayline.errors import SpecError
from rayline.serve.applications import settings_changes, settings_record
from rayline.serve.settings import with_serve_overrides
from rayline.spec import ServeSpec


def test_overrides_set_serve_keys_and_validate_them():
    spec = with_serve_overrides(ServeSpec(route="/churn"), {"serve.replicas.max": 4, "serve.max_ongoing_requests": 8})
    assert spec.replicas.max == 4 and spec.max_ongoing_requests == 8 and spec.route == "/churn"


@pytest.mark.parametrize("overrides, problem", [
    ({"train.epochs": 2}, "--set train.epochs: rayline serve deploy changes serve settings only (got 'train.epochs'"),
    ({"serve": 1}, "--set serve: rayline serve deploy changes serve settings only"),
    ({"serve.route": "/x"}, "--set serve.route: the model's route stays"),
    ({"serve.canary.percent": 10}, "--set serve.canary.percent: use --canary PERCENT"),
    ({"serve.replicas.max": 0}, "serve.replicas.max: Input should be greater than or equal to 1 (got 0)"),
    ({"serve.replicaz": 2}, "serve.replicaz: unknown key"),
])
def test_bad_overrides_name_the_option(overrides, problem):
    with pytest.raises(SpecError) as info:
        with_serve_overrides(ServeSpec(), overrides)
    assert any(p.startswith(problem) for p in info.value.problems), info.value.problems


def test_changes_are_listed_dotted_and_only_when_something_differs():
    before = ServeSpec().model_dump()
    after = with_serve_overrides(ServeSpec(), {"serve.replicas.max": 3, "serve.max_body_bytes": 2048}).model_dump()
    assert settings_changes(before, after) == ["max_body_bytes: 10485760 -> 2048", "replicas.max: 1 -> 3"]
    assert settings_changes(before, before) == []
    assert settings_changes(None, after) == []  # a version recorded before settings were: nothing to compare
    # The test-only delay is not a setting users change.
    assert settings_changes({**before, "debug_infer_delay_s": 0.5}, before) == []


def test_a_deployment_records_the_settings_that_differ_from_the_defaults():
    settings = with_serve_overrides(ServeSpec(), {"serve.replicas.max": 3}).model_dump(exclude={"route", "canary"})
    assert settings_record(settings) == {"replicas.max": 3}
    assert settings_record(ServeSpec().model_dump(exclude={"route", "canary"})) == {}
