"""Search and scheduling strategies end to end on tiny sweeps: optuna, median stopping, PBT, time budget.

Each sweep runs in-process on the session's Ray (2 CPUs): iris, one Train worker per trial,
a few epochs, two trials at once.
"""

from __future__ import annotations

import os
import time


import pytest
import yaml

from rayline.spec import parse_spec
from rayline.storage import list_names
from rayline.train.loop import read_state
from tests.integration import slow_model
from tests.integration.conftest import run
from tests.integration.restore_evidence import assert_restored

IRIS = {"format": "sklearn", "name": "iris"}


def _raw(name: str, *, framework: str = "torch", epochs: int = 6, tune: dict, serve: bool = False,
         source: dict = IRIS, label: str = "target", batch_size: int = 16) -> dict:
    raw = {
        "name": name,
        "data": {"source": source, "label": label, "split": {"valid": 0.2, "test": 0.2, "seed": 0},
                 "preprocess": [{"standard_scale": {"columns": "numeric"}}]},
        "task": "classification",
        "model": {"framework": framework, "kind": "mlp", "params": {"hidden_sizes": [16]}},
        "train": {"workers": 1, "epochs": epochs, "batch_size": batch_size, "optimizer": {"name": "adam", "lr": 0.01},
                  "metric": "accuracy"},
        "tune": {"max_concurrent": 2, **tune},
    }
    if serve:
        raw["serve"] = {"route": f"/{name}", "replicas": {"min": 1, "max": 1}}
    return raw


def _experiment_dir(summary) -> str:
    """The sweep's folder of Train runs (every trial's runs are in it)."""
    (folder,) = {t.result.run_dir.rsplit("/", 1)[0] for t in summary.trials if t.result is not None}
    return folder


def test_optuna_sweep_with_list_choices_trains_and_records_them(ray_session, ws):
    # A choice of lists (layer sizes) is drawn by index for Optuna and reaches the trial as the list.
    spec = parse_spec(_raw("optuna-iris", epochs=2, tune={
        "search": "optuna", "seed": 7, "num_samples": 2, "scheduler": "fifo",
        "space": {"train.optimizer.lr": {"loguniform": [0.003, 0.05]},
                  "model.params.hidden_sizes": {"choice": [[8], [16, 8]]}}}))
    summary = run(spec, ws, deploy=False)
    assert len(summary.trials) == 2
    for trial in summary.trials:
        assert trial.overrides["model.params.hidden_sizes"] in ([8], [16, 8])
        assert trial.stop_reason == "completed" and trial.units_trained == 2, trial
        assert trial.result is not None and "accuracy" in trial.result.metrics


def test_median_stopping_cuts_trials_on_the_units_clock(ray_session, ws):
    # One trial at a time, a learning rate that learns first: the median rule compares a trial
    # only with trials already past the same point, so the one too slow to learn anything in 6
    # epochs is compared with it from its first epoch on.
    # A third trial, the first's config again, runs after the stopped one, in the process it leaves.
    raw = _raw("median-iris", epochs=6, tune={
        "num_samples": 1, "search": "grid", "scheduler": {"median": {"grace_period": 1, "min_samples_required": 1}},
        "space": {"train.optimizer.lr": {"grid": [0.05, 0.00001, 0.05]}}})
    raw["tune"]["max_concurrent"] = 1
    spec = parse_spec(raw)
    summary = run(spec, ws, deploy=False)
    reasons = {t.trial_id: (t.stop_reason, t.units_trained) for t in summary.trials}
    assert sorted(reasons.values()) == [("completed", 6), ("completed", 6), ("early_stopped", 1)], reasons
    for t in summary.trials:
        if t.stop_reason == "early_stopped":
            assert len(t.result.history) == t.units_trained  # one row per epoch it trained
    # One-worker trials train in their trial's process, and each trial got the one before's (Tune's
    # reuse_actors: the imports paid once): one process for all three, not this test's. The stopped
    # trial's training ended with it: the trial after it trained its own 6 epochs, exactly as the
    # first trial of the same config did.
    pids = {t.result.starts[-1]["pid"] for t in summary.trials}
    assert len(pids) == 1 and os.getpid() not in pids, pids
    first, last = sorted((t for t in summary.trials if t.stop_reason == "completed"), key=lambda t: t.trial_id)
    assert [row["epoch"] for row in last.result.history] == list(range(6))
    assert [row["loss"] for row in last.result.history] == pytest.approx([row["loss"] for row in first.result.history],
                                                                         rel=1e-6)


