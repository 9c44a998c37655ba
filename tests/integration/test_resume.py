"""A sweep whose driver was SIGKILLed mid-way, then Ctrl-C'd, resumes to the same result.

The real `rayline run` runs in a subprocess with its own embedded Ray and workspace; once a
short trial has finished and the trial started after it has begun, the driver alone gets
SIGKILL (no chance to write anything). `rayline run SPEC --resume` continues it and gets
Ctrl-C (exit 130, nothing registered, both ways to resume named), and `rayline resume RUN_ID`
with the id that message printed finishes it. Data: sklearn iris with xgboost (1 worker, tiny
boosters), so training is seconds on top of Ray's start-up.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.integration.restore_evidence import assert_restored, copy_checkpoints
from tests.integration.test_interrupts import (BOOSTER, IRIS, _assert_no_leftovers, _descendants, _env, _interrupt_when,
                                               _mlflow, _one_line, _pipeline_runs, _squeezed)
from tests.integration.test_interrupts import _alive as _alive_pids

_AGENTS = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")


def _alive(pids: set[int], but: tuple[str, ...] = ()) -> list[str]:
    return [p for p in _alive_pids(pids) if not any(name in p for name in but)]


# Three trials of different lengths (rounds reported every 2): the short one finishes while
# the long one is mid-way; the third starts only after the short one ends (2 at once). Measured
# loaded: a Train run's start-up took up to 50 s, then 40 rounds 12 s; on another loaded box
# 2 rounds took 0.17 s, and 120 long rounds (10 s) ended before the third trial had started.
# 300 rounds keep the long trial going through the third's start-up on either (idle, with 400:
# killed after 72 s, the resumed phases 76 s and 106 s).
ROUNDS = [4, 300, 10]


def _spec(name: str) -> dict:
    return {
        "name": name,
        "data": {"source": IRIS, "label": "target", "split": {"valid": 0.2, "test": 0.2, "seed": 0}},
        "task": "classification",
        "model": {"framework": "xgboost", "kind": "gbdt", "params": dict(BOOSTER)},
        "train": {"workers": 1, "metric": "log_loss"},
        "tune": {"search": "random", "num_samples": 1, "max_concurrent": 2, "scheduler": "fifo",
                 "space": {"model.params.num_boost_round": {"grid": ROUNDS},
                           "model.params.eta": {"loguniform": [0.05, 0.3]}}},
    }


def _states(ws: Path, trial_dir: Path) -> dict[int, float]:
    """A Train run's checkpoints: {epoch: mtime of its state file}."""
    from rayline.train.loop import STATE_FILE, read_state

    out = {}
    for ckpt in trial_dir.glob("checkpoint_*"):
        state = read_state(str(ckpt))
        try:
            if state:
                out[state["epoch"]] = (ckpt / STATE_FILE).stat().st_mtime
        except FileNotFoundError:
            continue  # Ray Train deleted this older checkpoint between the read and the stat (checkpoint_keep)
    return out


def _registered_epoch(trial_dir: Path) -> int:
    """The epoch of the newest checkpoint Ray Train registered for a run (what it restores from)."""
    from rayline.train.loop import read_state

    snapshot = json.loads((trial_dir / "checkpoint_manager_snapshot.json").read_text())
    return read_state(str(trial_dir / snapshot["latest_checkpoint_result"]["checkpoint_dir_name"]))["epoch"]


def _saved_trials(ws: Path) -> dict[str, dict]:
    """Tune's saved sweep state (what Tuner.restore reads): trial id -> its saved state."""
    (state_file,) = (ws / "runs").glob("*-tune/experiment_state-*.json")
    data = json.loads(state_file.read_text())
    trials = {}
    for state_json, _metadata in data["trial_data"]:
        state = json.loads(state_json)
        trials[state["trial_id"]] = state
    return trials


def _expected_configs(spec) -> list[dict]:
    """The configurations an uninterrupted sweep draws: Tune's generator with the same space and seed."""
    from ray.tune.experiment import Experiment
    from ray.tune.search import BasicVariantGenerator

    from rayline.tune.sweep import search_space

    gen = BasicVariantGenerator(random_state=spec.data.split.seed)
    gen.add_configurations([Experiment(name="expected", run=lambda config: None, config=search_space(spec),
                                       num_samples=spec.tune.num_samples, storage_path=str(Path.cwd() / ".expected"))])
    configs = []
    while (trial := gen.next_trial()) is not None:
        configs.append(trial.config)
    return configs


