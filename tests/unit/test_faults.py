"""Failures of the environment get one line saying what happened and what to do (rayline.faults);
rayline's own bugs keep "internal error". The OS errors are real ones where the OS gives them to a
root user (a write to /dev/full, a removed working directory)."""

import errno
import os
import subprocess
import sys

import pytest

from rayline.faults import describe_fault


def _real_enospc() -> OSError:
    try:
        with open("/dev/full", "w") as fh:
            fh.write("x" * 10)
            fh.flush()
    except OSError as exc:
        return exc
    raise AssertionError("/dev/full took a write")


def test_a_full_disk_names_the_file_and_what_to_do():
    exc = _real_enospc()
    assert exc.errno == errno.ENOSPC
    text = describe_fault(exc)
    assert text.startswith("no space left on the disk") and "--workspace" in text


def test_a_read_only_workspace_names_the_path():
    exc = OSError(errno.EROFS, os.strerror(errno.EROFS), "/ws/mlflow/mlflow.db")
    text = describe_fault(exc)
    assert text.startswith("cannot write (/ws/mlflow/mlflow.db): Read-only file system") and "--workspace" in text


@pytest.mark.parametrize("code", [errno.EACCES, errno.EPERM])
def test_a_permission_error_names_the_path_whether_read_or_write(code):
    """A denied read (the data, a token file) is as likely as a denied write: not called 'cannot write'."""
    exc = OSError(code, os.strerror(code), "/ws/mlflow/mlflow.db")
    text = describe_fault(exc)
    assert text.startswith(f"permission denied (/ws/mlflow/mlflow.db): {os.strerror(code)}") and "--workspace" in text


def test_the_fault_is_found_under_other_exceptions():
    """As a library raises it: wrapped, with the OS error as the cause or the context."""
    try:
        try:
            raise OSError(errno.EROFS, "Read-only file system", "/ws/runs")
        except OSError as inner:
            raise RuntimeError("could not save the checkpoint") from inner
    except RuntimeError as outer:
        assert "Read-only file system" in describe_fault(outer)


def test_lost_ray_node_or_connection_says_how_to_resume():
    import ray.exceptions

    text = describe_fault(ray.exceptions.NodeDiedError("node 10.0.0.3 died"))
    assert text.startswith("lost a Ray node or the connection to the Ray cluster") and "rayline resume" in text


@pytest.mark.parametrize("exc", [ValueError("bad"), KeyError("x"), FileNotFoundError(2, "No such file", "/data/x.csv"),
                                 OSError(errno.ECONNRESET, "reset")])
def test_rayline_bugs_and_other_errors_are_not_called_environment_faults(exc):
    assert describe_fault(exc) is None


def test_a_removed_working_directory(tmp_path):
    """The cwd removed under a running process: os.getcwd() raises FileNotFoundError, named as such."""
    gone = tmp_path / "gone"
    gone.mkdir()
    code = ("import os, sys; os.chdir(sys.argv[1]); os.rmdir(sys.argv[1]);\n"
            "from rayline.faults import describe_fault\n"
            "try:\n    os.getcwd()\nexcept FileNotFoundError as exc:\n    print(describe_fault(exc))\n")
    out = subprocess.run([sys.executable, "-c", code, str(gone)], capture_output=True, text=True, timeout=60)
    assert out.stdout.startswith("the working directory was removed"), out.stdout + out.stderr


# Through the CLI's error handler, with the exception chains rayline really raises: a Ray Train
# failure becomes TrainingError("training failed ...: <Ray's text>") raised from Ray's error, which
# holds the worker's own exception in an attribute, not as its cause.

