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


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES, errno.EPERM])
def test_a_read_only_or_unwritable_workspace_names_the_path(code):
    exc = OSError(code, os.strerror(code), "/ws/mlflow/mlflow.db")
    text = describe_fault(exc)
    assert text.startswith("cannot write (/ws/mlflow/mlflow.db)") and os.strerror(code) in text


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
