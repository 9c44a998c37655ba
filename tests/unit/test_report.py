"""`rayline report`: the sweep report read back from a real MLflow store (no Ray).

The store is written through rayline's own Registry APIs (start_pipeline_run, log_trial,
register), as `run_pipeline` writes it, with trials that completed, stopped early, were
exploited by PBT, failed, and came from two model families; `rayline report` runs in a
subprocess and the HTML is parsed for the figures and the data they carry.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bs4 import BeautifulSoup  # noqa: E402

PIPELINE = "sweepy"
METRIC = "f1"  # not the task's default (accuracy): the report must take the spec's metric
EPOCHS = 5
TRIAL = "a1b2c"


def _spec(name: str, tune: bool = True):
    from rayline.spec import parse_spec

    raw = {
        "name": name,
        "data": {"source": {"format": "sklearn", "name": "iris"}, "label": "target"},
        "task": "classification",
        "model": {"framework": "torch", "kind": "mlp", "params": {"hidden_sizes": [64]}},
        "train": {"workers": 1, "epochs": EPOCHS, "metric": METRIC, "optimizer": {"name": "adam", "lr": 0.003}},
    }
    if tune:
        raw["tune"] = {"num_samples": 6, "space": {"train.optimizer.lr": {"loguniform": [1e-4, 1e-1]},
                                                  "model.params.hidden_sizes": {"choice": [[64], [128, 64]]}}}
    return parse_spec(raw)


def _history(values: list[float]) -> list[dict]:
    # As the train loop reports them: epoch is the 0-based index, with other metrics beside the spec's.
    return [{"epoch": i, "f1": v, "accuracy": min(1.0, v + 0.05), "loss": 1.0 - v, "resumed": 0}
            for i, v in enumerate(values)]


# trial id -> (overrides, f1 per epoch, status, stop_reason, units, events, family)
TRIALS = {
    f"{TRIAL}_00000": ({"train.optimizer.lr": 0.0005, "model.params.hidden_sizes": [64]},
                       [0.41, 0.55, 0.63, 0.70, 0.74], "terminated", "completed", 5, [], "torch/mlp"),
    f"{TRIAL}_00001": ({"train.optimizer.lr": 0.012, "model.params.hidden_sizes": [128, 64]},
                       [0.60, 0.78, 0.86, 0.90, 0.93], "terminated", "completed", 5, [], "torch/mlp"),
    f"{TRIAL}_00002": ({"train.optimizer.lr": 0.09, "model.params.hidden_sizes": [64]},
                       [0.30, 0.33], "terminated", "early_stopped", 2, [], "torch/mlp"),
    f"{TRIAL}_00003": ({"train.optimizer.lr": 0.0021, "model.params.hidden_sizes": [128, 64]},
                       [0.45, 0.52, 0.81, 0.85, 0.88], "terminated", "completed", 5,
                       [{"unit": 3, "kind": "exploit", "from_trial": f"{TRIAL}_00001",
                         "config": {"train.optimizer.lr": 0.0144}}], "torch/mlp"),
    f"{TRIAL}_00004": ({"model.framework": "xgboost", "model.kind": "gbdt", "model.params.max_depth": 3},
                       [0.70, 0.79, 0.83], "terminated", "time_budget", 3, [], "xgboost/gbdt"),
    f"{TRIAL}_00005": ({"train.optimizer.lr": 0.03, "model.params.hidden_sizes": [64]},
                       [], "error", "error", 0, [], "torch/mlp"),
}
WINNER = f"{TRIAL}_00001"
TEST = {"f1": 0.9123, "accuracy": 0.9333, "log_loss": 0.2101}


def build_store(root: Path) -> dict:
    """A workspace at `root` holding: a sweep of PIPELINE (the TRIALS), an older sweep of
    PIPELINE logged without the newer tags, then a plain (untuned) run of PIPELINE, the
    newest; returns their MLflow run ids."""
    from rayline.registry import Registry
    from rayline.workspace import workspace

    ws = workspace(root).ensure()
    registry = Registry(ws)
    spec = _spec(PIPELINE)
    artifact = root / "artifact"
    artifact.mkdir()
    (artifact / "weights.txt").write_text("stand-in")  # no preprocessing.json: logged as it is

    legacy = registry.start_pipeline_run(spec, None)
    for i, lr in enumerate((0.001, 0.01)):  # as rayline logged trials before stop reasons existed
        registry.log_trial(legacy, PIPELINE, f"old00_0000{i}", {"train.optimizer.lr": lr, "model.params.hidden_sizes": [64]},
                           "terminated", _history([0.5 + 0.1 * i, 0.6 + 0.1 * i]), winner=i == 1)
    registry.register(legacy, PIPELINE, str(artifact), metrics={"valid_f1": 0.7, "test_f1": 0.68}, tags={"metric": METRIC})

    sweep = registry.start_pipeline_run(spec, None)
    for trial_id, (overrides, f1, status, reason, units, events, family) in TRIALS.items():
        registry.log_trial(sweep, PIPELINE, trial_id, overrides, status, _history(f1), winner=trial_id == WINNER,
                           stop_reason=reason, units_trained=units, events=events, family=family)
    registry.register(sweep, PIPELINE, str(artifact),
                      metrics={**{f"valid_{k}": v for k, v in _history([0.93])[0].items() if k not in ("epoch", "resumed")},
                               **{f"test_{k}": v for k, v in TEST.items()}},
                      tags={"framework": "torch", "task": "classification", "metric": METRIC})

    plain_spec = _spec(PIPELINE, tune=False)
    plain = registry.start_pipeline_run(plain_spec, None)
    registry.log_trial(plain, PIPELINE, "train", {}, "terminated", _history([0.5, 0.6]), winner=True)
    return {"legacy": legacy, "sweep": sweep, "plain": plain}


def _env(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RAYLINE_TRACKING_URI", "MLFLOW_TRACKING_URI", "RAYLINE_WORKSPACE")}
    env.update({"COLUMNS": "200", **(extra or {})})
    return env


def rayline_all(commands: dict) -> dict:
    """Run `rayline` commands (name -> (args, extra env)) as subprocesses side by side; name ->
    CompletedProcess. Each process spends seconds importing MLflow: nine one after another
    took ~35 s on 2 cores, side by side about half."""
    procs = {name: subprocess.Popen([sys.executable, "-m", "rayline.cli", *args], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, env=_env(env))
             for name, (args, env) in commands.items()}
    done = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        done[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return done


def figure_data(soup: BeautifulSoup) -> dict:
    """Figure id -> its plotly JSON, as the page embeds it beside the figure's <div>."""
    out = {}
    for node in soup.find_all("script", attrs={"type": "application/json"}):
        fig_id = node["data-figure"]
        assert soup.find("div", id=fig_id) is not None, f"figure {fig_id} has no <div>"
        out[fig_id] = json.loads(node.string)
    return out