def _cli_main(monkeypatch, capsys, exc: BaseException):
    import typer

    from rayline import cli

    probe = typer.Typer()

    @probe.command()
    def boom() -> None:
        raise exc

    monkeypatch.setattr(cli, "app", probe)
    monkeypatch.setattr(sys, "argv", ["rayline"])
    monkeypatch.delenv("RAYLINE_DEBUG", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    err = capsys.readouterr().err
    assert "internal error" not in err and "please report" not in err and "Traceback" not in err, err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return exit_info.value.code, err


def _raised(outer_factory, inner: BaseException) -> BaseException:
    """`outer_factory(inner)` raised from `inner`, as an except clause does."""
    try:
        try:
            raise inner
        except BaseException as cause:
            raise outer_factory(cause) from cause
    except BaseException as exc:
        return exc


def test_a_training_error_from_a_full_disk_is_the_disk_line(monkeypatch, capsys):
    from rayline.errors import TrainingError

    exc = _raised(lambda cause: TrainingError(f"training failed: {cause}"), _real_enospc())
    code, err = _cli_main(monkeypatch, capsys, exc)
    assert code == 1 and err.startswith("error: no space left on the disk: No space left on device; free space"), err


def test_a_worker_lost_with_its_node_inside_ray_trains_error(monkeypatch, capsys):
    """Ray Train V2: WorkerGroupError.worker_failures[rank] = WorkerHealthCheckFailedError(ActorDiedError),
    whose context says the node died; train/run.py raises TrainingError from the WorkerGroupError."""
    from ray.core.generated.common_pb2 import ActorDiedErrorContext
    from ray.exceptions import ActorDiedError
    from ray.train.v2._internal.exceptions import WorkerHealthCheckFailedError
    from ray.train.v2.api.exceptions import WorkerGroupError

    from rayline.errors import TrainingError

    died = ActorDiedError(ActorDiedErrorContext(
        error_message="The actor died because its node has died. Node Id: 0a1b2c", actor_id=b"\x01" * 16,
        class_name="RayTrainWorker", node_ip_address="10.0.0.3"))
    group = WorkerGroupError("[Rank 0]: health check failed",
                             {0: WorkerHealthCheckFailedError("health check failed", failure=died)})
    exc = _raised(lambda cause: TrainingError(f"training failed after 0 retries (train.max_failures): {cause}"), group)
    code, err = _cli_main(monkeypatch, capsys, exc)
    assert code == 1, err
    assert err.startswith("error: lost a Ray node or the connection to the Ray cluster mid-run (ActorDiedError: "
                          "The actor died because its node has died. Node Id: 0a1b2c)"), err
    assert "rayline resume RUN_ID" in err


def test_a_controller_error_holding_a_read_only_file_system(monkeypatch, capsys):
    from ray.train.v2.api.exceptions import ControllerError

    from rayline.errors import TrainingError

    controller = ControllerError(OSError(errno.EROFS, "Read-only file system", "/ws/runs/exp/checkpoint_000001"))
    exc = _raised(lambda cause: TrainingError(f"training failed: {cause}"), controller)
    code, err = _cli_main(monkeypatch, capsys, exc)
    assert code == 1 and err.startswith("error: cannot write (/ws/runs/exp/checkpoint_000001): Read-only"), err


def test_a_data_error_from_a_ray_task_whose_node_died(monkeypatch, capsys):
    """Ray Data hands the driver RayTaskError(NodeDiedError): the node is found through `cause`."""
    import ray.exceptions as rex

    from rayline.errors import DataError

    died = rex.NodeDiedError("node 10.0.0.3 died")
    task = rex.RayTaskError("ReadCSV->Map", "Traceback ...", died).as_instanceof_cause()
    exc = _raised(lambda cause: DataError(f"iris.csv: cannot read: {cause}"), task)
    code, err = _cli_main(monkeypatch, capsys, exc)
    assert code == 1 and err.startswith("error: lost a Ray node or the connection to the Ray cluster mid-run"), err


def test_rayline_errors_without_a_fault_keep_their_message_and_exit_code(monkeypatch, capsys):
    from rayline.errors import ClusterError, DataError

    exc = _raised(lambda cause: DataError("rows.csv: column 'x' not found"), KeyError("x"))
    assert _cli_main(monkeypatch, capsys, exc) == (2, "error: rows.csv: column 'x' not found\n")
    # `raise ... from None` hides the context on purpose: a refused port is not a full disk.
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise ClusterError("no Ray cluster answers at 127.0.0.1:1 (refused)") from None
    except ClusterError as hidden:
        assert _cli_main(monkeypatch, capsys, hidden) == (1, "error: no Ray cluster answers at 127.0.0.1:1 (refused)\n")


def test_an_environment_fault_outside_rayline_errors_is_not_an_internal_error(monkeypatch, capsys):
    import ray.exceptions as rex

    code, err = _cli_main(monkeypatch, capsys, rex.RayTaskError("f", "tb", _real_enospc()).as_instanceof_cause())
    assert code == 1 and err.startswith("error: no space left on the disk"), err
