"""The CLI prints user text as written (no rich markup) and one line per error, the chain on request."""

import os
import subprocess
import sys

import pytest
import typer

from rayline import cli
from rayline.cli.run import print_summary
from rayline.console import console
from rayline.errors import DataError
from rayline.pipeline.summary import RunSummary
from tests.cli import rayline as rayline_in_process


def rayline(*args, cwd, env=None):
    """The command in this process (tests/cli.py): what it prints through rayline's consoles."""
    return rayline_in_process(*args, cwd=cwd, extra_env=env)


def rayline_process(*args, cwd):
    """The command in a process of its own: what reaches its terminal from other libraries' loggers,
    which hold the process's real stderr, shows only there."""
    return subprocess.run([sys.executable, "-m", "rayline.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env=dict(os.environ))


def test_markup_in_a_spec_name_is_printed_as_written(tmp_path):
    (tmp_path / "s.yaml").write_text('name: "[/x]"\n')
    out = rayline_process("validate", "s.yaml", cwd=tmp_path)  # validate's own process check
    assert out.returncode == 2
    assert "got '[/x]'" in out.stderr
    assert "Traceback" not in out.stderr and "MarkupError" not in out.stderr


def test_markup_in_a_column_name_is_printed_as_written(tmp_path):
    (tmp_path / "rows.csv").write_text("a,y\n1,0\n2,1\n3,0\n4,1\n5,0\n6,1\n7,0\n8,1\n9,0\n10,1\n")
    (tmp_path / "s.yaml").write_text(
        "name: markup\ndata:\n  source: {format: csv, path: rows.csv}\n  label: y\n  features: ['[bold]', '[/]']\n"
        "model: {framework: xgboost, kind: gbdt}\n")
    out = rayline("validate", "s.yaml", cwd=tmp_path)
    assert out.returncode == 2
    assert "[bold]" in out.stderr and "[/]" in out.stderr
    assert "Traceback" not in out.stderr


def test_markup_in_an_option_value_is_printed_as_written(tmp_path):
    out = rayline("predict", "/x", "-o", "[/]", cwd=tmp_path)
    assert out.returncode != 0
    assert "got '[/]'" in out.stderr
    assert "Traceback" not in out.stderr


def test_run_summary_prints_markup_like_names_verbatim():
    summary = RunSummary(name="[/a]", version="[bold]1", task="classification", metric="accuracy",
                         valid_metrics={"accuracy": 0.5}, test_metrics={"accuracy": 0.5, "[red]x": 1.0},
                         endpoint="http://127.0.0.1:1/[/]", run_id="[/run]")
    with console.capture() as captured:
        print_summary(summary, spec=None)
    text = captured.get()
    for raw in ("[/a]", "[bold]1", "[red]x", "http://127.0.0.1:1/[/]", "[/run]"):
        assert raw in text, raw


def test_a_pbt_winners_restarts_are_not_called_worker_failures():
    from rayline.spec import parse_spec

    raw = {"name": "p", "data": {"source": {"format": "sklearn", "name": "iris"}, "label": "target"},
           "model": {"framework": "torch", "kind": "mlp"},
           "tune": {"scheduler": {"pbt": {"perturbation_interval": 2}}, "space": {"train.optimizer.lr": {"loguniform": [1e-3, 1e-1]}}}}
    summary = RunSummary(name="p", version="1", task="classification", metric="accuracy", valid_metrics={"accuracy": 0.9},
                         test_metrics={"accuracy": 0.9}, run_id="r", resumed_from=[5])
    for scheduler, expected in (({"pbt": {"perturbation_interval": 2}}, "restarts (PBT pauses and exploits, or worker failures)"),
                                ("asha", "worker failures: training restarted from the checkpoints of epochs [5]")):
        spec = parse_spec({**raw, "tune": {**raw["tune"], "scheduler": scheduler}})
        with console.capture() as captured:
            print_summary(summary, spec=spec)
        assert expected in captured.get()


def _run_main(monkeypatch, capsys, exc_factory, debug: bool):
    probe = typer.Typer()

    @probe.command()
    def boom() -> None:
        raise exc_factory()

    monkeypatch.setattr(cli, "app", probe)
    monkeypatch.setattr(sys, "argv", ["rayline"])
    if debug:
        monkeypatch.setenv("RAYLINE_DEBUG", "1")
    else:
        monkeypatch.delenv("RAYLINE_DEBUG", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    return exit_info.value.code, capsys.readouterr().err


def _chained_data_error():
    try:
        {}["missing-column"]
    except KeyError as cause:
        try:
            raise DataError("rows.csv: column 'missing-column' not found") from cause
        except DataError as exc:
            return exc


def test_a_rayline_error_is_one_line_by_default(monkeypatch, capsys):
    code, err = _run_main(monkeypatch, capsys, _chained_data_error, debug=False)
    assert code == DataError.exit_code
    assert err.strip() == "error: rows.csv: column 'missing-column' not found"


def test_rayline_debug_prints_the_whole_chain(monkeypatch, capsys):
    code, err = _run_main(monkeypatch, capsys, _chained_data_error, debug=True)
    assert code == DataError.exit_code
    assert "KeyError: 'missing-column'" in err
    assert "direct cause of the following exception" in err
    assert err.strip().endswith("error: rows.csv: column 'missing-column' not found")


def test_an_unexpected_exception_is_one_line_with_a_hint(monkeypatch, capsys):
    code, err = _run_main(monkeypatch, capsys, lambda: ZeroDivisionError("division by zero"), debug=False)
    assert code == 1
    assert "Traceback" not in err
    assert "internal error: ZeroDivisionError: division by zero" in err and "RAYLINE_DEBUG=1" in err
    code, err = _run_main(monkeypatch, capsys, lambda: ZeroDivisionError("division by zero"), debug=True)
    assert "Traceback" in err and "ZeroDivisionError" in err


def test_a_long_error_stays_one_line_when_output_is_not_a_terminal(tmp_path):
    long_name = "x" * 150
    (tmp_path / "s.yaml").write_text(f'name: "{long_name}"\n')
    out = rayline("validate", "s.yaml", cwd=tmp_path)
    assert out.returncode == 2
    line = next(ln for ln in out.stderr.splitlines() if ln.lstrip().startswith("name:"))
    assert long_name in line and line.rstrip().endswith(")")


def test_errors_never_show_the_tracking_uri_password(monkeypatch, capsys):
    uri = "postgresql://mlflow:s3cret-pw@127.0.0.1:1/mlflow"
    monkeypatch.setenv("RAYLINE_TRACKING_URI", uri)

    def leak():
        return ConnectionError(f"could not connect to {uri} (password s3cret-pw rejected)")

    for debug in (False, True):
        code, err = _run_main(monkeypatch, capsys, leak, debug=debug)
        assert code == 1
        assert "s3cret-pw" not in err
        assert "postgresql://mlflow:***@127.0.0.1:1/mlflow" in err


def test_models_on_a_fresh_workspace_prints_only_its_answer(tmp_path):
    out = rayline_process("models", "-w", str(tmp_path / "ws"), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "no registered models yet: run `rayline run SPEC`"
    assert "INFO" not in out.stderr and "Creating initial MLflow database tables" not in out.stderr, out.stderr


def test_ray_datas_no_cpus_warning_stays_out_of_the_terminal():
    """Ray Data warns that "the Ray cluster currently does not have any available CPUs" at the first
    read on a freshly started embedded Ray; rayline keeps that one (only) off the terminal."""
    import logging

    from rayline.cluster.env import quiet_driver_logs

    quiet_driver_logs()
    terminal = [h for h in logging.getLogger("ray.data").handlers if "File" not in type(h).__name__]
    assert terminal

    def record(message):
        return logging.LogRecord("ray.data.dataset", logging.WARNING, __file__, 1, message, None, None)

    no_cpus = record("Warning: The Ray cluster currently does not have any available CPUs. The Dataset job will hang "
                     "unless more CPUs are freed up.")
    other = record("Warning: some other problem with the dataset")
    assert not any(h.filter(no_cpus) for h in terminal)
    assert all(h.filter(other) for h in terminal)


def test_the_raylets_worker_count_notices_stay_out_of_the_terminal(capsys):
    """Ray prints the raylet's error-channel messages whatever log_to_driver says; the "N PYTHON worker
    processes have been started" notices (five in the quick start on 2 cores) and Serve's controller
    killed on Ctrl-C go to rayline's log,
    every other raylet message still reaches the terminal. Ray's own printer, called as Ray's
    listener thread calls it."""
    import ray._private.worker as ray_worker

    from rayline.cluster.env import quiet_driver_logs

    quiet_driver_logs()
    quiet_driver_logs()  # wrapped once, however often it is called
    assert ray_worker.print_to_stdstream._rayline_filtered
    notice = ("WARNING: 10 PYTHON worker processes have been started on node: abc with address: 10.0.0.1. This "
              "could be a result of using a large number of actors, or due to tasks blocked in ray.get() calls.")
    ray_worker.print_to_stdstream({"lines": [notice], "pid": "raylet", "is_err": False}, ignore_prefix=False)
    # On Ctrl-C while serving: Serve's controller killed by the shutdown rayline asked for.
    shutdown = ("Task ServeController.graceful_shutdown failed. There are infinite retries remaining, so the task "
                "will be retried. Error: The actor is dead because it was killed by `ray.kill`.")
    ray_worker.print_to_stdstream({"lines": [shutdown], "pid": "raylet", "is_err": False}, ignore_prefix=False)
    killed = "A worker died or was killed while executing a task by an unexpected system error (OOM)."
    ray_worker.print_to_stdstream({"lines": [killed], "pid": "raylet", "is_err": False}, ignore_prefix=False)
    out = capsys.readouterr().out
    assert "PYTHON worker processes" not in out and "graceful_shutdown" not in out and killed in out, out


def test_quieting_the_drivers_logs_does_not_import_serve_and_quiets_it_once_imported():
    """A run that does not serve never imports Ray Serve (0.65 s of every run's start when the quieting
    imported it); one that does gets Serve's driver logger at WARNING, although Serve sets it to INFO
    as it is imported. A fresh interpreter: this one may have imported Serve already."""
    import subprocess
    import sys

    code = ("import logging, sys; from rayline.cluster.env import quiet_driver_logs; quiet_driver_logs(); "
            "print('ray.serve' in sys.modules); import ray.serve; "
            "print(logging.getLevelName(logging.getLogger('ray.serve').level)); "
            "quiet_driver_logs(); print(logging.getLevelName(logging.getLogger('ray.serve').level))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "WARNING", "WARNING"], done.stdout + done.stderr[-2000:]