def test_time_budget_stops_the_sweep_and_picks_among_stopped_trials(ray_session, ws, tmp_path):
    # Trials far longer than the budget: every one that started is cut by it. Two at once, both
    # started at the sweep's start. The budget must outlast the start-up, not measure it: on CI's
    # loaded 2 cores a trial's start-up once took all of a 35 s budget, and once all of 60 s
    # (2026-11-28: the trials' actors and Train controllers started 26-30 s into the sweep, their
    # workers 24-27 s after that). A one-worker trial now trains in its trial's actor (no
    # controller, no worker: train.in_process), so 45 s leaves the worst actor start seen 15 s.
    raw = _raw("budget-iris", epochs=5000, tune={
        "num_samples": 2, "scheduler": "fifo", "time_budget_s": 45,
        "space": {"train.optimizer.lr": {"loguniform": [0.003, 0.05]}}})
    raw["model"] = slow_model.MODEL  # trials that last the budget without keeping both CPUs busy
    slow_model.write(tmp_path)
    path = tmp_path / "budget.yaml"
    path.write_text(yaml.safe_dump(raw))
    spec = parse_spec(raw)
    t0 = time.monotonic()
    summary = run(spec, ws, deploy=False, spec_path=str(path))
    assert time.monotonic() - t0 < 240
    trained = [t for t in summary.trials if t.result is not None]
    assert trained and all(t.stop_reason == "time_budget" for t in summary.trials), \
        [(t.trial_id, t.stop_reason, t.units_trained) for t in summary.trials]
    assert all(0 < t.units_trained < 5000 for t in trained)
    assert summary.version  # registered: the winner among the stopped trials
    _wait_for_free_cpus()  # no Train run or placement group left behind


