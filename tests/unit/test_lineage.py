"""`rayline models show NAME [--version N]` and the deployment record it prints (no Ray: a real
SQLite MLflow store in tmp, versions registered the way the runner tags them).

The chain on a real pipeline run, served, is tested in tests/integration/test_versions.py.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rayline.cli import app
from rayline.registry.lineage import Lineage, deployment_text, lineage, lineage_lines

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One store for the module (creating a SQLite store runs ~50 migrations): model `tiny` with
    version 1 tagged as the runner tags a version (its cache entry, checkpoint and run record on
    disk), version 2 as an older rayline registered it (no lineage tags, no run), version 3 whose
    cache entry and checkpoint are gone and whose deployment tag is not JSON; model `other`."""
    from rayline.registry import DEPLOYMENTS_TAG, Registry
    from rayline.workspace import workspace

    root = tmp_path_factory.mktemp("lineage")
    ws = workspace(root / "ws").ensure()
    registry = Registry(ws)
    client = registry.client
    run_id = client.create_run(registry._experiment_id("tiny"), run_name="tiny-20261126").info.run_id
    registry._log(run_id, metrics=[("valid_accuracy", 0.9, 0), ("test_accuracy", 0.85, 0), ("test_f1", 0.8125, 0),
                                   ("best_valid_accuracy/mlp", 0.9, 0)])
    client.set_terminated(run_id)
    for name in ("tiny", "other"):
        client.create_registered_model(name)
    checkpoint = root / "runs" / "tiny-exp" / "checkpoint_000004"
    checkpoint.mkdir(parents=True)
    (ws.root / "data-cache" / "key1").mkdir(parents=True)
    (ws.root / "data-cache" / "key1" / "meta.json").write_text("{}")  # a whole entry has one
    record = Path(ws.runs_dir) / "tiny-exp" / "rayline-run.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"experiment": "tiny-exp", "status": "registered", "version": "1"}))
    lineage_tags = {"framework": "xgboost", "task": "classification", "data_fingerprint": "fp-1",
                    "data_cache_key": "key1", "data_source": "data/rows.csv", "experiment": "tiny-exp",
                    "trial_id": "trial_00001", "checkpoint": str(checkpoint)}
    v1 = client.create_model_version("tiny", "file:///nowhere/model", run_id, tags=lineage_tags).version
    v2 = client.create_model_version("tiny", "file:///nowhere/old", None, tags={"framework": "torch"}).version
    gone = {**lineage_tags, "data_cache_key": "key-pruned", "checkpoint": str(root / "deleted" / "checkpoint_000001"),
            "experiment": "no-such-run", DEPLOYMENTS_TAG: "{not json"}
    v3 = client.create_model_version("tiny", "file:///nowhere/model", run_id, tags=gone).version
    client.create_model_version("other", "file:///nowhere/other", None)
    registry.set_alias("tiny", "champion", v1)
    from rayline.serve.champions import record_deployment  # what deploy appends, champion then canary

    record_deployment(registry, "tiny", str(v1), action="deploy", role="champion", percent=100, route="/tiny",
                      url="http://127.0.0.1:8000/tiny", gate=None)
    record_deployment(registry, "tiny", str(v1), action="deploy", role="canary", percent=10, route="/tiny",
                      gate={"max_error_rate": None, "max_p99_ms": 50.0, "min_requests": 100})
    return {"ws": ws, "registry": registry, "run_id": run_id, "checkpoint": str(checkpoint),
            "versions": [str(v1), str(v2), str(v3)]}


def _cli(*args):
    """The CLI in this process (rich's console prints to the captured stdout)."""
    result = CliRunner().invoke(app, list(args), catch_exceptions=False, env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    return result.output


def _subprocess(*args):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "platform")}
    env.pop("RAYLINE_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "rayline.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=300)


def test_each_deployment_is_appended_to_the_versions_record(store):
    got = lineage(store["ws"], "tiny", store["versions"][0]).deployments
    assert [(d["action"], d["role"], d["percent"], d["route"], d["app"]) for d in got] == [
        ("deploy", "champion", 100, "/tiny", "tiny-v1"), ("deploy", "canary", 10, "/tiny", "tiny-v1")]
    assert got[0]["url"] == "http://127.0.0.1:8000/tiny" and "gate" not in got[0]  # empty extras are left out
    assert got[1]["gate"] == {"max_error_rate": None, "max_p99_ms": 50.0, "min_requests": 100}
    assert all(d["at"].endswith("Z") and len(d["at"]) == 20 for d in got)


