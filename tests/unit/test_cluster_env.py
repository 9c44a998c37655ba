"""The environment rayline gives the Ray processes it starts (rayline/cluster/env.py)."""

from rayline.cluster.env import PREEMPTION_WATCHER_ENV, train_env


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
    assert train_env(single_machine=True) == {PREEMPTION_WATCHER_ENV: "1", "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "2",
                                              "LOG_NAME_UPDATE_INTERVAL_S": "0.5", "RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0"}


def test_the_log_monitor_looks_for_new_files_every_2_s_not_every_pass(monkeypatch):
    for key in ("LOG_NAME_UPDATE_INTERVAL_S", "RAY_LOG_MONITOR_MANY_FILES_THRESHOLD"):
        monkeypatch.delenv(key, raising=False)
    env = train_env()
    assert env["RAY_LOG_MONITOR_MANY_FILES_THRESHOLD"] == "0" and env["LOG_NAME_UPDATE_INTERVAL_S"] == "2"
