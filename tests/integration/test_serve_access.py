"""API keys, per-model Prometheus metrics and `rayline serve status` on real Serve endpoints.

Keys from a file: the registered digits model (session fixture) deployed once more as a Serve
application of its own. Keys from an environment variable (set before ray.init in conftest.py,
so the replicas inherit it): a tiny iris pipeline whose spec says `serve.auth.api_keys_env`, run
by the real runner (spec logged to MLflow, version registered, deployed behind its router).
"""

import json
import os
import secrets
import subprocess
import sys
import time
from collections import Counter

import httpx
import pytest
import yaml

from .. import loopback
from ..cli import rayline
from ..ray_metrics import metrics_export_text
from .conftest import PORT, ROOT, run

FILE_APP = "digits-keyfile"
ENV_VAR = "RAYLINE_TEST_API_KEYS"  # set in conftest.py's ray_session, before ray.init
KEYED = "keyed-iris"  # the pipeline whose spec names ENV_VAR
KEY = "file-key-" + secrets.token_urlsafe(24)
OTHER_KEY = "file-key-" + secrets.token_urlsafe(24)
WRONG_KEY = "file-key-" + secrets.token_urlsafe(24)
sent = Counter()  # (endpoint, code) of every request this module sends to FILE_APP
rows_answered = [0]


def _deploy(digits, ws, app, auth):
    """`app` (FILE_APP: `sent` counts what reaches it) deployed, once its route answers."""
    from ray import serve

    from rayline.serve.app import build_app

    args = {"name": "digits", "version": digits.version, "workspace": str(ws.root), "tracking_uri": ws.tracking_uri_override,
            "framework": "torch", "auth": auth}
    serve.run(build_app(args), name=app, route_prefix=f"/{app}")
    # RUNNING comes a moment before the ingress routes the prefix (its 404 is no request of the app's,
    # and the module counts every request it sends against the app's metrics): as rayline's deploy waits.
    from rayline.serve.address import ServeAddress, wait_routed

    assert wait_routed(ServeAddress("127.0.0.1", PORT, existing=True), [f"/{app}"], "127.0.0.1")
    # wait_routed also waits for HAProxy's reload that routes the prefix to the replica (rayline/serve/
    # address.py: wait_ingress_direct): before it, this module's requests got the ingress's 404 twice on
    # CI's box (2026-12-06), every count after it then one off. Then until the route itself answers:
    # /health needs no key; its answer is counted as the app counts it.
    url = f"http://127.0.0.1:{PORT}/{app}"
    deadline = time.monotonic() + 120  # a guard against a hang, not a bound on a slow box
    while (r := loopback.get(f"{url}/health", timeout=60)).status_code == 404 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert r.status_code == 200, r.text
    sent[("health", 200)] += 1
    return url


@pytest.fixture(scope="module")
def keyfile_app(digits, ws, tmp_path_factory):
    path = tmp_path_factory.mktemp("keys") / "api-keys"
    path.write_text(f"# rayline test keys\n{KEY}\n\n{OTHER_KEY}\n")
    return _deploy(digits, ws, FILE_APP, {"api_keys_file": str(path)})


@pytest.fixture(scope="module")
def instance(digits, ws):
    from rayline import load_model

    model = load_model("digits", digits.version, workspace=str(ws.root))
    return {f.name: 1.0 for f in model.preprocessing.features}


def _send(method, url, endpoint, **kwargs):
    r = httpx.request(method, url, timeout=60, verify=loopback.TLS, **kwargs)
    sent[(endpoint, r.status_code)] += 1
    return r


