"""One real local Ray per test session, one workspace, one Serve HTTP port."""

import os
import signal
from pathlib import Path

import pytest
from .. import loopback

ROOT = Path(__file__).resolve().parents[2]
PORT = int(os.environ.get("RAYLINE_TEST_PORT", "8765"))
SESSION_INGRESS: dict = {}  # the session Ray's Serve ingress settings (rayline.cluster.env.serve_env), once it started


# A test run started in the background of a non-interactive shell (`pytest &`, nohup) inherits
# SIGINT ignored, and so would every `rayline` process the tests start: the Ctrl-C tests (exit
# 130, clean interrupts) need it delivered, as at a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# Two lanes (pytest-xdist, `-n 2 --dist loadgroup` in pyproject.toml): every test that needs this
# session's Ray (or its workspace, which tests share with it) runs in one worker, in collection
# order, with the one Ray of that session; the rest (unit tests, and integration tests that start
# Rays of their own in subprocesses: heads, multi-node clusters, `rayline run`, submitted jobs)
# run beside them in the other worker. Measured on the 2-core CI machine: in one process the suite
# took 34-36 min with a quarter of the CPU idle (Ray's start-ups, polls and health checks); two lanes: 25-27 min then, 29-30 min at 889 tests, 22.5 min at 944 after the one-pass data stage (2026-11-25).
# Tried and measured (2026-11-27, tests/timings.py): a second session lane (one Ray per worker, the
# digits modules in one, the modules training their own pipelines in the other, the rest one unit
# per module) was slower on a saturated 2-core box: two Rays training at once on 2 cores.
# Tried again and measured (2026-12-03, not kept): three workers (`-n 3`: the digits
# modules on one session Ray, the modules training their own pipelines on a second, the own-process
# tests beside them, unit and subprocess modules moved to even the sums out) took 27 min 8 s where two
# took 24 min 12 s: the CPU was 99% busy throughout (vmstat) and the tests' summed time rose from
# 2,815 to 4,599 s. On 2 cores the suite is CPU-bound: it gets shorter by doing less work, not by
# running more of it at once.
# Tried a third time (2026-12-06, 5db3ef4-2d00c28, reverted): a side lane of the unit tests, then the
# modules that deploy nothing on a Ray of that lane, and `rayline run` subprocess tests. Idle fell from
# 10% to 7% and runs took 0.506-0.556x of issue 36's baseline (0.545-0.557x with two lanes), but one
# of three runs failed: two Rays of two lanes starting at once on the loaded box, a `rayline run`'s
# embedded start lost its dashboard port, and its one retry timed out (the raylet's fixed 30 s).
SESSION_LANE, OWN_PROCESSES_LANE = "session-ray", "own-processes"


# The served digits endpoint (serve_digits) stays up from one module to the next while a later module of
# the session lane queries it: the modules marked DIGITS_ENDPOINT run first in that lane, one after
# another, and only the last one's teardown deletes it. Each module deployed it anew before (router,
# version and OIP replicas, the route's settle: 25-40 s a module on the loaded 2-core box).
DIGITS_ENDPOINT = "digits_endpoint"

# A module marked OWN_RAY defines its own module-scoped `ray_session` and `ws` (`yield from
# fresh_ray()`, a Serve port of its own) and runs in the other lane, beside the session's Ray: how a
# long module of the critical session lane moves to the lane with time to spare (tests/timings.py
# shows both lanes' sums).
OWN_RAY = "own_ray"

# A test marked SESSION_LANE_MARK runs in the session lane although it needs nothing of its Ray: a test
# that waits on a clock of another program (MLflow's 20-s SQLite lock wait) or drives a browser, moved
# when the other lane's sum is the longer one (tests/timings.py).
SESSION_LANE_MARK = "session_lane"


