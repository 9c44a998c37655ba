"""Deployment files: KubeRay manifests validate strictly against the v1.7 CRDs; Serve configs build."""

import functools
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


@functools.lru_cache(maxsize=None)
def _crd_validator(kind):
    """One validator per kind: checking the ~1 MB schema itself took ~4 s per jsonschema.validate call."""
    path = CRDS / f"{kind}.v1.schema.json.gz"
    if not path.exists():
        raise LookupError(f"no vendored CRD schema for {kind} at {path}")
    with gzip.open(path, "rt") as fh:
        schema = _closed(json.load(fh)["openAPIV3Schema"])
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_kuberay_manifest_is_valid_and_strict(path):
    manifest = yaml.safe_load(path.read_text())
    _crd_validator(manifest["kind"]).validate(manifest)


def test_strict_validation_catches_a_misspelt_key():
    manifest = yaml.safe_load((ROOT / "deploy" / "kuberay" / "rayservice-digits.yaml").read_text())
    manifest["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParam"] = {}
    with pytest.raises(jsonschema.ValidationError, match="rayStartParam"):
        _crd_validator("RayService").validate(manifest)


# Ports of the Ray head that run code or hold cluster state: dashboard (its Jobs API runs any
# code), GCS, Ray Client server; the metrics export port is read-only but cluster-internal too.
_CONTROL_PORTS = {8265: "dashboard", 6379: "GCS", 10001: "Ray Client"}
_SERVE_PORT = 8000


def _cluster_spec(manifest):
    spec = manifest["spec"]
    return {"RayCluster": lambda: spec, "RayJob": lambda: spec.get("rayClusterSpec"),
            "RayService": lambda: spec.get("rayClusterConfig")}[manifest["kind"]]()


def _exposure_problems(manifest):
    """Everything in a KubeRay manifest that opens the Ray control plane: token auth off, a head
    Service or Ingress beyond the cluster, a hostPort, a Serve Service with more than the Serve port."""
    problems = []
    cluster = _cluster_spec(manifest) or {}
    if (cluster.get("authOptions") or {}).get("mode") != "token":
        problems.append("authOptions.mode is not token")
    groups = [("head", cluster.get("headGroupSpec") or {})] + [
        (g.get("groupName", "?"), g) for g in cluster.get("workerGroupSpecs") or []]
    head = groups[0][1]
    if head.get("serviceType", "ClusterIP") != "ClusterIP":
        problems.append(f"head serviceType {head['serviceType']}")
    if head.get("enableIngress"):
        problems.append("head enableIngress")
    head_service = (head.get("headService") or {}).get("spec") or {}
    if head_service.get("type", "ClusterIP") != "ClusterIP":
        problems.append(f"headService type {head_service['type']}")
    for name, group in groups:
        for container in ((group.get("template") or {}).get("spec") or {}).get("containers") or []:
            for port in container.get("ports") or []:
                if port.get("hostPort"):
                    problems.append(f"{name} group: hostPort {port['hostPort']} for containerPort {port.get('containerPort')}")
            env = {e.get("name"): e.get("value") for e in container.get("env") or []}
            if env.get("RAY_AUTH_MODE", "token") != "token":
                problems.append(f"{name} group: RAY_AUTH_MODE={env['RAY_AUTH_MODE']}")
    serve_service = (manifest["spec"].get("serveService") or {}).get("spec") or {}
    for port in serve_service.get("ports") or []:
        target = port.get("targetPort", port.get("port"))
        if target != _SERVE_PORT:
            problems.append(f"serveService exposes port {target} ({_CONTROL_PORTS.get(target, 'not Serve')})")
    return problems


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_kuberay_manifest_has_token_auth_and_keeps_ray_ports_inside_the_cluster(path):
    manifest = yaml.safe_load(path.read_text())
    assert _exposure_problems(manifest) == []
    text = path.read_text()
    assert "token" in text.split("apiVersion:")[0], "the header comment says how the control plane is protected"


