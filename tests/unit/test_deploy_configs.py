"""Deployment files: KubeRay manifests validate strictly against the v1.7 CRDs; Serve configs build."""

import gzip
import json
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "tests" / "data" / "kuberay-crds"  # vendored: see its README
MANIFESTS = sorted((ROOT / "deploy" / "kuberay").glob("*.yaml"))


def _closed(schema):
    """Treat every object schema that lists properties as closed, as kubeconform -strict does."""
    if isinstance(schema, dict):
        schema = {k: _closed(v) for k, v in schema.items()}
        if "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema.setdefault("additionalProperties", False)
        return schema
    if isinstance(schema, list):
        return [_closed(v) for v in schema]
    return schema


def _crd_schema(kind):
    path = CRDS / f"{kind}.v1.schema.json.gz"
    if not path.exists():
        raise LookupError(f"no vendored CRD schema for {kind} at {path}")
    with gzip.open(path, "rt") as fh:
        return _closed(json.load(fh)["openAPIV3Schema"])


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_kuberay_manifest_is_valid_and_strict(path):
    manifest = yaml.safe_load(path.read_text())
    jsonschema.validate(manifest, _crd_schema(manifest["kind"]))


def test_strict_validation_catches_a_misspelt_key():
    manifest = yaml.safe_load((ROOT / "deploy" / "kuberay" / "rayservice-digits.yaml").read_text())
    manifest["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParam"] = {}
    with pytest.raises(jsonschema.ValidationError, match="rayStartParam"):
        jsonschema.validate(manifest, _crd_schema("RayService"))


@pytest.mark.parametrize("config", [ROOT / "serving" / "digits.yaml", "rayservice"])
def test_serve_configs_parse_and_build_the_application(config):
    from ray.serve.schema import ServeDeploySchema

    from rayline.serve.app import build_app

    if config == "rayservice":
        raw = yaml.safe_load(yaml.safe_load((ROOT / "deploy" / "kuberay" / "rayservice-digits.yaml").read_text())["spec"]["serveConfigV2"])
    else:
        raw = yaml.safe_load(config.read_text())
    schema = ServeDeploySchema.model_validate(raw)
    app = schema.applications[0]
    assert app.import_path == "rayline.serve.app:build_app"
    application = build_app(app.args)  # builds without a running Ray
    assert type(application).__name__ == "Application"
