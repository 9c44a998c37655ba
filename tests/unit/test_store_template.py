"""A new workspace's tracking store is a copy of an empty one built once (rayline/registry/store_template.py):
the copy is a store MLflow opens without migrating, holds nothing of the template's, and works; a template
that is not a store is never copied."""

import os
import sqlite3

import pytest

from rayline.registry.store import STORE_LOCK_TIMEOUT_S, Store
from rayline.registry.store_template import seed_new_store, template_path
from rayline.workspace import workspace


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYLINE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _experiments(db):
    with sqlite3.connect(db) as con:
        return con.execute("SELECT experiment_id, name, artifact_location FROM experiments").fetchall()


def test_the_first_store_builds_the_template_and_later_ones_are_copies_that_work(cache, tmp_path, monkeypatch):
    import mlflow

    assert template_path() == cache / "mlflow-stores" / f"empty-{mlflow.__version__}.db"
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    first = Store(workspace(tmp_path / "a").ensure())
    assert template_path().is_file()
    first.client.create_experiment("only-in-a")

    monkeypatch.chdir(tmp_path)  # MLflow puts Default's artifacts under the creating process's ./mlruns
    ws = workspace(tmp_path / "b").ensure()
    calls = []
    import mlflow.store.db.utils as db_utils

    monkeypatch.setattr(db_utils, "_initialize_tables", lambda engine: calls.append(engine))  # migrations: none
    store = Store(ws)
    assert calls == []
    assert _experiments(ws.root / "mlflow.db") == [(0, "Default", str(tmp_path / "mlruns" / "0"))]
    assert _experiments(template_path()) == [(0, "Default", str(tmp_path / "here" / "mlruns" / "0"))]  # untouched
    exp = store.client.create_experiment("b", artifact_location=str(tmp_path / "b" / "art"))
    run = store.client.create_run(exp)
    store.client.log_metric(run.info.run_id, "accuracy", 0.9)
    store.client.create_registered_model("m")
    assert store.client.get_run(run.info.run_id).data.metrics == {"accuracy": 0.9}
    assert [m.name for m in store.client.search_registered_models()] == ["m"]
    assert not [name for name in os.listdir(ws.root) if ".partial-" in name]


def test_a_template_that_is_not_a_store_is_not_copied_and_mlflow_creates_the_store(cache, tmp_path):
    template_path().parent.mkdir(parents=True)
    template_path().write_bytes(b"not a database")
    db = tmp_path / "ws" / "mlflow.db"
    db.parent.mkdir()
    assert seed_new_store(db, STORE_LOCK_TIMEOUT_S) is False
    assert os.listdir(db.parent) == []  # no half-copied file left
    store = Store(workspace(tmp_path / "ws").ensure())
    assert _experiments(db)[0][:2] == (0, "Default") and store.client.search_experiments()


def test_an_existing_store_is_never_overwritten(cache, tmp_path):
    db = tmp_path / "mlflow.db"
    db.write_bytes(b"a user's store")
    assert seed_new_store(db, STORE_LOCK_TIMEOUT_S) is False
    assert db.read_bytes() == b"a user's store"