@pytest.mark.parametrize("mutate, problem", [
    (lambda c, m: c.pop("authOptions"), "authOptions.mode is not token"),
    (lambda c, m: c["authOptions"].update(mode="disabled"), "authOptions.mode is not token"),
    (lambda c, m: c["headGroupSpec"].update(serviceType="LoadBalancer"), "head serviceType LoadBalancer"),
    (lambda c, m: c["headGroupSpec"].update(enableIngress=True), "head enableIngress"),
    (lambda c, m: c["headGroupSpec"]["template"]["spec"]["containers"][0].setdefault("ports", []).append(
        {"containerPort": 8265, "hostPort": 8265}), "head group: hostPort 8265 for containerPort 8265"),
    (lambda c, m: m["spec"].update(serveService={"spec": {"type": "LoadBalancer", "ports": [{"port": 8265}]}}),
     "serveService exposes port 8265 (dashboard)"),
])
def test_exposure_check_catches_an_open_control_plane(mutate, problem):
    manifest = yaml.safe_load((ROOT / "deploy" / "kuberay" / "rayservice-digits.yaml").read_text())
    mutate(_cluster_spec(manifest), manifest)
    _crd_validator("RayService").validate(manifest)  # still a valid manifest: only this check catches it
    assert problem in _exposure_problems(manifest)


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


# ---------------------------------------------------------------- Ray cluster launcher (deploy/launcher)

LAUNCHER = sorted((ROOT / "deploy" / "launcher").glob("*.yaml"))


def _launcher_schema():
    import ray.autoscaler

    return json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())


def test_launcher_configs_exist_for_aws_and_gcp():
    assert {p.stem for p in LAUNCHER} == {"aws", "gcp"}


@pytest.mark.parametrize("path", LAUNCHER, ids=lambda p: p.name)
def test_launcher_config_passes_rays_own_schema_and_fill_out(path):
    """Ray's launcher schema (inside the ray package) on the file as written, then Ray's own
    default fill-out and validation, as `ray up` does before it talks to the cloud."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    raw = yaml.safe_load(path.read_text())
    jsonschema.validate(raw, _launcher_schema())
    validate_config(prepare_config(raw))


def test_launcher_schema_check_catches_a_misspelt_key():
    raw = yaml.safe_load(LAUNCHER[0].read_text())
    raw["max_worker"] = raw.pop("max_workers")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(raw, _launcher_schema())


@pytest.mark.parametrize("path", LAUNCHER, ids=lambda p: p.name)
def test_launcher_config_is_closed_by_default(path):
    """Token auth on every node, the token file shipped, the dashboard (Jobs API) on loopback
    only, and on AWS no inbound rule but SSH from a named range."""
    raw = yaml.safe_load(path.read_text())
    starts = [c for key in ("head_start_ray_commands", "worker_start_ray_commands")
              for c in raw[key] if "ray start" in c]
    assert len(starts) == 2
    for command in starts:
        assert "RAY_AUTH_MODE=token" in command, command
        assert "RAY_SERVE_ENABLE_HA_PROXY=1" in command and "RAY_SERVE_THROUGHPUT_OPTIMIZED=1" in command
        assert "0.0.0.0" not in command
    head = next(c for c in starts if "--head" in c)
    assert "--dashboard-host=127.0.0.1" in head
    assert raw["file_mounts"].get("~/.ray/auth_token") == "~/.ray/auth_token"
    image = raw["docker"]["image"]
    assert image.endswith(":0.1.0")
    if raw["provider"]["type"] == "aws":
        rules = raw["provider"]["security_group"]["IpPermissions"]
        assert [(r["FromPort"], r["ToPort"]) for r in rules] == [(22, 22)]
        cidrs = [ip["CidrIp"] for r in rules for ip in r["IpRanges"]]
        assert cidrs and "0.0.0.0/0" not in cidrs


def test_launcher_base_image_is_the_pinned_ray():
    import ray

    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    assert f"FROM rayproject/ray:{ray.__version__}-" in dockerfile


def test_docker_build_context_leaves_out_state_and_secrets():
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".git", ".rayline", "**/auth_token", ".env"} <= ignored