def network_references(html: str, soup: BeautifulSoup) -> list[str]:
    """Anything in the page a browser would fetch from the network."""
    found = []
    for tag in soup.find_all(True):
        for attr in ("src", "href", "data", "srcset", "poster", "action"):
            value = tag.get(attr)
            if value and re.match(r"^\s*(https?:)?//", str(value)):
                found.append(f"<{tag.name} {attr}={value}>")
    found += [f"<script src> {m}" for m in re.findall(r"<script[^>]*\bsrc\s*=", html, flags=re.I)]
    found += [f"<link> {m}" for m in re.findall(r"<link\b[^>]*>", html, flags=re.I)]
    for style in soup.find_all("style"):
        found += re.findall(r"(@import|url\(\s*['\"]?(?:https?:)?//)", style.string or "")
    return found


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("reportws")
    return root, build_store(root)


ERROR_CASES = ["unknown-id", "unknown-name", "no-trials", "unreachable", "no-store", "bad-output",
               "version-without-live", "live-bad-output", "live-no-cluster"]


@pytest.fixture(scope="module")
def cli(store, tmp_path_factory):
    """Every `rayline report` command of this module, run once, side by side."""
    root, runs = store
    scratch = tmp_path_factory.mktemp("reportcli")
    ws = ["--workspace", str(root)]
    commands = {
        "sweep": (["report", runs["sweep"], *ws, "--output", str(root / "sweep.html")], None),
        "by-name": (["report", PIPELINE, *ws, "--output", str(scratch / "by-name.html")], None),
        "legacy": (["report", runs["legacy"], *ws], None),  # to the default path
        "unknown-id": (["report", "0" * 32, *ws], None),
        "unknown-name": (["report", "nosuch", *ws], None),
        "no-trials": (["report", runs["plain"], *ws], None),
        "unreachable": (["report", PIPELINE, *ws], {"RAYLINE_TRACKING_URI": "http://127.0.0.1:1"}),
        "no-store": (["report", PIPELINE, "--workspace", str(scratch / "empty")], None),
        "bad-output": (["report", runs["sweep"], *ws, "--output", str(scratch / "missing" / "r.html")], None),
        "version-without-live": (["report", PIPELINE, *ws, "--version", "3"], None),
        "live-bad-output": (["report", PIPELINE, *ws, "--live", "--output", str(scratch / "missing" / "r.html")], None),
        "live-no-cluster": (["report", PIPELINE, *ws, "--live", "--address", "127.0.0.1:1"], None),
    }
    return {"scratch": scratch, **rayline_all(commands)}