@pytest.hookimpl(tryfirst=True)  # before xdist's worker reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        if "integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
        shares_session = {"ray_session", "ws"} & set(getattr(item, "fixturenames", ())) \
            and not item.get_closest_marker(OWN_RAY) or item.get_closest_marker(SESSION_LANE_MARK)
        item.add_marker(pytest.mark.xdist_group(SESSION_LANE if shares_session else OWN_PROCESSES_LANE))
    # Stable: every other item keeps its place relative to the rest (every xdist worker sorts alike).
    # In the other lane the unit tests go first: one process on one core, beside the session lane's Ray
    # start and first trainings, where at the end they ran alone beside the session lane's waits (a
    # sweep's 45-s budget, canary windows): the box was 25-50% idle in the suite's last 4 minutes,
    # 10% before (vmstat, 2026-12-06, d4e3c8c).
    items.sort(key=lambda item: (not (_in_session_lane(item) and item.get_closest_marker(DIGITS_ENDPOINT)),
                                 not _in_session_lane(item) and "integration" in str(item.fspath)))
    endpoint_modules = [str(item.fspath) for item in items if _in_session_lane(item) and item.get_closest_marker(DIGITS_ENDPOINT)]
    config.stash[_LAST_ENDPOINT_MODULE] = endpoint_modules[-1] if endpoint_modules else None


_LAST_ENDPOINT_MODULE = pytest.StashKey[str]()


def _in_session_lane(item) -> bool:
    marker = item.get_closest_marker("xdist_group")
    return bool(marker and marker.args and marker.args[0] == SESSION_LANE)


def fresh_ray():
    """A local Ray as the suite's tests use it (a generator: the Ray, then its shutdown): the
    environment `rayline run` gives the Ray it starts, 2 logical CPUs, metrics every 2 s."""
    import ray

    from rayline.cluster.env import quiet_ray, serve_env, train_env

    quiet_ray()
    # 2 logical CPUs, as on the CI machine: the resource planner must make this fit. The
    # dashboard stays on: Ray's state API (Train's placement-group cleanup after Tune stops
    # a trial early, and the fault test's worker lookup) needs it.
    os.environ.update(train_env(single_machine=True))  # as `rayline run` does: faster report polls, no preemption watcher
    ingress_env = serve_env()
    SESSION_INGRESS.update(ingress_env)  # for tests that read this Ray's HAProxy stats (test_serving.py)
    os.environ.update(ingress_env)  # and the same Serve ingress (HAProxy unless RAYLINE_SERVE_INGRESS=proxy)
    # API keys for serve.auth.api_keys_env (test_serve_access.py): set before ray.init, the way a
    # user sets them before `rayline run`, so replicas inherit them and no runtime_env holds them.
    os.environ.setdefault("RAYLINE_TEST_API_KEYS", "test-env-key-" + os.urandom(12).hex())
    # address="local": always a new Ray of its own, never one that another `ray start` on this
    # machine recorded in /tmp/ray/ray_current_cluster (ray.init() would join that one).
    from rayline.cluster.connection import pin_state_api, stop_log_monitor

    # Ray exports metrics (Serve's and rayline's request counters: `serve status`, the canary gate, the
    # /metrics tests) every 10 s by default, and tests waited for the export; every 2 s here. Only this
    # Ray: every Ray process exports on that clock, and the suite's other Rays wait for no metric.
    ray.init(address="local", num_cpus=2, include_dashboard=True, dashboard_port=pin_state_api(None), log_to_driver=False,
             namespace="rayline-tests", _system_config={"metrics_report_interval_ms": 2000})
    stop_log_monitor()  # as rayline's embedded start does without --verbose (nothing here reads worker logs live)
    # HAProxy's state dir and stats/metrics ports are this Ray's own, and its raylet has them now.
    # Left in os.environ they would pass for a user's settings to every Ray a later test starts
    # (`ray start` heads, `rayline run` subprocesses, multi-node clusters), whose HAProxy then
    # failed to bind this one's ports ("Some protocols failed to start their listeners").
    for key in ingress_env:
        if key.startswith("RAY_SERVE_HAPROXY_"):
            os.environ.pop(key, None)
    # Likewise the state API's address (pin_state_api): this Ray's workers have it; `rayline submit`
    # and the heads later tests start must not take this Ray's dashboard for theirs.
    os.environ.pop("RAY_API_SERVER_ADDRESS", None)
    yield ray
    import shutil

    from ray import serve

    from rayline.cluster.connection import _embedded_ray_processes, forkserver_dirs

    left_behind = forkserver_dirs(_embedded_ray_processes())  # as rayline's own shutdown removes them
    serve.shutdown()
    ray.shutdown()
    for path in left_behind:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def ray_session():
    yield from fresh_ray()


