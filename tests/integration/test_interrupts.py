"""Interrupted and impossible sweeps at runtime: Ctrl-C, --resume, placement deadlines, ASHA's clock.

The Ctrl-C tests run the real `rayline run` in a subprocess (its own embedded Ray and
workspace) and send it SIGINT once training has written checkpoints; the others use the
session's Ray. Data: sklearn iris with xgboost (1 worker, tiny boosters) so every run is
a few seconds of training on top of Ray's start-up. Ctrl-C during a sweep, and a sweep whose
driver is killed outright, are in test_resume.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from tests.cli import rayline
from tests.integration.conftest import PORT, run

IRIS = {"format": "sklearn", "name": "iris"}
# 30 reports of a 60-round booster: long enough to be interrupted mid-way, short to resume.
BOOSTER = {"max_depth": 2, "eta": 0.05, "num_boost_round": 60, "checkpoint_every": 2, "early_stopping_rounds": 0}


def _spec(name: str, *, tune: dict | None = None, params: dict | None = None, serve: bool = False, **train) -> dict:
    raw = {
        "name": name,
        "data": {"source": IRIS, "label": "target", "split": {"valid": 0.2, "test": 0.2, "seed": 0}},
        "task": "classification",
        "model": {"framework": "xgboost", "kind": "gbdt", "params": params or dict(BOOSTER)},
        "train": {"workers": 1, "metric": "log_loss", **train},
    }
    if tune:
        raw["tune"] = tune
    if serve:
        raw["serve"] = {"route": f"/{name}"}
    return raw


def _write(tmp_path: Path, raw: dict) -> Path:
    path = tmp_path / f"{raw['name']}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _env() -> dict:
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)  # an embedded Ray of its own, never the test session's
    return env


def _descendants(pid: int) -> set[int]:
    import psutil

    try:
        return {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        return set()


def _alive(pids: set[int]) -> list[str]:
    import psutil

    alive = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            if proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(f"{pid} {' '.join(proc.cmdline())[:120]}")
        except psutil.Error:
            pass
    return alive


def _interrupt_when(cmd: list[str], cwd: Path, ready, timeout_s: float = 150.0, *, sigterm: bool = False, during=None):
    """Start `cmd`, send SIGINT once `ready()` is true; return (returncode, stdout, stderr, every descendant seen).
    `sigterm`: SIGTERM to the command's process alone instead, as `docker stop` and Kubernetes send it to
    the container's main process. `during(proc)`: called once ready, before the signal (and its result
    is handed back as a fifth value)."""
    out, err = cwd / "stdout.txt", cwd / "stderr.txt"
    with open(out, "w") as fo, open(err, "w") as fe:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=fo, stderr=fe, env=_env(), start_new_session=True)
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + timeout_s
        while not ready():
            assert proc.poll() is None, f"ended before it could be interrupted: {err.read_text()[-2000:]}"
            assert time.monotonic() < deadline, f"training never started within {timeout_s:.0f} s"
            seen |= _descendants(proc.pid)
            time.sleep(0.25)
        seen |= _descendants(proc.pid)
        extra = during() if during else None
        sent = time.monotonic()
        if sigterm:
            proc.send_signal(signal.SIGTERM)
        else:
            os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole foreground process group
        rc = proc.wait(timeout=90)
        assert time.monotonic() - sent < 60, "the signal took over a minute to take effect"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if during:
        return rc, out.read_text(), err.read_text(), seen, extra
    return rc, out.read_text(), err.read_text(), seen


def _assert_no_leftovers(pids: set[int], grace_s: float = 30.0) -> None:
    deadline = time.monotonic() + grace_s
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _alive(pids), f"processes of the interrupted run still alive: {_alive(pids)}"


def _mlflow(ws: Path):
    from mlflow.tracking import MlflowClient

    from rayline.workspace import workspace

    uri = workspace(ws).tracking_uri
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def _pipeline_runs(client, name: str) -> list:
    exp = client.get_experiment_by_name(f"rayline/{name}")
    assert exp is not None
    runs = client.search_runs([exp.experiment_id], filter_string="tags.`rayline.kind` = 'pipeline'")
    return sorted(runs, key=lambda r: r.info.start_time)


def _checkpoints(ws: Path, pattern: str) -> int:
    return len(list((ws / "runs").glob(pattern)))


def _one_line(stderr: str) -> str:
    return " ".join(line.strip() for line in stderr.splitlines())


def _squeezed(text: str) -> str:
    return "".join(text.split())  # the terminal may wrap a long path anywhere


class _Traffic:
    """One-row predictions sent back to back from a thread until the endpoint stops answering."""

    def __init__(self, url: str):
        self.url, self.codes, self.refused = url, [], 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._send, daemon=True)

    def _send(self):
        import httpx

        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                try:
                    self.codes.append(client.post(f"{self.url}/predict", json={"instances": [[5.1, 3.5, 1.4, 0.2]]}).status_code)
                except httpx.HTTPError:
                    self.refused += 1
                    if self.refused > 20:
                        return
                    time.sleep(0.05)

    def start(self):
        self._thread.start()
        deadline = time.monotonic() + 30
        while len(self.codes) < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        return self

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=30)


def test_ctrl_c_during_training_registers_nothing_and_resume_finishes_it(tmp_path):
    """...and SIGTERM of the resumed run while it serves (what `docker stop` and Kubernetes send) drains
    it: every answered request a 200, exit 0 with one line, no stack dump, no Ray process of it left."""
    from rayline.ports import free_port

    raw = _spec("irisplain", serve=True)
    raw["serve"]["oip"] = False  # no V2 application of the model's own: one replica more to drain, not the subject
    spec = _write(tmp_path, raw)
    ws = tmp_path / "ws"
    cmd = [sys.executable, "-m", "rayline.cli", "run", str(spec), "--workspace", str(ws), "--no-serve"]

    # Before: Ray Train's own SIGINT handler aborted the run and exited 0, or fit returned
    # and the half-trained model was registered.
    rc, out, err, seen = _interrupt_when(cmd, tmp_path, lambda: _checkpoints(ws, "*/train/checkpoint_*") >= 1)

    assert rc == 130, err[-3000:]
    assert "Traceback" not in err + out
    line = _one_line(err)
    assert "training interrupted" in line and "nothing registered" in line and "--resume" in line
    client = _mlflow(ws)
    assert client.search_model_versions("name='irisplain'") == []
    assert [r.info.status for r in _pipeline_runs(client, "irisplain")] == ["KILLED"]
    _assert_no_leftovers(seen)

    port = free_port()
    resumed = [sys.executable, "-m", "rayline.cli", "run", str(spec), "--workspace", str(ws), "--resume",
               "--port", str(port)]
    url = f"http://127.0.0.1:{port}/irisplain"
    traffic = _Traffic(url)
    rc, out, err, seen, _ = _interrupt_when(resumed, tmp_path, lambda: "Serving " in (tmp_path / "stdout.txt").read_text(),
                                            timeout_s=240, sigterm=True, during=traffic.start)
    traffic.stop()
    assert rc == 0, err[-3000:]
    assert len(client.search_model_versions("name='irisplain'")) == 1
    assert "resumed the interrupted run irisplain-" in out, out
    # Before: Ray's C++ handler printed "*** SIGTERM received ... PC: @ ... clock_nanosleep" and the
    # process died without stopping Serve; the agents lived on for about a minute.
    assert "SIGTERM received" not in err + out and "PC: @" not in err + out and "Traceback" not in err + out, err[-3000:]
    stops = [line for line in out.splitlines() if line.startswith("SIGTERM: stopping")]
    assert len(stops) == 1 and url in _squeezed(out[out.index("SIGTERM: stopping"):]), out[-2000:]
    assert len(traffic.codes) >= 20 and set(traffic.codes) == {200}, (len(traffic.codes), set(traffic.codes))
    _assert_no_leftovers(seen, grace_s=10.0)


def test_resume_without_an_interrupted_run_or_with_a_changed_spec_is_refused(tmp_path, ray_session, ws):
    from rayline.errors import RaylineError, SpecError
    from rayline.pipeline.record import RECORD_FILE, write_record, training_spec
    from rayline.pipeline.run import run_pipeline
    from rayline.spec import parse_spec

    spec = parse_spec(_spec("irisnothing"))
    with pytest.raises(RaylineError, match=r"^--resume: no interrupted run of 'irisnothing' in .*run without --resume"):
        run_pipeline(spec, ws, resume=True, deploy=False)
    folder = Path(ws.runs_dir) / "irisnothing-old"
    write_record(str(folder), {"experiment": "irisnothing-old", "spec_name": "irisnothing", "status": "interrupted",
                                "spec": training_spec(spec), "created": 1.0})
    assert (folder / RECORD_FILE).exists()
    changed = parse_spec(_spec("irisnothing", params={**BOOSTER, "eta": 0.3}))
    with pytest.raises(SpecError, match=r"--resume: the spec changed since the interrupted run irisnothing-old: "
                                        r"model.params.eta \(was 0.05, now 0.3\)"):
        run_pipeline(changed, ws, resume=True, deploy=False)


def test_ctrl_c_while_deploying_keeps_the_version_and_leaves_no_app(ray_session, ws):
    from ray import serve

    from rayline.errors import InterruptedRun
    from rayline.registry import Registry
    from rayline.spec import parse_spec

    spec = parse_spec(_spec("irisdeploy", params={**BOOSTER, "num_boost_round": 4}, serve=True))
    returned = threading.Event()

    def ctrl_c_once_the_replica_is_starting():
        # Ctrl-C once Serve has created the app's replica actor, before it is ready (it
        # still downloads and loads the model): the app exists, half-deployed.
        import ray

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not returned.is_set():
            names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
            if any("irisdeploy" in n for n in names):
                if not returned.is_set():
                    os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.05)

    def on_stage(stage, event, detail=""):
        if (stage, event) == ("deploy", "start"):
            threading.Thread(target=ctrl_c_once_the_replica_is_starting, daemon=True).start()

    from rayline.pipeline.run import run_pipeline

    try:
        with pytest.raises(InterruptedRun, match=r"^interrupted while deploying: model irisdeploy version \d+ stays "
                                                 r"registered .*the half-deployed Serve app 'irisdeploy' was deleted"):
            run_pipeline(spec, ws, port=PORT, on_stage=on_stage)
    finally:
        returned.set()
    assert "irisdeploy" not in serve.status().applications
    assert Registry(ws).resolve("irisdeploy").version


def test_a_sweep_that_can_never_fit_fails_before_training(ray_session, ws, tmp_path):
    """`rayline run` (in this process, on the session's Ray) refuses the sweep before anything starts:
    exit 3 (a resource error) and one line naming the key and what the cluster has."""
    path = _write(tmp_path, _spec("iriswide", tune={"num_samples": 2, "space": {"train.workers": {"choice": [1, 64]}}}))
    started = time.monotonic()
    done = rayline("run", path, "--workspace", ws.root, "--no-serve", extra_env={"COLUMNS": "1000"})
    assert time.monotonic() - started < 60
    assert done.returncode == 3, (done.returncode, done.stdout, done.stderr)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: tune.space.train.workers: 64 workers need at least 6.4 CPUs"), \
        done.stderr
    assert "Traceback" not in done.stderr
    assert not list(Path(ws.runs_dir).glob("iriswide-*"))  # nothing started


@pytest.mark.timeout(180)  # without the deadline Train retried the start-up forever: fail, not hang
def test_workers_that_cannot_be_placed_fail_within_the_deadline(ray_session, ws, monkeypatch):
    import ray

    from rayline.errors import TrainingError
    from rayline.train.resources import ResourcePlan
    from rayline.spec import parse_spec
    from rayline.train.run import START_RETRIES, train

    monkeypatch.setenv("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "5")  # reaches the Train controller
    spec = parse_spec(_spec("irisblocked", in_process="never"))  # a worker group, which must be placed
    from rayline.data import prepare_data

    data = prepare_data(spec)

    @ray.remote
    class Holder:
        def ready(self):
            return True

    # Planned while the CPUs were free; then another job takes them: nothing the plan can see.
    plan = ResourcePlan(cpus_per_worker=1.0, gpus_per_worker=0, concurrent_trials=1, threads_per_worker=1)
    # All CPUs but half of one (the actor waits until they are free): the worker's 1 CPU never is.
    holder = Holder.options(num_cpus=ray.cluster_resources()["CPU"] - 0.5).remote()
    try:
        ray.get(holder.ready.remote(), timeout=120)
        assert ray.available_resources().get("CPU", 0) < 1.0
        started = time.monotonic()
        with pytest.raises(TrainingError, match=r"^train.workers: the 1 training workers \(1 CPU each\) could not be "
                                                rf"placed: waited {START_RETRIES + 1} x 5 s for 1 CPU; the cluster has CPU"):
            train(spec, data, storage_path=str(Path(ws.runs_dir) / "irisblocked"), run_name="train", plan=plan)
        assert time.monotonic() - started < 60
    finally:
        ray.kill(holder)


def test_xgboost_under_asha_trains_every_round_of_its_winner(ray_session, ws, monkeypatch):
    """Also: a Tune driver slow to take a trial's next result (a loaded machine) still gets the
    trial's last one. With Ray's TuneReportCallback the last report, left in its queue while the
    Train run ended, deadlocked the trial actor and the sweep hung (a CI run: 900 s); the Tune
    driver is made slow here right before the winner's last report (rayline/tune/relay.py)."""
    from rayline.cluster.orphans import ReleaseOrphansCallback
    from rayline.spec import parse_spec

    slowed = []

    def slow_before_the_last_report(self, iteration, trials, trial, result, **info):
        if result.get("epoch") == 26 and not slowed:  # reports at rounds 2, 5, ..., 29
            slowed.append(trial.trial_id)
            time.sleep(4)  # the Train run reports round 29 and ends meanwhile

    monkeypatch.setattr(ReleaseOrphansCallback, "on_trial_result", slow_before_the_last_report, raising=False)
    # 30 rounds reported every 3; train.epochs 4. Before: ASHA's max_t was 4 *reports*, so
    # every trial stopped at round 12. The stronger learning rate leads at every rung.
    raw = _spec("irisasha", params={**BOOSTER, "num_boost_round": 30, "checkpoint_every": 3}, epochs=4,
                tune={"search": "grid", "scheduler": "asha", "max_concurrent": 2,
                      "space": {"model.params.eta": {"grid": [0.02, 0.3]}}})
    summary = run(parse_spec(raw), ws, deploy=False)
    assert slowed, "no trial reached round 26: the slow driver was never exercised"
    winner = next(t for t in summary.trials if t.result is not None and t.overrides["model.params.eta"] == 0.3)
    assert summary.valid_metrics == winner.result.metrics
    assert [row["epoch"] for row in winner.result.history] == list(range(2, 30, 3))