def _wait_for_free_cpus(timeout_s: float = 60):
    import ray

    deadline = time.monotonic() + timeout_s
    total = ray.cluster_resources().get("CPU", 0)
    while ray.available_resources().get("CPU", 0) < total - 0.05:
        assert time.monotonic() < deadline, f"CPUs still held: {ray.available_resources()} of {ray.cluster_resources()}"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def blobs_csv(tmp_path_factory) -> str:
    """3000 rows, 3 classes: an epoch is ~190 steps of batch 8 per worker, so the PBT sweep's
    exploit happens mid-run with real training on either side of it (iris trains a whole run in
    well under a second). Synchronous PBT waits for both trials at the perturbation point, so
    epochs need not be long for the trials to meet there (12,000 rows cost the suite ~90 s)."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    x = rng.normal(size=(3000, 4))
    label = np.argmax(x[:, :3] + 0.3 * rng.normal(size=(3000, 3)), axis=1)
    path = tmp_path_factory.mktemp("blobs") / "blobs.csv"
    pd.DataFrame({**{f"x{i}": x[:, i] for i in range(4)}, "label": label}).to_csv(path, index=False)
    return str(path)


PBT_EPOCHS = 3


def _pbt_sweep(name: str, framework: str, csv: str):
    # Two trials, one with a learning rate that cannot learn: at the perturbation point (epoch 2
    # of 3) the worse one continues from a copy of the better one's checkpoint. Synchronous:
    # each trial waits for the other there. Asynchronous PBT exploits only where the two trials
    # overlap at a perturbation point, and in CI runs a slow Train start-up on the loaded
    # machine kept them apart (no exploit: torch once, tensorflow once with the tests in two lanes).
    return parse_spec(_raw(name, framework=framework, epochs=PBT_EPOCHS, source={"format": "csv", "path": csv}, label="label",
                           batch_size=8, tune={
        "num_samples": 1, "search": "grid",
        "scheduler": {"pbt": {"perturbation_interval": 2, "quantile_fraction": 0.5, "resample_probability": 0.0,
                              "synch": True}},
        "space": {"train.optimizer.lr": {"grid": [0.000001, 0.01]}}}))


def _assert_exploited(summary):
    exploits = [(t, e) for t in summary.trials for e in t.events if e["kind"] == "exploit"]
    assert exploits, [(t.trial_id, t.events) for t in summary.trials]
    trial, event = exploits[0]
    donor = next(t for t in summary.trials if t.trial_id == event["from_trial"])
    assert set(event["config"]) == {"train.optimizer.lr"} and event["unit"] >= 2
    base = _experiment_dir(summary)
    restarted = f"trial-{trial.trial_id}-from-{donor.trial_id}-u{event['unit']}"
    assert restarted in list_names(base), list_names(base)
    # The restarted run began from the donor's checkpoint at that epoch: its first checkpoint's
    # history is the donor's up to there (weights and epoch came with it), then one epoch of its own.
    names = sorted(n for n in list_names(f"{base}/{restarted}") if n.startswith("checkpoint_"))
    first = read_state(f"{base}/{restarted}/{names[0]}")
    assert first["epoch"] == event["unit"] and first["resumed_from"][-1] == event["unit"] - 1
    donor_rows = {r["epoch"]: r for r in read_state(_first_checkpoint_at(f"{base}/trial-{donor.trial_id}",
                                                                          event["unit"] - 1))["history"]}
    for row in first["history"][: event["unit"]]:
        assert row == donor_rows[row["epoch"]]
    # ...and its workers trained from exactly the donor's checkpoint: the live weights and optimizer state
    # recorded before their first step are the donor's files' (kept: PBT keeps every checkpoint), not a
    # fresh model's, and they trained on from there.
    donor_ckpt = _first_checkpoint_at(f"{base}/trial-{donor.trial_id}", event["unit"] - 1)
    # (Ray's checkpoint_manager_snapshot.json is among the names too: no state file.)
    final_state, final = max(((s, f"{base}/{restarted}/{n}") for n in names if (s := read_state(f"{base}/{restarted}/{n}"))),
                             key=lambda found: found[0]["epoch"])
    (restore,) = assert_restored(final_state["starts"], final_state["resumed_from"],
                                 {donor_ckpt.rsplit("/", 1)[1]: donor_ckpt}, final)
    assert os.path.realpath(restore["source"]) == os.path.realpath(donor_ckpt), (restore["source"], donor_ckpt)
    # Every trial trained the whole run (PBT stops nobody); its units count across its Train runs.
    assert all(t.stop_reason == "completed" and t.units_trained == PBT_EPOCHS for t in summary.trials)
    return trial


def _first_checkpoint_at(run_dir: str, epoch: int) -> str:
    for name in sorted(list_names(run_dir)):
        if name.startswith("checkpoint_") and (read_state(f"{run_dir}/{name}") or {}).get("epoch") == epoch:
            return f"{run_dir}/{name}"
    raise AssertionError(f"no checkpoint of epoch {epoch} in {run_dir}")


# One framework: the exploit (a trial restarted from another's checkpoint with a new config) is
# rayline's and Tune's, the same for each; a tensorflow checkpoint's restore is checked by
# test_csv_and_faults.py's killed-worker test (a PBT run of tensorflow here cost the suite 70-140 s).
def test_pbt_torch_exploits_the_better_trial_and_registers_a_servable_winner(ray_session, ws, blobs_csv):
    from rayline import load_model

    summary = run(_pbt_sweep("pbt-torch", "torch", blobs_csv), ws, deploy=False)
    _assert_exploited(summary)
    assert summary.valid_metrics["accuracy"] > 0.7 and summary.test_metrics["accuracy"] > 0.7
    # The registered version loads as a Serve replica loads it, and predicts the classes.
    model = load_model(summary.name, summary.version, workspace=str(ws.root))
    rows = [{"x0": 3.0, "x1": -3.0, "x2": -3.0, "x3": 0.0}, {"x0": -3.0, "x1": -3.0, "x2": 3.0, "x3": 0.0}]
    assert model.predict(rows)["predictions"] == [0, 2]