def test_the_record_keeps_the_newest_entries_that_fit_an_mlflow_1_tag(store):
    from rayline.registry import DEPLOYMENTS_TAG, DEPLOYMENTS_TAG_CHARS

    registry = store["registry"]
    v = str(registry.client.create_model_version("other", "file:///nowhere/other", None).version)
    for i in range(60):
        registry.record_deployment("other", v, {"at": f"t{i:02d}", "route": "/other" + "x" * 60})
    raw = registry.client.get_model_version("other", v).tags[DEPLOYMENTS_TAG]
    kept = json.loads(raw)
    assert len(raw) <= DEPLOYMENTS_TAG_CHARS and kept[-1]["at"] == "t59"
    assert [d["at"] for d in kept] == [f"t{i:02d}" for i in range(60 - len(kept), 60)] and len(kept) > 40


def test_a_config_deployment_is_recorded_too(store):
    """A Serve config's router (`serve deploy`, RayService) records the champion it makes."""
    from rayline.serve.export import _record_champion

    registry, v2 = store["registry"], store["versions"][1]
    _record_champion("other", "1", "/other", {"workspace": str(store["ws"].root)})
    (entry,) = lineage(store["ws"], "other", "1").deployments
    assert (entry["action"], entry["role"], entry["percent"], entry["route"], entry["app"]) == (
        "config", "champion", 100, "/other", "other-v1")
    assert registry.alias_version("other", "champion") == "1"
    assert lineage(store["ws"], "tiny", v2).deployments == []


def test_show_prints_the_chain_of_a_version(store):
    v1 = store["versions"][0]
    out = _cli("models", "show", "tiny", "--version", v1, "-w", str(store["ws"].root))
    lines = out.splitlines()
    assert lines[0].startswith(f"model:       tiny version {v1} (registered ")
    assert lines[0].endswith("xgboost, classification; aliases: champion)")
    cache = store["ws"].root / "data-cache" / "key1"
    assert lines[1:10] == [
        "data:        source data/rows.csv",
        "             fingerprint fp-1",
        f"             cache key key1 (entry present: {cache})",
        f"run:         MLflow run {store['run_id']} (FINISHED)",
        "             experiment tiny-exp (run record: registered)",
        "trial:       trial_00001",
        f"checkpoint:  {store['checkpoint']} (exists)",
        "metrics:     valid_accuracy 0.9000",  # best_valid_accuracy/<family> is the sweep's, not the version's
        "             test_accuracy 0.8500, test_f1 0.8125",
    ]
    first, second = lines[10:]
    assert first.startswith("deployments: 20") and first.endswith(
        " deploy: champion 100% at /tiny (app tiny-v1; http://127.0.0.1:8000/tiny)")
    assert second.startswith(" " * 13 + "20") and second.endswith(
        " deploy: canary 10% at /tiny (app tiny-v1; gate max_p99_ms 50, min_requests 100)")


def test_show_defaults_to_the_newest_version_and_says_what_is_gone(store):
    v3 = store["versions"][2]
    out = _cli("models", "-w", str(store["ws"].root), "show", "tiny")  # options before the subcommand too
    assert out.startswith(f"model:       tiny version {v3} ")
    assert f"cache key key-pruned (entry gone: {store['ws'].root / 'data-cache' / 'key-pruned'})" in out
    assert "deleted/checkpoint_000001 (gone)" in out
    assert "experiment no-such-run (run record: not found)" in out
    assert "deployments: none recorded" in out  # a tag that is not JSON: no record, no crash