@pytest.fixture(scope="module")
def sweep_report(store, cli):
    root, _ = store
    out = root / "sweep.html"
    proc = cli["sweep"]
    assert proc.returncode == 0, proc.stderr
    assert str(out) in proc.stdout and "winner " + WINNER in proc.stdout, proc.stdout
    html = out.read_text()
    return html, BeautifulSoup(html, "html.parser")


def test_report_is_self_contained(sweep_report):
    html, soup = sweep_report
    assert network_references(html, soup) == []
    scripts = soup.find_all("script")
    assert all(not s.get("src") for s in scripts)
    assert any(len(s.string or "") > 1_000_000 and "Plotly" in s.string for s in scripts), "plotly.js is not inlined"


def test_learning_curves_carry_every_trial_its_stop_and_the_exploit(sweep_report):
    _, soup = sweep_report
    curves = figure_data(soup)["curves"]["data"]
    lines = {t["meta"]["trial_id"]: t for t in curves if "trial_id" in (t.get("meta") or {})}
    with_curves = {tid for tid, spec in TRIALS.items() if spec[1]}
    assert set(lines) == with_curves
    for tid in with_curves:
        f1 = TRIALS[tid][1]
        assert lines[tid]["x"] == list(range(1, len(f1) + 1))  # units trained: epoch index + 1
        assert lines[tid]["y"] == pytest.approx(f1)  # the spec's metric (f1), not accuracy or loss
    assert lines[WINNER]["name"] == f"{WINNER} (winner)"
    stops = {t["meta"]["stop_reason"]: t for t in curves if "stop_reason" in (t.get("meta") or {})}
    assert stops["early_stopped"]["text"] == [f"{TRIAL}_00002"] and stops["early_stopped"]["x"] == [2]
    assert stops["early_stopped"]["y"] == pytest.approx([0.33])
    assert stops["time_budget"]["text"] == [f"{TRIAL}_00004"] and stops["time_budget"]["x"] == [3]
    exploit = next(t for t in curves if (t.get("meta") or {}).get("events") == "exploit")
    assert exploit["customdata"] == [f"{TRIAL}_00003"] and exploit["x"] == [3]
    assert exploit["y"] == pytest.approx([0.81])  # on trial 3's curve, where it was exploited
    assert f"{TRIAL}_00001" in exploit["text"][0]


def test_parallel_coordinates_encode_categorical_and_list_params(sweep_report):
    _, soup = sweep_report
    parcoords = figure_data(soup)["parallel"]["data"][0]
    assert parcoords["type"] == "parcoords"
    ids = parcoords["meta"]["trial_ids"]
    scored = [tid for tid, spec in TRIALS.items() if spec[1]]
    assert sorted(ids) == sorted(scored)  # the failed trial reported nothing
    dims = {d["label"]: d for d in parcoords["dimensions"]}
    assert dims[METRIC]["values"] == pytest.approx([max(TRIALS[t][1]) for t in ids])
    hidden = dims["model.params.hidden_sizes"]
    assert hidden["ticktext"] == ["(unset)", "[64]", "[128, 64]"]
    assert [hidden["ticktext"][int(v)] for v in hidden["values"]] == [
        json.dumps(TRIALS[t][0]["model.params.hidden_sizes"]) if "model.params.hidden_sizes" in TRIALS[t][0] else "(unset)"
        for t in ids]
    lr = dims["log10 train.optimizer.lr"]  # 0.0005..0.09: a log axis
    for tid, value in zip(ids, lr["values"]):
        if "train.optimizer.lr" in TRIALS[tid][0]:
            assert 10 ** value == pytest.approx(TRIALS[tid][0]["train.optimizer.lr"])
    framework = dims["model.framework"]
    assert framework["ticktext"] == ["(unset)", "xgboost"]
    for d in parcoords["dimensions"]:
        assert all(isinstance(v, (int, float)) for v in d["values"]), d["label"]