@pytest.fixture(scope="module", autouse=True)
def free_serve_apps_after_module(request):
    """Delete the Serve apps a test module deployed once it is done with them.

    Their replicas hold CPUs (and autoscale up under the offline==online bursts); on a
    2-core machine later pipelines would then rightly fail fast for lack of CPUs. The digits
    endpoint's apps stay while a later module of this lane queries it (DIGITS_ENDPOINT).
    """
    yield
    import ray

    if not ray.is_initialized():
        return
    from rayline.serve.details import serve_status

    try:
        apps = list(serve_status().applications)
    except Exception:
        apps = []  # Serve never started in this session
    from rayline.serve.oip import OIP_APP

    # The shared /v2 application stays: it holds no model and 0.05 CPU, and every deploy starts it
    # when it is missing (13 starts and deletes of it in one suite run, one per module that deployed).
    keep = {OIP_APP} & set(apps)
    if request.node.get_closest_marker(DIGITS_ENDPOINT) and str(request.node.fspath) != request.config.stash.get(
            _LAST_ENDPOINT_MODULE, None):
        keep |= _endpoint_apps("digits", apps)
    apps = [a for a in apps if a not in keep]
    # All at once, waited for up to a minute (rayline's own delete: one blocking delete after another
    # took ~9 s for a module's two or three apps).
    from rayline.serve.applications import delete_apps

    delete_apps(apps, timeout_s=60)
    apps = [a for a in serve_status().applications if a in apps]
    assert not apps, f"Serve apps still being deleted a minute later: {apps}"
    _wait_for_free_cpus(keep)


def _endpoint_apps(name: str, apps) -> set:
    """The Serve apps of model `name`'s endpoint as rayline.serve.versions.deploy starts them: its
    router, the versions its table routes to, its own V2 app and the shared /v2 app."""
    from rayline.serve.oip import OIP_APP
    from rayline.serve.router import oip_app
    from rayline.serve.routing_table import rollout_state

    table = rollout_state(name) or {}
    wanted = {name, oip_app(name), OIP_APP, *(f"{name}-v{v}" for v in table.get("weights") or ())}
    return wanted & set(apps)


def _held_by(apps: set) -> float:
    """Logical CPUs the replicas of `apps` reserve now (autoscaling changes it)."""
    from rayline.serve.details import serve_details

    held = 0.0
    for name, app in (serve_details().get("applications") or {}).items():
        if name not in apps:
            continue
        for deployment in (app.get("deployments") or {}).values():
            options = (deployment.get("deployment_config") or {}).get("ray_actor_options") or {}
            live = [r for r in deployment.get("replicas") or () if not str(r.get("state")).endswith("STOPPING")]
            held += float(options.get("num_cpus") or 0) * len(live)
    return held


def _wait_for_free_cpus(kept_apps: set = frozenset(), timeout_s: float = 60.0) -> None:
    """Until every logical CPU is free again, but those the replicas of `kept_apps` reserve; an
    error naming what holds them after `timeout_s`.

    A deleted app's replicas give their CPUs back some seconds after `serve.delete`. Anything
    still held a minute later is a leak of the module just run, and it fails there: a killed
    Train controller's placement group (rayline/cluster/orphans.py) once held 0.99 of the 2 CPUs
    unnoticed, and the rest of that CI session hung and crawled.
    """
    import time

    import ray

    from rayline.cluster.orphans import orphaned_placement_groups

    deadline = time.monotonic() + timeout_s
    total = ray.cluster_resources().get("CPU", 0)
    while ray.available_resources().get("CPU", 0) < total - (_held_by(kept_apps) if kept_apps else 0.0) - 0.05:
        if time.monotonic() > deadline:
            held = {k: v for k, v in ray.available_resources().items() if "CPU" in k}
            raise AssertionError(f"CPUs still held {timeout_s:g} s after the module: available {held} of {total:g} "
                                 f"(kept: {sorted(kept_apps)}); orphaned placement groups: {orphaned_placement_groups()}")
        time.sleep(0.5)


