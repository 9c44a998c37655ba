"""API keys, per-model Prometheus metrics and `rayline serve status` on real Serve endpoints.

The registered digits model (session fixture) is deployed twice more, as Serve applications
of their own: one with keys from a file, one with keys from an environment variable that
the replicas inherit from the Ray session (set before ray.init in conftest.py).
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

from .conftest import PORT, ROOT

FILE_APP, ENV_APP = "digits-keyfile", "digits-keyenv"
KEY = "file-key-" + secrets.token_urlsafe(24)
OTHER_KEY = "file-key-" + secrets.token_urlsafe(24)
WRONG_KEY = "file-key-" + secrets.token_urlsafe(24)
sent = Counter()  # (endpoint, code) of every request this module sends to FILE_APP
rows_answered = [0]


def _deploy(digits, ws, app, auth):
    from ray import serve

    from rayline.serve.app import build_app

    args = {"name": "digits", "version": digits.version, "workspace": str(ws.root), "tracking_uri": ws.tracking_uri_override,
            "framework": "torch", "auth": auth}
    serve.run(build_app(args), name=app, route_prefix=f"/{app}")
    return f"http://127.0.0.1:{PORT}/{app}"


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
    r = httpx.request(method, url, timeout=60, **kwargs)
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


def test_the_key_is_written_nowhere(keyfile_app):
    import ray
    from ray import serve
    from ray.serve.context import _get_global_client

    status = repr(serve.status())
    details = json.dumps(_get_global_client().get_serve_details(), default=str)  # what `serve status`/`serve config`/the dashboard show
    assert FILE_APP in details and FILE_APP in status  # the app is there; its key is not
    logs_dir = os.path.join(ray._private.worker._global_node.get_session_dir_path(), "logs")
    leaked = []
    for root, _, files in os.walk(logs_dir):
        for name in files:
            try:
                with open(os.path.join(root, name), "rb") as fh:
                    content = fh.read()
            except OSError:
                continue
            if KEY.encode() in content or OTHER_KEY.encode() in content:
                leaked.append(name)
    for text in (status, details):
        assert KEY not in text and OTHER_KEY not in text
    assert leaked == []


def test_keys_from_the_ray_nodes_environment(digits, ws, instance):
    """The variable was set before ray.init (as a user sets it before `rayline run`): the
    replica inherits it, and it is nowhere in the deployment's arguments."""
    url = _deploy(digits, ws, ENV_APP, {"api_keys_env": "RAYLINE_TEST_API_KEYS"})
    key = os.environ["RAYLINE_TEST_API_KEYS"]
    body = {"instances": [instance]}
    assert httpx.post(f"{url}/predict", json=body, timeout=60).status_code == 401
    r = httpx.post(f"{url}/predict", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60)
    assert r.status_code == 200, r.text
    from ray import serve

    serve.delete(ENV_APP)


def test_missing_keys_fail_the_deployment_naming_the_variable(ws):
    from ray import serve

    from rayline.errors import ServeError
    from rayline.serve.app import deploy
    from rayline.spec import parse_spec

    spec = parse_spec({"name": "no-keys", "data": {"source": {"format": "sklearn", "name": "iris"}, "label": "target"},
                       "model": {"framework": "torch", "kind": "mlp"},
                       "serve": {"auth": {"api_keys_env": "RAYLINE_TEST_UNSET_KEYS"}}})
    os.environ.pop("RAYLINE_TEST_UNSET_KEYS", None)
    start = time.monotonic()
    with pytest.raises(ServeError) as info:
        deploy(spec, "1", ws, "127.0.0.1", PORT)
    assert str(info.value).startswith(
        "deploying no-keys v1 at /no-keys failed: serve.auth.api_keys_env: environment variable RAYLINE_TEST_UNSET_KEYS "
        "is not set on the Ray node of this replica")
    assert time.monotonic() - start < 120
    serve.delete("no-keys")


def _exported(app):
    """rayline's samples for `app` summed over the session's nodes: {(sample name, labels...): value}."""
    import ray
    from prometheus_client.parser import text_string_to_metric_families

    found = Counter()
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        text = httpx.get(f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics", timeout=10).text
        ours = "\n".join(line for line in text.splitlines() if "rayline_" in line) + "\n"
        for family in text_string_to_metric_families(ours):
            for s in family.samples:
                if s.labels.get("application") != app:
                    continue
                key = (s.name, s.labels.get("model"), s.labels.get("version"), s.labels.get("endpoint"), s.labels.get("code"))
                found[key] += s.value
    return found


def test_metrics_per_model_and_version_match_what_was_sent(keyfile_app, digits):
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


def test_serve_status_in_process(keyfile_app, digits):
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
    proc = _cli("nope", "--address", address, "-w", str(tmp_path))
    assert proc.returncode == 1 and "no Serve application named 'nope'" in proc.stderr


def test_cli_status_without_a_cluster_fails_fast(tmp_path):
    start = time.monotonic()
    proc = _cli("--address", "127.0.0.1:1", "-w", str(tmp_path), timeout=60)
    assert proc.returncode == 1
    assert "no Ray cluster answers at 127.0.0.1:1" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert time.monotonic() - start < 30
