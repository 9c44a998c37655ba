"""Deployment files: KubeRay manifests validate strictly against the v1.7 CRDs; Serve configs build."""

import functools
import gzip
import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "tests" / "data" / "kuberay-crds"  # vendored: see its README
KUBERAY_FILES = sorted((ROOT / "deploy" / "kuberay").glob("*.yaml"))
# Ray resources (validated against the vendored CRDs); NetworkPolicies are checked by hand below.
MANIFESTS = [p for p in KUBERAY_FILES
             if all(d.get("apiVersion") == "ray.io/v1" for d in yaml.safe_load_all(p.read_text()))]


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
def test_serve_configs_parse_and_build_the_application(config, monkeypatch):
    from ray.serve.schema import ServeDeploySchema

    from rayline.serve import app as serve_app
    from rayline.serve.app import build_app

    # `version: latest` is resolved in the registry where the app is built (there is none here;
    # tests/integration/test_versions.py covers the lookup): only the config's shape is checked.
    monkeypatch.setattr(serve_app, "_resolved_version", lambda args: "1")

    if config == "rayservice":
        raw = yaml.safe_load(yaml.safe_load((ROOT / "deploy" / "kuberay" / "rayservice-digits.yaml").read_text())["spec"]["serveConfigV2"])
    else:
        raw = yaml.safe_load(config.read_text())
    schema = ServeDeploySchema.model_validate(raw)
    app = schema.applications[0]
    assert app.import_path == "rayline.serve.app:build_app"
    application = build_app(app.args)  # builds without a running Ray
    assert type(application).__name__ == "Application"


# ---------------------------------------------------------------- KubeRay: every file, every container

WORKSPACE_PVC = ROOT / "deploy" / "kuberay" / "workspace-pvc.yaml"
NETWORK_POLICIES = [p for p in KUBERAY_FILES if p not in MANIFESTS and p != WORKSPACE_PVC]
_RAY_KINDS = {"RayCluster", "RayJob", "RayService"}


def _ray_docs():
    return [yaml.safe_load(p.read_text()) for p in MANIFESTS]


def test_every_kuberay_file_is_a_ray_resource_or_a_network_policy():
    """Nothing in deploy/kuberay escapes the checks: a Ray resource goes through its CRD schema,
    a NetworkPolicy through the hand check below, the workspace volume through its own test, any
    other kind fails here."""
    kinds = set()
    for path in KUBERAY_FILES:
        for doc in yaml.safe_load_all(path.read_text()):
            kinds.add(doc["kind"])
            if doc["apiVersion"] == "ray.io/v1":
                assert path in MANIFESTS, path.name
                _crd_validator(doc["kind"]).validate(doc)
            elif path == WORKSPACE_PVC:  # checked by the shared-workspace test below
                assert (doc["apiVersion"], doc["kind"]) == ("v1", "PersistentVolumeClaim")
            else:
                assert (doc["apiVersion"], doc["kind"]) == ("networking.k8s.io/v1", "NetworkPolicy"), path.name
                assert path in NETWORK_POLICIES
    assert kinds == _RAY_KINDS | {"NetworkPolicy", "PersistentVolumeClaim"}


def test_strict_validation_catches_a_misspelt_raycluster_key():
    manifest = yaml.safe_load((ROOT / "deploy" / "kuberay" / "raycluster.yaml").read_text())
    manifest["spec"]["workerGroupSpecs"][1]["numOfHost"] = manifest["spec"]["workerGroupSpecs"][1].pop("numOfHosts")
    with pytest.raises(jsonschema.ValidationError, match="numOfHost"):
        _crd_validator("RayCluster").validate(manifest)