@pytest.fixture(scope="session")
def ws(tmp_path_factory):
    from rayline.workspace import workspace

    return workspace(tmp_path_factory.mktemp("workspace")).ensure()


def pipeline_script(name):
    """A data-making script of pipelines/ (make_digit_images, make_tickets) imported as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "pipelines" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(spec, ws, own_v2: bool = False, **kwargs):
    """`rayline run`'s pipeline (run_pipeline) in this process, on this session's Ray; the summary with its
    stage events. `own_v2`: deploy the model's own V2 application (serve.oip, on by default in a spec).
    Without it, none: its replicas load the model like the route's (a replica start, a model load and an
    ingress reload more per run) and /v2 still answers through the shared rayline-v2 application. The
    default is deployed and queried where it is the subject: test_oip, test_export, test_images,
    test_serving, and the own-process runs of test_cluster (the quick start; `serve deploy` of an exported
    config)."""
    from rayline.pipeline.run import run_pipeline

    # The session's tests share one workspace: with its data cache on, a test's data stage could be
    # another test's, read back (the key is the data section, not the pipeline's name), and the test
    # would not see the stage it is about. Each computes its own; the cache's tests turn it on.
    kwargs.setdefault("data_cache", False)
    kwargs.setdefault("port", PORT)
    if spec.serve is not None and not own_v2:
        spec = spec.model_copy(update={"serve": spec.serve.model_copy(update={"oip": False})})
    events = []
    summary = run_pipeline(spec, ws, on_stage=lambda *e: events.append(e), **kwargs)
    summary.events = events
    return summary


def metrics_by_in_memory(spec, data, settings=("always", "never")) -> dict:
    """{train.in_memory setting: the final metrics} of `spec`'s torch loop on `data` (PreparedData), each
    run in Ray Train's local mode (the loop in this process) on the data stage's splits as Ray Data datasets."""
    import ray.train
    from ray.train.torch import TorchTrainer

    from rayline.pipeline.training import plan_training
    from rayline.spec import apply_overrides
    from rayline.train.run import datasets_of, loop_config
    from rayline.train.torch_backend import BACKEND

    final = {}
    for setting in settings:
        config = loop_config(apply_overrides(spec, {"train.in_memory": setting}), data, plan_training(spec), [])
        trainer = TorchTrainer(BACKEND.train_loop, train_loop_config=config, datasets=datasets_of(data),
                               scaling_config=ray.train.ScalingConfig(num_workers=0))  # local mode
        final[setting] = trainer.fit().metrics
    return final


@pytest.fixture(scope="session")
def digits(ray_session, ws):
    """The reference digits pipeline with a small sweep (2 trials, 5 epochs), served. One worker per
    trial: each trains in its trial's process (train.in_process), 13 s for the sweep against 41 s on
    two workers each (idle 2-core box, 2026-11-29). DDP in a sweep is the precision sweep's
    (test_training_techniques.py: PowerSGD keeps its 2-worker groups; the README quick start's 2 workers
    train as one process, rayline/train/in_process.py); this lane's first worker-group run is
    test_csv_and_faults.py's churn (FSDP, 2 workers)."""
    from rayline.spec import apply_overrides, load_spec

    path = ROOT / "pipelines" / "digits-torch.yaml"
    spec = apply_overrides(load_spec(path), {"tune.num_samples": 2, "train.epochs": 5, "train.workers": 1})
    return run(spec, ws, spec_path=str(path))