@pytest.mark.timeout(600)
def test_a_sweep_killed_then_interrupted_resumes_keeping_finished_trials(tmp_path, monkeypatch):
    from rayline.spec import parse_spec
    from rayline.train.loop import read_state

    raw = _spec("irisresume")
    path = tmp_path / "irisresume.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    ws = tmp_path / "ws"
    cmd = [sys.executable, "-m", "rayline.cli", "run", str(path), "--workspace", str(ws), "--no-serve"]
    runs = ws / "runs"

    def trial_dirs() -> list[Path]:
        return [d for d in runs.glob("*/trial-*") if d.is_dir()]

    # Tune numbers the trials in the order its generator draws them (_00000, _00001, ...): each trial's
    # suffix names its length. Never told apart by how far their checkpoints got: under load the long
    # trial was once at the short one's last epoch (3) when the third had already ended (CI of 605d2ab).
    suffix = {c["model.params.num_boost_round"]: f"_{i:05d}" for i, c in enumerate(_expected_configs(parse_spec(raw)))}
    short_suffix, long_suffix = suffix[ROUNDS[0]], suffix[ROUNDS[1]]

    def epochs_of(trial_suffix: str) -> list[int]:
        return [max(_states(ws, d), default=-1) for d in trial_dirs() if d.name.endswith(trial_suffix)]

    def short_finished_and_next_started() -> bool:
        """... and the long trial is past its first checkpoint (on a loaded machine its Train run
        starts up to a minute late, and the third trial can start before it checkpoints once)."""
        long_epochs = epochs_of(long_suffix)
        assert not any(e == ROUNDS[1] - 1 for e in long_epochs), \
            "the long trial finished before the short one had ended and the third started (make ROUNDS[1] longer)"
        return (len(trial_dirs()) >= 3 and ROUNDS[0] - 1 in epochs_of(short_suffix)
                and any(e > 0 for e in long_epochs))

    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    started = time.monotonic()
    with open(out, "w") as fo, open(err, "w") as fe:
        # Tune saves the sweep's state at most every TUNE_GLOBAL_CHECKPOINT_S (default at least 10 s):
        # an hour here opens wide the window a killed driver falls into by chance, so the check of
        # the short trial's saved status below fails without rayline's save at each trial's end.
        proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=fo, stderr=fe, env={**_env(), "TUNE_GLOBAL_CHECKPOINT_S": "3600"},
                                start_new_session=True)
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 240
        while not short_finished_and_next_started():
            assert proc.poll() is None, f"ended before it could be killed: {err.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "the third trial never started within 240 s"
            seen |= _descendants(proc.pid)
            time.sleep(0.2)
        seen |= _descendants(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)  # the driver alone, as the OOM killer would
        proc.wait(timeout=30)
        killed_at = time.monotonic()
        killed_after = killed_at - started
        # The embedded Ray shares the driver's fate: GCS, raylet, dashboard, workers, trial actors and
        # Train workers end within seconds. Ray's two node agents notice the raylet's death at once
        # but first try to report it to the dead GCS, which times out after a minute (measured: a bare
        # ray.init() driver SIGKILLed, its agents exited after 60-65 s): they are checked after resuming.
        # Waited for, not timed: under load (load average 10 on 2 cores) two orphaned workers were
        # still exiting 30 s after the kill. 90 s is the bound the whole run's processes get below.
        grace = killed_at + 90
        while _alive(seen, but=_AGENTS) and time.monotonic() < grace:
            time.sleep(0.5)
        assert not _alive(seen, but=_AGENTS), f"processes of the killed run still alive: {_alive(seen, but=_AGENTS)}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in _alive(seen, but=_AGENTS):  # never left behind for the next test, even when the assert failed
            try:
                os.kill(int(pid.split()[0]), signal.SIGKILL)
            except OSError:
                pass

    # Nothing of the killed run is left to write or delete a checkpoint: the ones the resume restores are here.
    copies: dict[str, dict[str, str]] = {}

    def copy_all(phase: str) -> None:
        for d in trial_dirs():
            copies.setdefault(d.name, {}).update(copy_checkpoints(str(d), str(tmp_path / phase / d.name)))

    copy_all("killed")

    client = _mlflow(ws)
    (killed,) = _pipeline_runs(client, "irisresume")
    assert killed.info.status == "RUNNING"  # nobody was left to end it
    (record_file,) = runs.glob("*/rayline-run.json")
    record = json.loads(record_file.read_text())
    assert record["status"] == "running" and record["driver"]["pid"] == proc.pid

    # The short trial's end was saved before the next trial started (rayline.tune.resume.SaveOnTrialEnd):
    # Tune's own period (10 s or more) would still show it RUNNING, and resume would run it again.
    saved = _saved_trials(ws)
    by_dir = {d.name.removeprefix("trial-"): d for d in trial_dirs()}
    (short_id,) = [t for t in by_dir if t.endswith(short_suffix)]
    assert max(_states(ws, by_dir[short_id])) == ROUNDS[0] - 1
    assert saved[short_id]["status"] == "TERMINATED", {t: s["status"] for t, s in saved.items()}
    short_before = _states(ws, by_dir[short_id])
    (long_id,) = [t for t in by_dir if t.endswith(long_suffix)]
    assert saved[long_id]["config"]["model.params.num_boost_round"] == ROUNDS[1]
    assert 0 < max(_states(ws, by_dir[long_id]), default=-1) < ROUNDS[1] - 1, "the long trial was not mid-way when killed"
    long_before = _registered_epoch(by_dir[long_id])

    # `rayline run SPEC --resume` finds the killed run (its driver is gone), then gets Ctrl-C once the
    # long trial has trained on from its checkpoint (a checkpoint that says it resumed).
    def long_trial_resumed() -> bool:
        from rayline.train.loop import read_state

        return any((read_state(str(c)) or {}).get("resumed_from") for c in by_dir[long_id].glob("checkpoint_*"))

    phase2 = time.monotonic()
    rc, out2, err2, seen2 = _interrupt_when(cmd + ["--resume"], tmp_path, long_trial_resumed, timeout_s=240)
    phase2 = time.monotonic() - phase2
    assert rc == 130, err2[-3000:]
    assert "Traceback" not in err2 + out2
    line = _one_line(err2)
    assert "tuning interrupted" in line and "nothing registered" in line
    assert "Tuner.restore(" not in line  # Tune's own advice is for Python users; ours names the commands
    assert _squeezed(f"resume with: rayline run {path} --workspace {ws} --no-serve --resume") in _squeezed(err2)
    printed = re.search(r"\(or:raylineresume([0-9a-f]+)--workspace", _squeezed(err2))  # the run id it printed
    assert printed and _squeezed(f"--workspace{ws})") in _squeezed(err2), err2[-2000:]
    assert client.search_model_versions("name='irisresume'") == []
    first, interrupted = _pipeline_runs(client, "irisresume")
    assert (first.info.status, interrupted.info.status) == ("KILLED", "KILLED")  # the killed driver's run ended too
    assert printed.group(1) == interrupted.info.run_id
    _assert_no_leftovers(seen2)
    long_then = _registered_epoch(by_dir[long_id])
    copy_all("interrupted")

    phase3 = time.monotonic()
    resumed = subprocess.run([sys.executable, "-m", "rayline.cli", "resume", printed.group(1), "--workspace", str(ws),
                              "--no-serve"], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=240)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Traceback" not in resumed.stderr + resumed.stdout
    phase3 = time.monotonic() - phase3

    runs_now = _pipeline_runs(client, "irisresume")
    assert [r.info.status for r in runs_now] == ["KILLED", "KILLED", "FINISHED"]
    assert runs_now[1].data.tags["rayline.resumed_from"] == killed.info.run_id
    assert runs_now[2].data.tags["rayline.resumed_from"] == interrupted.info.run_id
    runs_now = [runs_now[0], runs_now[2]]  # below: the killed run and the one that finished
    (version,) = client.search_model_versions("name='irisresume'")
    assert version.run_id == runs_now[1].info.run_id
    # The killed run had stored its data stage in the workspace's data cache before training: the
    # resume read it back, and the version names the entry it was trained from.
    assert re.search(r"^data: done in [0-9.]+ s: .*, cached \(", resumed.stdout, re.M), resumed.stdout[-3000:]
    (key,) = json.loads(record_file.read_text())["data_cache_keys"]
    assert version.tags["data_cache_key"] == key and (ws / "data-cache" / key / "meta.json").is_file()

    # Finished trial kept: not trained again (same checkpoints, untouched files).
    assert _states(ws, by_dir[short_id]) == short_before
    # Unfinished trials kept their ids and continued from their last checkpoint to the end.
    final_dirs = {d.name.removeprefix("trial-"): d for d in trial_dirs()}
    assert set(by_dir) <= set(final_dirs) and len(final_dirs) == len(ROUNDS)
    states = {t: [read_state(str(c)) for c in d.glob("checkpoint_*")] for t, d in final_dirs.items()}
    last = {t: max((s for s in ss if s), key=lambda s: s["epoch"]) for t, ss in states.items()}
    assert last[long_id]["epoch"] == ROUNDS[1] - 1
    assert last[long_id]["resumed_from"] == [long_before, long_then], (long_before, long_then, last[long_id]["resumed_from"])
    assert [row["epoch"] for row in last[long_id]["history"]] == list(range(1, ROUNDS[1], 2))
    # Each resume trained on from exactly the booster (trees, rounds) and early-stopping state of the
    # checkpoint it restored, as the checkpoint's files hold them; so did any other unfinished trial.
    for t, d in final_dirs.items():
        if t != short_id:
            final = max((c for c in d.glob("checkpoint_*") if read_state(str(c))), key=lambda c: read_state(str(c))["epoch"])
            restores = assert_restored(last[t]["starts"], last[t]["resumed_from"], copies.get(d.name, {}), str(final))
            assert t != long_id or [r["epoch"] for r in restores] == [long_before, long_then]

    # The searcher's state was restored: the trials are exactly those an uninterrupted sweep with
    # the same seed draws (a fresh generator would repeat the first draws).
    trial_runs = client.search_runs([killed.info.experiment_id], filter_string="tags.`rayline.kind` = 'trial'")
    trial_runs = [r for r in trial_runs if r.data.tags.get("mlflow.parentRunId") == runs_now[1].info.run_id]
    assert len(trial_runs) == len(ROUNDS)
    got = sorted((int(r.data.params["model.params.num_boost_round"]), float(r.data.params["model.params.eta"]))
                 for r in trial_runs)
    monkeypatch.chdir(tmp_path)
    want = sorted((int(c["model.params.num_boost_round"]), float(c["model.params.eta"]))
                  for c in _expected_configs(parse_spec(raw)))
    assert [(n, round(e, 9)) for n, e in got] == [(n, round(e, 9)) for n, e in want]

    # The winner is what an uninterrupted sweep picks from these trials: the best log_loss recorded.
    best = {r.info.run_id: min(m.value for m in client.get_metric_history(r.info.run_id, "log_loss")) for r in trial_runs}
    (winner,) = [r for r in trial_runs if r.data.tags["rayline.winner"] == "true"]
    assert best[winner.info.run_id] == min(best.values())
    assert float(version.tags["valid_log_loss"]) == pytest.approx(best[winner.info.run_id])
    resume_s = time.monotonic() - killed_at
    # Nothing of the killed run is left, Ray's agents included (see above).
    while _alive(seen) and time.monotonic() < killed_at + 90:
        time.sleep(1)
    assert not _alive(seen), f"processes of the killed run alive 90 s after the kill: {_alive(seen)}"
    print(f"killed after {killed_after:.1f} s; resumed and Ctrl-C'd in {phase2:.1f} s; resumed to the end in "
          f"{phase3:.1f} s; {resume_s:.1f} s from the kill to the last check (load average {os.getloadavg()[0]:.1f})")