def test_each_tuned_parameter_has_its_effect_panel(sweep_report):
    _, soup = sweep_report
    effects = figure_data(soup)["effects"]["data"]
    panels = {t["meta"]["param"]: t for t in effects}
    assert set(panels) == {"train.optimizer.lr", "model.params.hidden_sizes", "model.framework", "model.kind",
                           "model.params.max_depth"}
    lr = panels["train.optimizer.lr"]
    expected = {tid: (spec[0]["train.optimizer.lr"], max(spec[1])) for tid, spec in TRIALS.items()
                if spec[1] and "train.optimizer.lr" in spec[0]}
    assert dict(zip(lr["text"], zip(lr["x"], lr["y"]))) == pytest.approx(expected)
    hidden = panels["model.params.hidden_sizes"]
    assert dict(zip(hidden["text"], hidden["customdata"]))[WINNER] == "[128, 64]"


def test_decisions_show_where_each_trial_stopped_and_why(sweep_report):
    _, soup = sweep_report
    decisions = figure_data(soup)["decisions"]["data"]
    bars = {t["meta"]["stop_reason"]: dict(zip(t["y"], t["x"])) for t in decisions if t["type"] == "bar"}
    for tid, (_, _, _, reason, units, _, _) in TRIALS.items():
        assert bars[reason][tid] == units, (tid, reason)
    marks = next(t for t in decisions if t["type"] == "scatter")
    assert marks["y"] == [f"{TRIAL}_00003"] and marks["x"] == [3]
    rows = {tr.find_all("td")[0].text: [td.text for td in tr.find_all("td")] for tr in soup.select("table.decisions tbody tr")}
    assert rows[f"{TRIAL}_00002"][2:4] == ["early_stopped", "2"]
    assert "exploit from trial a1b2c_00001 at unit 3" in rows[f"{TRIAL}_00003"][5]
    assert rows[f"{TRIAL}_00005"][1:3] == ["error", "error"]


def test_family_leaderboard_and_winner_with_test_metrics(sweep_report):
    _, soup = sweep_report
    families = figure_data(soup)["families"]["data"][0]
    assert families["x"] == ["torch/mlp", "xgboost/gbdt"]
    assert families["y"] == pytest.approx([0.93, 0.83])
    assert families["meta"]["best_trials"] == [WINNER, f"{TRIAL}_00004"]
    board = [[td.text for td in tr.find_all("td")] for tr in soup.select("table.families tbody tr")]
    assert board == [["torch/mlp", "5", WINNER, "0.9300"], ["xgboost/gbdt", "1", f"{TRIAL}_00004", "0.8300"]]
    assert soup.select_one(".winner-id").text == WINNER
    params = {tr.find_all("td")[0].text: tr.find_all("td")[1].text for tr in soup.select("table.winner-params tbody tr")}
    assert params == {"model.params.hidden_sizes": "[128, 64]", "train.optimizer.lr": "0.012"}
    test = {tr.find_all("td")[0].text.rstrip(" *"): tr.find_all("td")[2].text for tr in soup.select("table.test-metrics tbody tr")}
    assert test == {k: f"{v:.4f}" for k, v in TEST.items()} | {"loss": "-"}


def test_by_name_reports_the_newest_sweep_and_old_runs_still_render(store, cli):
    root, runs = store
    # By name: the newest run of the pipeline is the plain (untuned) one; the newest sweep is reported.
    proc = cli["by-name"]
    assert proc.returncode == 0, proc.stderr
    assert runs["sweep"] in proc.stdout and str(cli["scratch"] / "by-name.html") in proc.stdout
    # An older run without stop reasons, events or families: a note instead of those figures.
    proc = cli["legacy"]
    assert proc.returncode == 0, proc.stderr
    default = root / "reports" / f"{PIPELINE}-{runs['legacy'][:8]}.html"
    assert default.is_file() and str(default) in proc.stdout
    soup = BeautifulSoup(default.read_text(), "html.parser")
    figures = figure_data(soup)
    assert set(figures) == {"curves", "parallel", "effects"}
    assert "did not record the scheduler's decisions" in soup.select_one("#section-decisions").text
    assert "no leaderboard" in soup.select_one("#section-families").text
    assert [t["meta"]["trial_id"] for t in figures["curves"]["data"]] == ["old00_00001", "old00_00000"]


