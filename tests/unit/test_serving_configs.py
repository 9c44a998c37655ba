"""serving/*.yaml: one Ray Serve config per reference pipeline, equal to what `rayline serve export`
writes for version 1 of it (rayline.serve.export.config_for), valid for Ray's own schema, and each
application builds from its args as Serve's controller will build it."""

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = {"digits": "digits-torch", "diabetes": "diabetes-torch", "breast-cancer": "breast-cancer-xgboost",
             "wine": "wine-tensorflow", "digits-images": "digits-images-cnn", "tickets": "tickets-text"}


def test_every_reference_pipeline_has_a_serving_config_and_nothing_else_is_there():
    assert sorted(p.stem for p in (ROOT / "serving").glob("*.yaml")) == sorted(REFERENCE)
    assert sorted(p.stem for p in (ROOT / "pipelines").glob("*.yaml")) == sorted(REFERENCE.values())


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_serving_config_is_the_export_of_its_pipeline(name):
    from ray.serve.schema import ServeDeploySchema

    from rayline.serve.app import build_app
    from rayline.serve.export import OIP_ROUTER_IMPORT_PATH, ROUTER_IMPORT_PATH, build_oip_router_app, config_for
    from rayline.serve.oip import build_app as build_oip
    from rayline.spec import load_spec

    text = (ROOT / "serving" / f"{name}.yaml").read_text()
    spec = load_spec(ROOT / "pipelines" / f"{REFERENCE[name]}.yaml", check_data=False)
    assert yaml.safe_load(text) == config_for(spec, "1", workspace=".rayline")
    assert f"pipelines/{REFERENCE[name]}.yaml" in text and f"serve deploy serving/{name}.yaml" in text

    config = ServeDeploySchema.model_validate(yaml.safe_load(text))
    apps = {a.name: a for a in config.applications}
    assert set(apps) == {f"{spec.name}-v1", spec.name, f"{spec.name}-oip", "rayline-v2"}
    own_v2 = apps[f"{spec.name}-oip"]  # serve.oip: the model's own V2 replicas, one hop as /predict
    assert own_v2.route_prefix == f"/v2/models/{spec.name}" and own_v2.import_path == OIP_ROUTER_IMPORT_PATH
    assert type(build_oip_router_app(own_v2.args)).__name__ == "Application"
    assert apps[spec.name].route_prefix == spec.route and apps[spec.name].import_path == ROUTER_IMPORT_PATH
    assert apps[f"{spec.name}-v1"].route_prefix == f"{spec.route}/v/1"
    assert type(build_app(apps[f"{spec.name}-v1"].args)).__name__ == "Application"  # a number: no registry lookup
    assert type(build_oip(None)).__name__ == "Application"


def test_without_serve_oip_the_config_has_no_v2_application_of_the_models_own():
    from rayline.serve.export import config_for
    from rayline.spec import apply_overrides, load_spec

    spec = apply_overrides(load_spec(ROOT / "pipelines" / "digits-torch.yaml", check_data=False), {"serve.oip": False})
    assert [a["name"] for a in config_for(spec, "3", workspace=".rayline")["applications"]] == ["digits-v3", "digits",
                                                                                              "rayline-v2"]


def test_the_v2_builder_names_a_bad_arg_and_what_is_allowed():
    from rayline.errors import ServeError
    from rayline.serve.export import build_oip_router_app

    with pytest.raises(ServeError, match=r"build_oip_router_app args: unknown keys \['champion'\] \(allowed: .*framework"):
        build_oip_router_app({"name": "digits", "champion": "1"})
    with pytest.raises(ServeError, match=r"build_oip_router_app args: missing \['name'\]"):
        build_oip_router_app({})
    with pytest.raises(ServeError, match=r"build_oip_router_app args: replicas.min"):
        build_oip_router_app({"name": "digits", "replicas": {"min": -1}})