def _record(runs: Path, experiment: str, run_id: str, status: str, **extra) -> None:
    from rayline.pipeline.record import training_spec, write_record
    from rayline.spec import parse_spec

    spec = parse_spec(_spec("irisrecords"))
    write_record(str(runs / experiment), {"experiment": experiment, "spec_name": spec.name, "spec": training_spec(spec),
                                           "spec_raw": spec.model_dump(by_alias=True, exclude_none=True),
                                           "run_id": run_id, "status": status, "created": 1.0, **extra})


def test_which_runs_resume_can_take(tmp_path):
    """Without Ray: a run record's driver decides. A live driver on this host, or one on another host
    (a pid there cannot be checked), is never resumed; a gone one (dead pid, or the pid reused by a
    later process) is, by `--resume` and by run id; unknown and finished ids are one line, exit 1."""
    from rayline.errors import RaylineError
    from rayline.tune.resume import driver_info, driver_state
    from rayline.pipeline.record import interrupted_run, find_run
    from rayline.spec import parse_spec
    from rayline.workspace import workspace

    ws = workspace(tmp_path / "ws").ensure()
    runs = Path(ws.runs_dir)
    me = driver_info()
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = {**me, "pid": int(ended.stdout)}
    assert driver_state(me)[0] == "alive"
    assert driver_state(dead)[0] == "gone"
    assert driver_state({**me, "started": me["started"] - 3600})[0] == "gone"  # same pid, another process
    assert driver_state({**me, "host": "elsewhere"}) == ("unknown", f"pid {me['pid']} on elsewhere")

    _record(runs, "a-live", "r-live", "running", driver=me)
    _record(runs, "b-far", "r-far", "running", driver={**me, "host": "elsewhere"})
    _record(runs, "c-done", "r-done", "registered", version="3")
    _record(runs, "d-newer", "r-newer", "interrupted", resumed_runs=["r-older"])
    with pytest.raises(RaylineError, match=rf"^resume: run r-live cannot be resumed: its driver \(pid {me['pid']} on "
                                           r".*\) is still running it \(allowed: stop that process first"):
        find_run(ws, "r-live")
    with pytest.raises(RaylineError, match=r"^resume: run r-far cannot be resumed: it is driven by pid \d+ on elsewhere, "
                                           r"which this host cannot check: .*resume on that host.*rayline resume r-far --force"):
        find_run(ws, "r-far")
    assert find_run(ws, "r-far", force=True)["experiment"] == "b-far"  # the user vouches that driver is gone
    with pytest.raises(RaylineError, match=r"^resume: run r-live cannot be resumed: its driver"):
        find_run(ws, "r-live", force=True)  # a driver alive on this host: never
    with pytest.raises(RaylineError, match=r"^resume: run r-done cannot be resumed: it finished \(model version 3"):
        find_run(ws, "r-done")
    with pytest.raises(RaylineError, match=r"^resume: run r-older was resumed already, as run r-newer"):
        find_run(ws, "r-older")
    assert find_run(ws, "r-newer")["experiment"] == "d-newer"

    # `rayline run SPEC --resume` takes the newest resumable run: a killed driver's (e-killed, newer
    # than d-newer), never the live one, and claims it for this process at once.
    _record(runs, "e-killed", "r-killed", "running", driver=dead, created=2.0)
    _record(runs, "f-live", "r-live2", "running", driver=me, created=3.0)
    spec = parse_spec(_spec("irisrecords"))
    assert interrupted_run(ws, spec)["experiment"] == "e-killed"
    claimed = json.loads((runs / "e-killed" / "rayline-run.json").read_text())
    assert claimed["status"] == "running" and claimed["driver"]["pid"] == os.getpid()

    for run_id, message in [("r-unknown", rf"error: resume: no run r-unknown in {runs} \(allowed: the MLflow run id"),
                            ("r-live", r"error: resume: run r-live cannot be resumed: its driver")]:
        cli = subprocess.run([sys.executable, "-m", "rayline.cli", "resume", run_id, "--workspace", str(ws.root)],
                             capture_output=True, text=True, env=_env(), timeout=60)
        assert cli.returncode == 1 and "Traceback" not in cli.stderr, cli.stderr
        line = " ".join(cli.stderr.split())
        assert re.match(message, line), line


