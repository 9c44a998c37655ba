"""tests/hang_report.py: a command that outlives its time fails the test with where it was stuck."""

import sys

import psutil
import pytest

from ..hang_report import run_or_report

_STUCK = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(child.pid, flush=True)
def waiting_for_the_cluster():
    time.sleep(120)
waiting_for_the_cluster()
"""


def test_a_command_past_its_time_fails_with_its_stacks_and_output_and_leaves_no_process():
    with pytest.raises(pytest.fail.Exception) as failed:
        run_or_report([sys.executable, "-c", _STUCK], timeout=4)
    report = str(failed.value)
    assert report.startswith("still running after 4 s:")
    assert "waiting_for_the_cluster (<string>:" in report, report  # the stuck function, from py-spy
    child = int(report.split("stdout (last 3000):\n", 1)[1].split()[0])
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


def test_a_command_in_time_is_subprocess_runs_result():
    done = run_or_report([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"],
                         timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")