def deploy_registered(app_name, summary, ws, route=None, **settings):
    """Deploy the registered model of a pipeline `summary` as Serve app `app_name`; wait until it answers."""
    from ray import serve

    from rayline.serve.app import build_app

    route = route or f"/{app_name}"
    args = {"name": summary.name, "version": summary.version, "workspace": str(ws.root), "framework": "torch", **settings}
    serve.run(build_app(args), name=app_name, route_prefix=route, blocking=False)
    url = f"http://127.0.0.1:{PORT}{route}"
    wait_for_200(f"{url}/health", what=app_name)
    return url


def wait_for_200(url, timeout_s=90, what=None):
    """Until GET `url` answers 200 (an application answers a moment after it is deployed); an
    AssertionError naming `what` (default: the URL) after `timeout_s`."""
    import time

    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if loopback.get(url, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"{what or url} did not answer within {timeout_s} s")


def ensure_served(summary, ws, **settings):
    """The pipeline's own endpoint as `rayline run` deployed it: the model's router at its route and
    version N's application at ROUTE/v/N, started by rayline.serve.versions.deploy (the function
    `rayline run` calls), so tests cross the deployed route, never a stand-in. Redeployed that way
    (same version, name and route) when an earlier module's teardown deleted it
    (`free_serve_apps_after_module`), or when another version answers the route: tests must not
    depend on order. `settings`: the serve spec's keys (replicas, ...)."""
    from urllib.parse import urlparse

    import httpx

    from rayline.serve import versions
    from rayline.serve.applications import delete_apps, serve_apps
    from rayline.serve.routing_table import rollout_state
    from rayline.spec import ServeSpec

    route = urlparse(summary.endpoint).path
    # The model's own V2 application (serve.oip) only where a test calls /v2 (test_oip passes
    # oip=True): its replicas reserve CPUs like the route's, and a module's apps share 2 logical CPUs.
    settings.setdefault("oip", False)
    serve_spec = ServeSpec(route=route, **settings)
    table = rollout_state(summary.name) or {}
    try:
        meta = loopback.get(f"{summary.endpoint}/metadata", timeout=10)
        if (meta.status_code == 200 and meta.json().get("version") == str(summary.version)
                and table.get("serve") == serve_spec.model_dump(exclude={"route", "canary"})):
            return summary.endpoint
    except httpx.HTTPError:
        pass
    if table:  # served with other settings (an earlier module's): a running version keeps its own, so anew
        delete_apps(sorted(_endpoint_apps(summary.name, serve_apps())))
    rollout = versions.deploy(summary.name, summary.version, ws=ws, serve_spec=serve_spec, port=PORT)
    assert rollout.url == summary.endpoint and rollout.champion == str(summary.version), (rollout, summary.endpoint)
    _wait_answering(rollout.url, str(summary.version))
    return rollout.url


# pipelines/digits-torch.yaml's serve section: every module that queries the digits endpoint asks for
# the same, so that one deployment serves them all (DIGITS_ENDPOINT): the one the `digits` fixture's run
# deployed (run() leaves out the model's own V2 application), so the first module finds it up. No V2
# application of the model's own (test_oip asks for one): its replica would hold a quarter of a CPU
# more while those modules train (test_pyfunc) and score on the session Ray (test_batch_scoring).
DIGITS_SERVE = {"replicas": {"min": 1, "max": 2, "target_ongoing_requests": 2}, "oip": False}


def serve_digits(digits, ws, **settings):
    """The session's digits endpoint (the `digits` fixture's), served as `rayline run` serves it."""
    return ensure_served(digits, ws, **{**DIGITS_SERVE, **settings})


def _wait_answering(url, version, timeout_s=90):
    """Until the route answers /health and its /metadata names `version`."""
    import time

    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if (loopback.get(f"{url}/health", timeout=5).status_code == 200
                    and loopback.get(f"{url}/metadata", timeout=5).json().get("version") == version):
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"{url} did not answer as version {version} within {timeout_s} s")