def test_keys_guard_every_route_but_health(keyfile_app, instance):
    body = {"instances": [instance, instance, instance]}
    r = _send("POST", f"{keyfile_app}/predict", "predict", json=body)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert r.json() == {"detail": "missing API key: send the header 'Authorization: Bearer <key>'"}
    r = _send("POST", f"{keyfile_app}/predict", "predict", json=body, headers={"Authorization": f"Bearer {WRONG_KEY}"})
    assert r.status_code == 401 and r.json() == {"detail": "invalid API key"} and WRONG_KEY not in r.text
    assert _send("GET", f"{keyfile_app}/metadata", "metadata").status_code == 401
    for key in (KEY, OTHER_KEY):
        r = _send("POST", f"{keyfile_app}/predict", "predict", json=body, headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200, r.text
        assert len(r.json()["predictions"]) == 3
        rows_answered[0] += 3
    assert _send("GET", f"{keyfile_app}/metadata", "metadata", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    health = _send("GET", f"{keyfile_app}/health", "health")
    assert health.status_code == 200 and health.json()["status"] == "ok"


@pytest.fixture(scope="module")
def keyed_run(ray_session, ws, tmp_path_factory):
    """`rayline run` (the runner, in this process) of a 1-epoch iris spec with
    `serve.auth.api_keys_env`: it logs the spec to MLflow, writes its run record, registers the
    version and deploys it (version app, router, the routers' table in Ray's KV) while the key is
    in the driver's and the replicas' environment. The runner's log records are kept."""
    import logging

    folder = tmp_path_factory.mktemp("keyed")
    raw = {"name": KEYED, "data": {"source": {"format": "sklearn", "name": "iris"}, "label": "target"},
           "model": {"framework": "torch", "kind": "mlp", "params": {"hidden_sizes": [8]}},
           "train": {"workers": 1, "epochs": 1, "batch_size": 32},
           "serve": {"replicas": {"min": 1, "max": 1}, "auth": {"api_keys_env": ENV_VAR}}}
    path = folder / "keyed-iris.yaml"
    path.write_text(yaml.safe_dump(raw))

    class Keep(logging.Handler):
        def __init__(self):
            super().__init__(logging.DEBUG)
            self.lines = []

        def emit(self, record):
            self.lines.append(self.format(record))

    from rayline.spec import load_spec

    # Every record that reaches the root logger (rayline's own down to DEBUG; the rest at their levels).
    keep, root, ours = Keep(), logging.getLogger(), logging.getLogger("rayline")
    level = ours.level
    root.addHandler(keep)
    ours.setLevel(logging.DEBUG)
    try:
        summary = run(load_spec(path), ws, spec_path=str(path))
    finally:
        root.removeHandler(keep)
        ours.setLevel(level)
    summary.log_lines = keep.lines
    return summary


@pytest.fixture(scope="module")
def key_traffic(keyfile_app, keyed_run, instance):
    """Requests carrying every key (and wrong ones) to both apps, answered, failed and refused:
    each path a key travels through the proxy, the router, the replicas and their error handling."""
    env_key = os.environ[ENV_VAR]
    wrong_env_key = "env-key-" + secrets.token_urlsafe(24)
    body = {"instances": [instance]}
    first = next(iter(instance))
    for key, code in ((KEY, 200), (OTHER_KEY, 200), (WRONG_KEY, 401)):
        r = _send("POST", f"{keyfile_app}/predict", "predict", json=body, headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == code, r.text
        rows_answered[0] += 1 if code == 200 else 0
        r = _send("POST", f"{keyfile_app}/predict", "predict", json={"instances": [{**instance, first: "not a number"}]},
                  headers={"Authorization": f"Bearer {key}"})  # a 422 (or 401) with a key: the error paths
        assert r.status_code == (422 if code == 200 else 401), r.text
    iris = {"sepal length (cm)": 5.1, "sepal width (cm)": 3.5, "petal length (cm)": 1.4, "petal width (cm)": 0.2}
    url = keyed_run.endpoint
    for target in (url, f"{url}/v/{keyed_run.version}"):  # through the router, and to the version directly
        r = loopback.post(f"{target}/predict", json={"instances": [iris]}, headers={"Authorization": f"Bearer {env_key}"}, timeout=60)
        assert r.status_code == 200, r.text
        r = loopback.post(f"{target}/predict", json={"instances": [{**iris, "sepal width (cm)": "not a number"}]},
                       headers={"Authorization": f"Bearer {env_key}"}, timeout=60)
        assert r.status_code == 422, r.text
        r = loopback.post(f"{target}/predict", json={"instances": [iris]}, headers={"Authorization": f"Bearer {wrong_env_key}"},
                       timeout=60)
        assert r.status_code == 401 and wrong_env_key not in r.text, r.text
    return {"file key": KEY, "other file key": OTHER_KEY, "wrong file key": WRONG_KEY,
            "environment key": env_key, "wrong environment key": wrong_env_key}


def _files_text(folder) -> str:
    """Every readable file under `folder`, as one text (sockets and vanished files skipped; bytes
    read as latin-1, so a key's ASCII is found in binary files too: MLflow's SQLite store)."""
    import stat

    parts = []
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            try:
                if not stat.S_ISREG(os.stat(path).st_mode):
                    continue
                with open(path, "rb") as fh:
                    parts.append(fh.read().decode("latin-1"))
            except OSError:
                continue
    return "\n".join(parts)


def _mlflow_text(ws, name: str) -> str:
    """What MLflow holds about model `name`: registered-model and version tags and aliases, and of its
    pipeline run the params, tags and every artifact (the registered model directory with its spec)."""
    import tempfile

    from rayline.registry import Registry

    client = Registry(ws).client
    model = client.get_registered_model(name)
    parts = [json.dumps(model.tags), json.dumps(getattr(model, "aliases", {}))]
    for mv in client.search_model_versions(f"name='{name}'"):
        run_ = client.get_run(mv.run_id)
        parts += [json.dumps(mv.tags), mv.source, json.dumps(run_.data.params), json.dumps(run_.data.tags)]
        with tempfile.TemporaryDirectory() as tmp:
            parts.append(_files_text(client.download_artifacts(mv.run_id, "", tmp)))
    return "\n".join(parts)


def _metrics_text() -> str:
    return metrics_export_text()


def _kv_text() -> str:
    """rayline's entries in Ray's internal KV: the routers' tables (with each route's serve settings) and gates."""
    from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_list

    from rayline.serve.router import KV_NAMESPACE

    keys = _internal_kv_list(b"", namespace=KV_NAMESPACE)
    return "\n".join(k.decode() + " " + (_internal_kv_get(k, namespace=KV_NAMESPACE) or b"").decode("latin-1") for k in keys)


def test_the_key_is_written_nowhere(key_traffic, keyed_run, ws, tmp_path):
    """No key — from the file, from the environment, nor a wrong one a caller sent — in Ray's
    session directory (every log), the workspace (MLflow's store and artifacts, run records,
    caches), MLflow's registry as its API shows it, the runner's log records and stage events,
    Serve's status and details, Ray's KV, the Prometheus export or `rayline serve status`.
    Each place is first shown to hold what it should (the apps, the variable's name), so an
    empty or wrong place cannot pass."""
    import ray
    from ray import serve
    from ray.serve.context import _get_global_client

    # Ray exports metrics every 10 s: wait until the keyed version's requests are in the export.
    deadline = time.monotonic() + 60
    version_app = f"{KEYED}-v{keyed_run.version}"
    while not any(k[0] == "ray_rayline_requests_total" for k in _exported(version_app)) and time.monotonic() < deadline:
        time.sleep(2)
    address = ray.get_runtime_context().gcs_address
    # Every application, with its rollout (the routers' table) and its counts from the metrics export.
    # In this process (tests/cli.py: the same entry point and output, joining this Ray); the serve family's
    # subprocess is test_cli_status_joins_the_running_cluster's.
    cli = [rayline("serve", "status", "--address", address, "-w", str(tmp_path), *out, extra_env={"COLUMNS": "200"})
           for out in ((), ("-o", "json"))]
    assert all(p.returncode == 0 for p in cli), [p.stderr for p in cli]
    places = {
        "Ray's session directory (logs)": (_files_text(ray._private.worker._global_node.get_session_dir_path()),
                                           [FILE_APP, KEYED]),
        "the workspace (MLflow store, artifacts, run records)": (_files_text(ws.root), [KEYED, ENV_VAR]),
        "MLflow's registry": (_mlflow_text(ws, KEYED), [ENV_VAR, "api_keys_env", "champion"]),
        "the runner's log records and stage events": ("\n".join(keyed_run.log_lines + [repr(e) for e in keyed_run.events]),
                                                      [KEYED]),
        "serve.status()": (repr(serve.status()), [FILE_APP, KEYED]),
        "Serve's details": (json.dumps(_get_global_client().get_serve_details(), default=str), [FILE_APP, KEYED]),
        "Ray's KV": (_kv_text(), [KEYED, ENV_VAR]),
        "the Prometheus export": (_metrics_text(), [FILE_APP, KEYED]),
        "rayline serve status": ("\n".join(p.stdout + p.stderr for p in cli), [FILE_APP, KEYED]),
    }
    missing = {place: [e for e in expected if e not in text] for place, (text, expected) in places.items()}
    assert not any(missing.values()), f"not where it should be: {missing}"
    leaks = [f"{what} in {place}" for place, (text, _) in places.items() for what, key in key_traffic.items() if key in text]
    assert not leaks, f"a key was written: {'; '.join(leaks)}"


def test_keys_from_the_ray_nodes_environment(keyed_run):
    """The variable was set before ray.init (as a user sets it before `rayline run`): the
    replica inherits it, and it is nowhere in the deployment's arguments."""
    key = os.environ[ENV_VAR]
    iris = {"sepal length (cm)": 6.7, "sepal width (cm)": 3.0, "petal length (cm)": 5.2, "petal width (cm)": 2.3}
    for url in (keyed_run.endpoint, f"{keyed_run.endpoint}/v/{keyed_run.version}"):
        assert loopback.post(f"{url}/predict", json={"instances": [iris]}, timeout=60).status_code == 401
        r = loopback.post(f"{url}/predict", json={"instances": [iris]}, headers={"Authorization": f"Bearer {key}"}, timeout=60)
        assert r.status_code == 200 and len(r.json()["predictions"]) == 1, r.text
        assert loopback.get(f"{url}/health", timeout=60).status_code == 200


def test_missing_keys_fail_the_deployment_naming_the_variable(digits, ws):
    """A copy of the digits version registered as model no-keys, deployed as `rayline serve deploy`
    does with keys from a variable no node has: a one-line error naming it, in well under the
    replicas' start timeout, and none of the applications the deploy started is left behind."""
    from ray import serve

    from rayline.errors import ServeError
    from rayline.registry import Registry
    from rayline.serve.versions import deploy
    from rayline.spec import ServeSpec

    client = Registry(ws).client
    mv = client.get_model_version("digits", digits.version)
    client.create_registered_model("no-keys")
    version = str(client.create_model_version("no-keys", mv.source, mv.run_id, tags=dict(mv.tags)).version)
    os.environ.pop("RAYLINE_TEST_UNSET_KEYS", None)
    before = set(serve.status().applications)
    start = time.monotonic()
    with pytest.raises(ServeError) as info:
        # oip=False: no V2 application of the model's own, whose replicas would fail the same way three
        # times more; the deploy removes every application it started by one list (`created`).
        deploy("no-keys", version, ws=ws, serve_spec=ServeSpec(route="/no-keys", auth={"api_keys_env": "RAYLINE_TEST_UNSET_KEYS"},
                                                              oip=False), port=PORT)
    assert str(info.value).startswith(
        f"deploying no-keys v{version} at /no-keys/v/{version} failed: serve.auth.api_keys_env: environment variable "
        "RAYLINE_TEST_UNSET_KEYS is not set on the Ray node of this replica")
    assert time.monotonic() - start < 120
    assert set(serve.status().applications) - before == set()  # the router deleted with the version's


def _exported(app):
    """rayline's samples for `app` summed over the session's nodes: {(sample name, labels...): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    found = Counter()
    ours = "\n".join(line for line in metrics_export_text().splitlines() if "rayline_" in line) + "\n"
    for family in text_string_to_metric_families(ours):
        for s in family.samples:
            if s.labels.get("application") != app:
                continue
            key = (s.name, s.labels.get("model"), s.labels.get("version"), s.labels.get("endpoint"), s.labels.get("code"))
            found[key] += s.value
    return found


def test_metrics_per_model_and_version_match_what_was_sent(keyfile_app, key_traffic, digits):
    # key_traffic: answered (200), refused (401) and invalid (422) requests, whatever ran before.
    assert {c for _, c in sent} >= {200, 401, 422}, sent
    v = digits.version
    want = {("ray_rayline_requests_total", "digits", v, e, str(c)): n for (e, c), n in sent.items()}
    want.update({("ray_rayline_errors_total", "digits", v, e, str(c)): n for (e, c), n in sent.items() if c >= 400})
    want[("ray_rayline_rows_predicted_total", "digits", v, None, None)] = rows_answered[0]
    want[("ray_rayline_model_info", "digits", v, None, None)] = 1
    for endpoint in {e for e, _ in sent}:
        want[("ray_rayline_request_latency_s_count", "digits", v, endpoint, None)] = sum(n for (e, _), n in sent.items() if e == endpoint)
    # Ray exports every 10 s (metrics_report_interval_ms): poll, bounded.
    deadline = time.monotonic() + 60
    while True:
        found = _exported(FILE_APP)
        got = {k: found.get(k, 0) for k in want}
        if got == want or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert got == want
    assert sum(v for k, v in found.items() if k[0] == "ray_rayline_request_latency_s_bucket") > 0
    # every answered prediction was one model call here (requests one at a time): batches of its rows
    assert found.get(("ray_rayline_batch_size_count", "digits", v, None, None), 0) == sent.get(("predict", 200), 0)


def test_serve_status_in_process(keyfile_app, key_traffic, digits):
    from rayline.errors import ServeError
    from rayline.serve.status import gather_status

    total, errors = sum(sent.values()), sum(n for (_, c), n in sent.items() if c >= 400)
    deadline = time.monotonic() + 30  # the counts come from the same export: wait for it to settle
    while True:
        (app,) = gather_status(FILE_APP).applications
        if app.requests == total or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert (app.name, app.route, app.status, app.model, app.versions) == (FILE_APP, f"/{FILE_APP}", "RUNNING", "digits", [digits.version])
    assert (app.replicas_running, app.replicas_min, app.replicas_max) == (1, 1, 1)
    assert (app.requests, app.errors, app.rows_predicted) == (total, errors, rows_answered[0])
    with pytest.raises(ServeError, match=rf"^no Serve application named 'nope' on this cluster \(got 'nope'; running: .*{FILE_APP}"):
        gather_status("nope")


def _cli(*args, timeout=120):
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "rayline.cli", "serve", "status", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)


def test_cli_status_joins_the_running_cluster(keyfile_app, digits, tmp_path):
    import ray

    address = ray.get_runtime_context().gcs_address
    proc = _cli(FILE_APP, "--address", address, "-w", str(tmp_path), "-o", "json")
    assert proc.returncode == 0, proc.stderr
    (app,) = json.loads(proc.stdout)["applications"]
    assert (app["name"], app["model"], app["versions"], app["status"]) == (FILE_APP, "digits", [digits.version], "RUNNING")
    # Without the metrics export (Ray's labels arrive every 10 s, later under load): the replicas'
    # own record of what they load (serve/app_models.py) names them.
    from rayline.serve.status import gather_status

    (status,) = gather_status(FILE_APP, with_metrics=False).applications
    assert (status.model, status.versions) == ("digits", [digits.version])
    proc = _cli("nope", "--address", address, "-w", str(tmp_path))
    assert proc.returncode == 1 and "no Serve application named 'nope'" in proc.stderr
    # rayline's lines only (issue 38): not Ray's INFO lines about joining the cluster.
    assert proc.stderr.lstrip().startswith("error: "), proc.stderr
    for ray_line in ("Connecting to existing Ray cluster", "Connected to Ray cluster", "worker.py:"):
        assert ray_line not in proc.stderr + proc.stdout, proc.stderr


def test_cli_status_without_a_cluster_fails_fast(tmp_path):
    start = time.monotonic()
    proc = _cli("--address", "127.0.0.1:1", "-w", str(tmp_path), timeout=60)
    assert proc.returncode == 1
    assert "no Ray cluster answers at 127.0.0.1:1" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert time.monotonic() - start < 30