def _containers(node, where=""):
    """Every container anywhere in a document (head, worker groups, submitter, any sidecar a
    later edit adds), found by walking it rather than by listing known places."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("containers", "initContainers") and isinstance(value, list):
                for i, container in enumerate(value):
                    yield f"{where}.{key}[{container.get('name', i)}]", container
            else:
                yield from _containers(value, f"{where}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _containers(value, f"{where}[{i}]")


def _resource_problems(manifest):
    """Containers without cpu and memory in both requests and limits; the autoscaler sidecar
    (which KubeRay adds when in-tree autoscaling is on) and the RayJob submitter (KubeRay's
    default one has no limits) count as containers too."""
    sized = list(_containers(manifest))
    cluster = _cluster_spec(manifest) or {}
    if cluster.get("enableInTreeAutoscaling"):
        sized.append(("autoscalerOptions", cluster.get("autoscalerOptions") or {}))
    problems = []
    if manifest["kind"] == "RayJob" and manifest["spec"].get("submissionMode", "K8sJobMode") == "K8sJobMode" \
            and "submitterPodTemplate" not in manifest["spec"]:
        problems.append("RayJob submitter: no submitterPodTemplate (KubeRay's default has no limits)")
    for where, container in sized:
        resources = container.get("resources") or {}
        for kind in ("requests", "limits"):
            missing = {"cpu", "memory"} - set(resources.get(kind) or {})
            if missing:
                problems.append(f"{where}: no {kind} for {', '.join(sorted(missing))}")
    return problems


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_every_container_has_cpu_and_memory_requests_and_limits(path):
    manifest = yaml.safe_load(path.read_text())
    assert len(list(_containers(manifest))) >= 2
    assert _resource_problems(manifest) == []


@pytest.mark.parametrize("name, mutate, problem", [
    ("raycluster.yaml", lambda m: m["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"].pop("requests"),
     "workerGroupSpecs[0].template.spec.containers[ray-worker]: no requests for cpu, memory"),
    ("raycluster.yaml", lambda m: m["spec"]["autoscalerOptions"].pop("resources"), "autoscalerOptions: no limits"),
    ("raycluster.yaml", lambda m: m["spec"]["headGroupSpec"]["template"]["spec"]["containers"].append(
        {"name": "log-shipper", "image": "fluent-bit", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}),
     "containers[log-shipper]: no requests"),
    ("rayservice-digits.yaml", lambda m: m["spec"]["rayClusterConfig"].pop("autoscalerOptions"), "autoscalerOptions: no requests"),
    ("rayjob-digits.yaml", lambda m: m["spec"].pop("submitterPodTemplate"), "no submitterPodTemplate"),
    ("rayjob-digits.yaml", lambda m: m["spec"]["submitterPodTemplate"]["spec"]["containers"][0]["resources"]["limits"].pop("memory"),
     "submitterPodTemplate.spec.containers[ray-job-submitter]: no limits for memory"),
])
def test_resource_check_catches_an_unsized_container(name, mutate, problem):
    manifest = yaml.safe_load((ROOT / "deploy" / "kuberay" / name).read_text())
    mutate(manifest)
    _crd_validator(manifest["kind"]).validate(manifest)  # still valid: only this check catches it
    assert any(problem in p for p in _resource_problems(manifest)), _resource_problems(manifest)


def _serves(manifest):
    """A RayService serves; so does a RayCluster (a submitted `rayline run` ends by serving the model) and
    a RayJob whose pipeline is not run with --no-serve."""
    return manifest["kind"] != "RayJob" or "--no-serve" not in manifest["spec"]["entrypoint"]


def _ray_containers(manifest):
    """The Ray container of each group: KubeRay runs Ray in the first container of the pod."""
    cluster = _cluster_spec(manifest)
    groups = [("head", cluster["headGroupSpec"])] + [(g["groupName"], g) for g in cluster.get("workerGroupSpecs") or []]
    return [(name, group["template"]["spec"]["containers"][0]) for name, group in groups]


_SERVE_ENV = {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
              "RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH": "2147483647",
              "RAY_SERVE_HAPROXY_RETRY_ON": "conn-failure empty-response"}


def _serve_env_problems(manifest):
    problems = []
    for name, container in _ray_containers(manifest):
        env = {e["name"]: e.get("value") for e in container.get("env") or []}
        for key, value in _SERVE_ENV.items():
            if env.get(key) != value:
                problems.append(f"{name} group: {key} is {env.get(key)!r}, not {value!r}")
    return problems


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_clusters_that_serve_set_serves_fast_ingress_env_on_every_ray_container(path):
    manifest = yaml.safe_load(path.read_text())
    assert _serve_env_problems(manifest) == [] or not _serves(manifest)  # a --no-serve RayJob needs none


def test_the_manifests_serve_env_is_what_rayline_sets_for_a_ray_it_starts():
    from rayline.cluster.env import serve_env

    ours = serve_env("haproxy", state_dir="/tmp/x")
    assert {key: ours[key] for key in _SERVE_ENV} == _SERVE_ENV


def test_serve_env_check_catches_a_group_without_it():
    manifest = yaml.safe_load((ROOT / "deploy" / "kuberay" / "raycluster.yaml").read_text())
    manifest["spec"]["workerGroupSpecs"][1]["template"]["spec"]["containers"][0]["env"].pop(0)
    assert _serve_env_problems(manifest) == ["tpu group: RAY_SERVE_ENABLE_HA_PROXY is None, not '1'"]


def _raycluster():
    return yaml.safe_load((ROOT / "deploy" / "kuberay" / "raycluster.yaml").read_text())


def _accelerator_problems(manifest):
    spec = manifest["spec"]
    problems = []
    if spec["headGroupSpec"]["rayStartParams"].get("num-cpus") != "0":
        problems.append("head: rayStartParams num-cpus is not \"0\"")
    if not spec.get("enableInTreeAutoscaling"):
        problems.append("in-tree autoscaling off")
    by_resource = {}
    for group in spec["workerGroupSpecs"]:
        pod = group["template"]["spec"]
        limits = pod["containers"][0]["resources"]["limits"]
        for resource in ("nvidia.com/gpu", "google.com/tpu"):
            if resource in limits:
                by_resource[resource] = (group, pod)
    if "nvidia.com/gpu" not in by_resource:
        problems.append("no worker group with nvidia.com/gpu limits")
    else:
        group, pod = by_resource["nvidia.com/gpu"]
        if not pod.get("nodeSelector") or not any(t.get("key") == "nvidia.com/gpu" for t in pod.get("tolerations") or []):
            problems.append(f"{group['groupName']}: no GPU nodeSelector / nvidia.com/gpu toleration")
    if "google.com/tpu" not in by_resource:
        problems.append("no worker group with google.com/tpu limits")
    else:
        group, pod = by_resource["google.com/tpu"]
        selector = pod.get("nodeSelector") or {}
        for key in ("cloud.google.com/gke-tpu-accelerator", "cloud.google.com/gke-tpu-topology"):
            if not selector.get(key):
                problems.append(f"{group['groupName']}: no nodeSelector {key}")
        if group.get("numOfHosts", 1) < 1:
            problems.append(f"{group['groupName']}: numOfHosts {group.get('numOfHosts')}")
    return problems


def test_raycluster_has_a_cpu_head_a_gpu_group_and_a_gke_tpu_group():
    import ray

    manifest = _raycluster()
    assert _accelerator_problems(manifest) == []
    assert manifest["spec"]["rayVersion"] == ray.__version__
    # GPU pods run the CUDA-ready build of deploy/Dockerfile; every other pod the CPU build.
    for _, container in _containers(manifest):
        wants_gpu = "nvidia.com/gpu" in container["resources"]["limits"]
        assert container["image"] == ("rayline:0.1.0-gpu" if wants_gpu else "rayline:0.1.0"), container["name"]
    assert "deploy/Dockerfile" in (ROOT / "deploy" / "kuberay" / "raycluster.yaml").read_text().split("apiVersion:")[0]


@pytest.mark.parametrize("mutate, problem", [
    (lambda s: s["workerGroupSpecs"][1]["template"]["spec"]["nodeSelector"].pop("cloud.google.com/gke-tpu-topology"),
     "tpu: no nodeSelector cloud.google.com/gke-tpu-topology"),
    (lambda s: s["workerGroupSpecs"][1]["template"]["spec"]["nodeSelector"].pop("cloud.google.com/gke-tpu-accelerator"),
     "tpu: no nodeSelector cloud.google.com/gke-tpu-accelerator"),
    (lambda s: s["workerGroupSpecs"].pop(1), "no worker group with google.com/tpu limits"),
    (lambda s: s["workerGroupSpecs"][0]["template"]["spec"].pop("tolerations"), "gpu: no GPU nodeSelector"),
    (lambda s: s["headGroupSpec"].update(rayStartParams={}), "head: rayStartParams num-cpus"),
    (lambda s: s.pop("enableInTreeAutoscaling"), "in-tree autoscaling off"),
])
def test_accelerator_check_catches_a_missing_piece(mutate, problem):
    manifest = _raycluster()
    mutate(manifest["spec"])
    _crd_validator("RayCluster").validate(manifest)
    assert any(p.startswith(problem) for p in _accelerator_problems(manifest)), _accelerator_problems(manifest)


def _serve_config_problems(manifest):
    """serveConfigV2 must be a Ray Serve config whose import paths resolve (imported, not built)."""
    import importlib

    from pydantic import ValidationError
    from ray.serve.schema import ServeDeploySchema

    try:
        schema = ServeDeploySchema.model_validate(yaml.safe_load(manifest["spec"]["serveConfigV2"]))
    except ValidationError as exc:
        return [f"serveConfigV2: {exc.errors()[0]['msg']}"]
    problems = []
    for app in schema.applications:
        module, _, attr = app.import_path.partition(":")
        try:
            target = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            problems.append(f"{app.name}: {app.import_path} does not import ({exc})")
            continue
        if not callable(target):
            problems.append(f"{app.name}: {app.import_path} is not callable")
    return problems


@pytest.mark.parametrize("path", [p for p in MANIFESTS if yaml.safe_load(p.read_text())["kind"] == "RayService"],
                         ids=lambda p: p.name)
def test_rayservice_serve_config_names_an_importable_application(path):
    manifest = yaml.safe_load(path.read_text())
    assert _serve_config_problems(manifest) == []
    assert yaml.safe_load(manifest["spec"]["serveConfigV2"])["applications"][0]["import_path"] == "rayline.serve.app:build_app"


@pytest.mark.parametrize("config, problem", [
    ("applications:\n  - name: digits\n    import_path: rayline.serve.app:no_such_builder\n", "does not import"),
    ("applications:\n  - name: digits\n    import_path: rayline.no_such_module:build_app\n", "does not import"),
    ("applications:\n  - name: digits\n", "serveConfigV2: Field required"),
])
def test_serve_config_check_catches_a_bad_application(config, problem):
    manifest = yaml.safe_load((ROOT / "deploy" / "kuberay" / "rayservice-digits.yaml").read_text())
    manifest["spec"]["serveConfigV2"] = config
    assert any(problem in p for p in _serve_config_problems(manifest)), _serve_config_problems(manifest)


def test_rayservice_upgrades_incrementally_through_the_gateway_api():
    """The CRD leaves upgradeStrategy.type a free string, so a typo would pass the schema and
    KubeRay would reject it at apply time: pin the value, its required options, and the comment."""
    path = ROOT / "deploy" / "kuberay" / "rayservice-digits.yaml"
    strategy = yaml.safe_load(path.read_text())["spec"]["upgradeStrategy"]
    assert strategy["type"] == "NewClusterWithIncrementalUpgrade"
    options = strategy["clusterUpgradeOptions"]
    assert options["gatewayClassName"] and 0 < options["stepSizePercent"] <= 100 and options["intervalSeconds"] > 0
    assert 0 < options.get("maxSurgePercent", 100) <= 100
    text = path.read_text()
    assert all(word in text for word in ("Gateway API", "GatewayClass", "RayServiceIncrementalUpgrade"))


# ---------------------------------------------------------------- KubeRay: NetworkPolicy (no k8s schema vendored)

_OPERATOR_NAMESPACE = "ray-system"


def _policies():
    return [doc for path in NETWORK_POLICIES for doc in yaml.safe_load_all(path.read_text())]


def _selects(selector, manifest):
    """Whether a policy's podSelector picks the Ray pods of this manifest's cluster: by
    ray.io/cluster for a RayCluster (its name is the cluster's), by KubeRay's originated-from
    labels plus ray.io/cluster for the generated clusters of a RayService/RayJob."""
    labels = selector.get("matchLabels") or {}
    name = manifest["metadata"]["name"]
    if manifest["kind"] == "RayCluster":
        return labels.get("ray.io/cluster") == name
    return labels.get("ray.io/originated-from-crd") == manifest["kind"] \
        and labels.get("ray.io/originated-from-cr-name") == name


def _policy_problems(policy):
    """One NetworkPolicy: on Ray pods (selected by ray.io/cluster), ingress only; each rule is
    either the same cluster (all ports), Serve's 8000 from anywhere, or the dashboard 8265 from the
    operator namespace (and the cluster's own submitter)."""
    name = policy.get("metadata", {}).get("name", "?")
    problems = []
    if (policy.get("apiVersion"), policy.get("kind")) != ("networking.k8s.io/v1", "NetworkPolicy"):
        problems.append(f"{name}: {policy.get('apiVersion')}/{policy.get('kind')} is not networking.k8s.io/v1 NetworkPolicy")
    spec = policy.get("spec") or {}
    selector = spec.get("podSelector") or {}
    on_cluster = "ray.io/cluster" in (selector.get("matchLabels") or {}) or any(
        e.get("key") == "ray.io/cluster" and e.get("operator") in ("Exists", "In") for e in selector.get("matchExpressions") or [])
    if not on_cluster:
        problems.append(f"{name}: podSelector does not select on ray.io/cluster")
    if "Ingress" not in (spec.get("policyTypes") or []):
        problems.append(f"{name}: policyTypes lacks Ingress")
    own = {k: v for k, v in (selector.get("matchLabels") or {}).items()}
    for i, rule in enumerate(spec.get("ingress") or []):
        ports = sorted(p.get("port") for p in rule.get("ports") or [])
        peers = rule.get("from")
        if not peers:
            if ports != [_SERVE_PORT]:
                problems.append(f"{name}: ingress[{i}] from anywhere to ports {ports or 'all'}")
            continue
        same_cluster = all(set(own.items()) <= set((p.get("podSelector") or {}).get("matchLabels", {}).items())
                           and set(p) == {"podSelector"} for p in peers)
        if same_cluster:
            continue  # Ray's own traffic: GCS, raylets, object manager, worker ports
        if ports != [8265]:
            problems.append(f"{name}: ingress[{i}] from outside the cluster to ports {ports or 'all'}")
        for peer in peers:
            ns = ((peer.get("namespaceSelector") or {}).get("matchLabels") or {}).get("kubernetes.io/metadata.name")
            submitter = set(peer) == {"podSelector"} and \
                set(own.items()) - {("ray.io/cluster", own.get("ray.io/cluster"))} <= set(
                    (peer["podSelector"].get("matchLabels") or {}).items()) and own.get("ray.io/originated-from-crd") == "RayJob"
            if not (set(peer) == {"namespaceSelector"} and ns == _OPERATOR_NAMESPACE) and not submitter:
                problems.append(f"{name}: ingress[{i}] lets {peer} reach the dashboard")
    return problems


def test_network_policies_cover_every_ray_cluster_and_open_only_serve_and_the_operator():
    policies = _policies()
    assert policies
    for policy in policies:
        assert _policy_problems(policy) == []
    for manifest in _ray_docs():
        mine = [p for p in policies if _selects(p["spec"]["podSelector"], manifest)]
        assert len(mine) == 1, f"{manifest['kind']} {manifest['metadata']['name']}: {len(mine)} policies"
        rules = mine[0]["spec"]["ingress"]
        open_ports = [sorted(p["port"] for p in r["ports"]) for r in rules if not r.get("from")]
        assert open_ports == ([[_SERVE_PORT]] if _serves(manifest) else []), manifest["kind"]
        assert any([p["port"] for p in r.get("ports", [])] == [8265] for r in rules if r.get("from")), manifest["kind"]


@pytest.mark.parametrize("mutate, problem", [
    (lambda p: p.update(apiVersion="extensions/v1beta1"), "is not networking.k8s.io/v1 NetworkPolicy"),
    (lambda p: p["spec"].update(podSelector={}), "podSelector does not select on ray.io/cluster"),
    (lambda p: p["spec"].update(policyTypes=["Egress"]), "policyTypes lacks Ingress"),
    (lambda p: p["spec"]["ingress"][1]["ports"].append({"port": 8265, "protocol": "TCP"}), "from anywhere to ports [8000, 8265]"),
    (lambda p: p["spec"]["ingress"].append({"from": [{"namespaceSelector": {}}], "ports": [{"port": 6379}]}),
     "from outside the cluster to ports [6379]"),
    (lambda p: p["spec"]["ingress"][2]["from"][0].update(
        namespaceSelector={"matchLabels": {"kubernetes.io/metadata.name": "default"}}), "reach the dashboard"),
])
def test_network_policy_check_catches_an_opening(mutate, problem):
    policy = _policies()[0]
    assert _policy_problems(policy) == []
    mutate(policy)
    assert any(problem in p for p in _policy_problems(policy)), _policy_problems(policy)


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
        assert "RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH=2147483647" in command
        assert 'RAY_SERVE_HAPROXY_RETRY_ON="conn-failure empty-response"' in command
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
    args = dict(re.findall(r"^ARG (\w+)=(\S*)$", dockerfile, re.M))
    assert args["RAY_IMAGE"] == f"rayproject/ray:{ray.__version__}-py311-cpu"
    assert "FROM ${RAY_IMAGE}" in dockerfile
    # The CPU build takes torch's CPU wheel (PyPI's default torch drags in GBs of CUDA).
    assert args["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    assert '--extra-index-url "${TORCH_INDEX_URL}"' in dockerfile


def test_dockerfile_documents_a_cuda_build_of_the_same_ray():
    import ray

    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    cuda = re.search(r"--build-arg RAY_IMAGE=rayproject/ray:(\S+)-py311-(cu\d+)", dockerfile)
    assert cuda and cuda.group(1) == ray.__version__
    # torch's CUDA wheel for the same CUDA major.minor as the Ray base image
    assert f"TORCH_INDEX_URL=https://download.pytorch.org/whl/{cuda.group(2)}" in dockerfile
    # the image checks at build time that it carries the pinned Ray
    assert f"ray.__version__ == '{ray.__version__}'" in dockerfile


@pytest.mark.parametrize("name", ["aws.yaml", "gcp.yaml"])
def test_launcher_gpu_workers_run_the_cuda_image(name):
    raw = yaml.safe_load((ROOT / "deploy" / "launcher" / name).read_text())
    cpu_image = raw["docker"]["image"]
    gpu_image = raw["available_node_types"]["gpu-worker"]["docker"]["worker_image"]
    assert gpu_image == cpu_image + "-gpu"


def test_docker_build_context_leaves_out_state_and_secrets():
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".git", ".rayline", "**/auth_token", ".env"} <= ignored


def _claim_names(node):
    if isinstance(node, dict):
        if "claimName" in node:
            yield node["claimName"]
        for value in node.values():
            yield from _claim_names(value)
    elif isinstance(node, list):
        for value in node:
            yield from _claim_names(value)


def test_shared_workspace_volume_is_read_write_many_and_is_the_one_the_manifests_mount():
    pvc = yaml.safe_load(WORKSPACE_PVC.read_text())
    assert (pvc["apiVersion"], pvc["kind"]) == ("v1", "PersistentVolumeClaim")
    # Checkpoints are written by workers on several nodes and read by replicas on any node.
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    claims = {name for path in MANIFESTS for name in _claim_names(yaml.safe_load(path.read_text()))}
    assert claims == {pvc["metadata"]["name"]}
