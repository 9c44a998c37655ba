"""The environment rayline gives the Ray processes it starts (rayline/cluster/env.py)."""

import os
import subprocess
import sys

from rayline.cluster.env import PREEMPTION_WATCHER_ENV, THREAD_WAIT_ENV, train_env


def test_a_single_machine_ray_starts_no_preemption_watcher(monkeypatch):
    monkeypatch.delenv(PREEMPTION_WATCHER_ENV, raising=False)
    assert train_env(single_machine=True)[PREEMPTION_WATCHER_ENV] == "0"
    # A cluster other nodes can join may lose a node to its cloud: Ray's default (the watcher) stays.
    assert PREEMPTION_WATCHER_ENV not in train_env()


def test_the_users_own_settings_win(monkeypatch):
    monkeypatch.setenv(PREEMPTION_WATCHER_ENV, "1")
    monkeypatch.setenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "2")
    monkeypatch.setenv("LOG_NAME_UPDATE_INTERVAL_S", "0.5")
    monkeypatch.delenv("RAY_LOG_MONITOR_MANY_FILES_THRESHOLD", raising=False)
    monkeypatch.setenv(THREAD_WAIT_ENV, "ACTIVE")
    assert train_env(single_machine=True) == {PREEMPTION_WATCHER_ENV: "1", "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "2",
                                              "LOG_NAME_UPDATE_INTERVAL_S": "0.5", "RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0",
                                              THREAD_WAIT_ENV: "ACTIVE"}


def test_the_log_monitor_looks_for_new_files_every_2_s_not_every_pass(monkeypatch):
    for key in ("LOG_NAME_UPDATE_INTERVAL_S", "RAY_LOG_MONITOR_MANY_FILES_THRESHOLD"):
        monkeypatch.delenv(key, raising=False)
    env = train_env()
    assert env["RAY_LOG_MONITOR_MANY_FILES_THRESHOLD"] == "0" and env["LOG_NAME_UPDATE_INTERVAL_S"] == "2"


def test_openmp_threads_of_rayline_s_ray_processes_sleep_when_idle(monkeypatch):
    monkeypatch.delenv(THREAD_WAIT_ENV, raising=False)
    assert train_env()[THREAD_WAIT_ENV] == "PASSIVE" and train_env(single_machine=True)[THREAD_WAIT_ENV] == "PASSIVE"


# In a fresh process whose environment lacks the variable: what it holds when the first library that
# loads libgomp (scikit-learn here; torch and xgboost for `run`) is imported by a command.
_FIRST_OPENMP_IMPORT = """
import os, sys
seen = {}

class Watch:
    def find_spec(self, name, path=None, target=None):
        if name in ("sklearn", "torch", "xgboost") and not seen:
            seen[name] = os.environ.get("OMP_WAIT_POLICY")
        return None

sys.meta_path.insert(0, Watch())
from rayline.cli import main
sys.argv = ["rayline", "validate", "pipelines/diabetes-torch.yaml"]
try:
    main()
except SystemExit as exc:
    assert not exc.code, exc.code
print(seen)
"""


def test_the_cli_sets_the_wait_policy_before_a_command_loads_openmp():
    from ..integration.conftest import ROOT

    env = {k: v for k, v in os.environ.items() if k != THREAD_WAIT_ENV}
    proc = subprocess.run([sys.executable, "-c", _FIRST_OPENMP_IMPORT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "{'sklearn': 'PASSIVE'}", proc.stdout + proc.stderr