def test_an_optuna_sweep_restored_draws_what_it_would_have_drawn(tmp_path):
    """Without Ray: tune.search optuna's searcher saved the way Tune saves a sweep's state (and
    restored from it on resume) goes on with the same suggestions as one never interrupted, past
    TPE's 10 random start-up trials (where its model of earlier results decides)."""
    from rayline.tune.searchers import SEARCHERS
    from rayline.spec import parse_spec
    from rayline.tune.sweep import search_space

    raw = _spec("irisoptuna")
    raw["tune"] = {"search": "optuna", "num_samples": 13, "max_concurrent": 1,
                   "space": {"model.params.eta": {"loguniform": [0.01, 0.3]}, "model.params.max_depth": {"choice": [2, 3, 4]}}}
    spec = parse_spec(raw)

    def searcher():
        built = SEARCHERS["optuna"].build(spec, metric="log_loss", mode="min", concurrency=1)
        built.set_search_properties("log_loss", "min", search_space(spec))
        return built

    def trial(built, i: int) -> dict:
        config = built.suggest(f"t{i}")
        built.on_trial_complete(f"t{i}", result={"log_loss": config["model.params.eta"] + 0.01 * config["model.params.max_depth"]})
        return config

    straight = searcher()
    expected = [trial(straight, i) for i in range(13)]
    before = searcher()
    drawn = [trial(before, i) for i in range(11)]
    before.save_to_dir(str(tmp_path), session_str="interrupted")
    after = searcher()
    after.restore_from_dir(str(tmp_path))
    drawn += [trial(after, i) for i in range(11, 13)]
    assert drawn == expected