@pytest.mark.parametrize("case", ERROR_CASES)
def test_errors_are_one_line(store, cli, case):
    _, runs = store
    expect = {
        "unknown-id": r"^error: report: unknown run id '0{32}' in sqlite:///\S+ \(allowed: a run id "
                      r"printed by `rayline run`, or a pipeline name: sweepy\)$",
        "unknown-name": r"^error: report: unknown run id or pipeline name 'nosuch' in sqlite:///\S+ "
                        r"\(allowed: .*pipeline name: sweepy\)$",
        "no-trials": rf"^error: report: run {runs['plain']} has no tuning trials .*\(allowed: the run "
                     r"id of a sweep, as `rayline run` prints it\)$",
        "unreachable": r"^error: MLflow \(http://127\.0\.0\.1:1\): cannot open the MLflow store: "
                       r"127\.0\.0\.1:1 does not answer",
        "no-store": r"^error: report: no MLflow store at \S+mlflow\.db \(allowed: ",
        "bad-output": r"^error: --output: no such directory '\S+missing' ",
        "version-without-live": r"^error: --version: only with --live \(got a sweep report of 'sweepy'; allowed: ",
        "live-bad-output": r"^error: --output: no such directory '\S+missing' ",
        "live-no-cluster": r"^error: .*127\.0\.0\.1:1",
    }[case]
    proc = cli[case]
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert re.search(expect, lines[0]), lines[0]
    if case == "no-store":
        assert not (cli["scratch"] / "empty" / "mlflow.db").exists()  # reading never creates a store


def test_run_pipeline_step_logs_the_report_and_never_fails_the_run(store, capsys):
    """`report_after_sweep`, what run_pipeline calls after registering a sweep: the report at
    its default path and in the run's artifacts; a report that cannot be written is one
    warning line and no path, never an exception (the model is registered by then)."""
    from rayline.registry import Registry
    from rayline.report import ARTIFACT_PATH, report_after_sweep
    from rayline.workspace import workspace

    root, runs = store
    registry = Registry(workspace(root))
    path = report_after_sweep(registry, runs["sweep"])
    assert path == str(root / "reports" / f"{PIPELINE}-{runs['sweep'][:8]}.html") and Path(path).is_file()
    assert [a.path for a in registry.client.list_artifacts(runs["sweep"], "report")] == [ARTIFACT_PATH]
    capsys.readouterr()
    assert report_after_sweep(registry, runs["plain"]) is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: the sweep report was not written: report: run "), err


@pytest.mark.parametrize("raw, kind, values, ticktext", [
    ([1, 2, 3], "numeric", [1.0, 2.0, 3.0], ["1", "2", "3"]),
    ([0.001, 0.1], "log", [-3.0, -1.0], ["0.001", "0.1"]),  # 100x span: log10
    ([0.5, None], "numeric", [0.5, 0.35], ["(unset)", "0.5"]),  # unset sits below the range
    ([[128, 64], [64], None], "categorical", [2.0, 1.0, 0.0], ["(unset)", "[64]", "[128, 64]"]),
    (["median", "mean", True], "categorical", [1.0, 0.0, 2.0], ["mean", "median", "true"]),
])
def test_parameters_are_encoded_for_parallel_coordinates(raw, kind, values, ticktext):
    from rayline.report.figures import encode_param

    axis = encode_param("p", raw)
    assert axis.kind == kind and axis.ticktext == ticktext
    assert axis.values == pytest.approx(values)
    assert axis.label == ("log10 p" if kind == "log" else "p")


def test_a_trial_run_id_names_its_sweep(store):
    from rayline.registry import Registry
    from rayline.report import load_sweep
    from rayline.workspace import workspace

    root, runs = store
    registry = Registry(workspace(root))
    sweep = load_sweep(registry, runs["sweep"])
    assert (sweep.metric, sweep.mode, sweep.version, sweep.winner.trial_id) == (METRIC, "max", "2", WINNER)
    assert load_sweep(registry, sweep.trials[0].run_id).run_id == runs["sweep"]