def test_a_version_registered_before_lineage_shows_unknowns(store):
    v2 = store["versions"][1]
    item = json.loads(_cli("models", "show", "tiny", "--version", v2, "-w", str(store["ws"].root), "-o", "json"))
    assert item["version"] == v2 and item["framework"] == "torch"
    assert {k: item[k] for k in ("data_source", "fingerprint", "cache_key", "trial_id", "checkpoint", "experiment",
                                 "run_status", "checkpoint_present", "cache_present")} == dict.fromkeys(
        ("data_source", "fingerprint", "cache_key", "trial_id", "checkpoint", "experiment", "run_status",
         "checkpoint_present", "cache_present"))
    assert item["run_id"] == "" and item["metrics"] == {} and item["deployments"] == []
    text = _cli("models", "show", "tiny", "--version", v2, "-w", str(store["ws"].root))
    assert text.splitlines()[1:] == [
        "data:        source unknown", "             fingerprint unknown", "             cache key -: unknown",
        "run:         MLflow run unknown", "             experiment unknown", "trial:       unknown",
        "checkpoint:  unknown", "metrics:     none recorded", "deployments: none recorded"]


def test_unknown_model_or_version_is_one_line_naming_the_choices(store):
    w = str(store["ws"].root)
    name = _subprocess("models", "show", "nosuch", "-w", w)
    version = _subprocess("models", "show", "tiny", "--version", "99", "-w", w)
    for proc in (name, version):
        assert proc.returncode == 1 and proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
        assert "Traceback" not in proc.stderr
    assert name.stderr.startswith("error: model 'nosuch': not registered in sqlite:///")
    assert name.stderr.rstrip().endswith("(got 'nosuch'; allowed: other, tiny)")
    assert version.stderr.strip() == (f"error: model 'tiny' version 99: not registered (got '99'; allowed: "
                                      f"{', '.join(store['versions'])} or latest)")


def test_models_without_a_subcommand_still_lists(store):
    """`rayline models [NAME] [-o json]` works as before `show` existed; `list` is the same command."""
    w = str(store["ws"].root)
    everything = json.loads(_cli("models", "-w", w, "-o", "json"))
    assert sorted({v["name"] for v in everything}) == ["other", "tiny"]
    one = json.loads(_cli("models", "tiny", "-w", w, "-o", "json"))
    assert [v["version"] for v in one] == store["versions"]
    assert set(one[0]) == {"name", "version", "run_id", "source", "metrics", "created", "framework"}
    assert json.loads(_cli("models", "list", "tiny", "-o", "json", "-w", w)) == one
    assert "registered models" in _cli("models", "--workspace", w)


def test_models_help_names_both_forms():
    out = _cli("models", "--help")
    assert "rayline models show NAME" in out and "rayline models list" in out


def test_deployment_text_reads_any_entry():
    assert deployment_text({"at": "2026-11-26T10:00:00Z", "action": "deploy", "role": "canary", "percent": 10,
                            "route": "/digits", "app": "digits-v2", "url": "http://h:8000/digits",
                            "gate": {"max_error_rate": 0.02, "max_p99_ms": None, "min_requests": 100}}) == (
        "2026-11-26T10:00:00Z deploy: canary 10% at /digits (app digits-v2; http://h:8000/digits; "
        "gate max_error_rate 0.02, min_requests 100)")
    assert deployment_text({"at": "t", "action": "promote", "role": "champion", "percent": 100, "route": "/d"}) == (
        "t promote: champion 100% at /d")
    assert deployment_text({}) == "unknown deploy: serving at unknown"  # a hand-written or foreign entry


def test_lineage_lines_of_a_workspace_on_object_storage():
    item = Lineage(name="m", version="4", created="2026-11-26T10:00:00Z", fingerprint="fp", cache_key="k",
                   run_id="r1", run_status="FINISHED", checkpoint="s3://b/runs/x/checkpoint_000001",
                   checkpoint_present=None, metrics={"test_rmse": 1.5, "valid_rmse": 1.25})
    lines = lineage_lines(item)
    assert lines[0] == "model:       m version 4 (registered 2026-11-26T10:00:00Z)"
    assert "             cache key k (no data cache in a workspace on object storage)" in lines
    assert "checkpoint:  s3://b/runs/x/checkpoint_000001 (cannot tell whether it is still there)" in lines
    assert lines[-3:] == ["metrics:     valid_rmse 1.2500", "             test_rmse 1.5000", "deployments: none recorded"]
    no_cache = lineage_lines(Lineage(name="m", version="1", created="-", fingerprint="fp"))
    assert "             cache key -: the run did not use the data cache" in no_cache
