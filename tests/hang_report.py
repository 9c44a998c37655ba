"""A command a test waits for, and where it was stuck when it outlived its time.

A CLI run that hangs on a CI machine is gone by the time anyone reads the log: `subprocess.run`'s
TimeoutExpired says only that it took too long. `run_or_report` runs the command the same way and,
when the time is up, records the Python stacks of the command and of its Python descendants
(py-spy, as `ray stack` does), kills the process tree, and fails the test with those stacks and
the output so far.

    from tests.hang_report import run_or_report
    done = run_or_report([sys.executable, "-m", "rayline.cli", "run", ...], timeout=420, cwd=project)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import psutil
import pytest

__all__ = ["run_or_report", "stacks_of"]

_MAX_STACK_CHARS = 6000  # per process: Ray's own threads fill pages
_MAX_PROCESSES = 6


def stacks_of(pid: int) -> str:
    """py-spy's dump of every thread of `pid` and of its Python descendants (at most a few)."""
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=os.path.dirname(sys.executable))
    if spy is None:
        return "(py-spy is not installed: no stacks)"
    try:
        root = psutil.Process(pid)
        family = [root, *root.children(recursive=True)]
    except psutil.Error:
        return f"(process {pid} is gone)"
    dumps = []
    for proc in [p for p in family if _is_python(p)][:_MAX_PROCESSES]:
        try:
            dump = subprocess.run([spy, "dump", "--pid", str(proc.pid)], capture_output=True, text=True, timeout=30)
            text = (dump.stdout or dump.stderr).strip()
        except subprocess.TimeoutExpired:
            text = "(py-spy timed out)"
        dumps.append(f"--- pid {proc.pid}: {' '.join(_cmdline(proc))[:200]}\n{text[:_MAX_STACK_CHARS]}")
    return "\n".join(dumps) or "(no Python process left)"


def run_or_report(cmd: list[str], *, timeout: float, **popen_kwargs) -> subprocess.CompletedProcess:
    """subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, ...), except that a
    command still running at `timeout` fails the test with its stacks and what it printed."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen_kwargs)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stacks = stacks_of(proc.pid)
        _kill_tree(proc.pid)
        out, err = proc.communicate()
        pytest.fail(f"still running after {timeout:g} s: {' '.join(map(str, cmd))}\n"
                    f"stdout (last 3000):\n{out[-3000:]}\nstderr (last 3000):\n{err[-3000:]}\n"
                    f"where it was:\n{stacks}", pytrace=False)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _kill_tree(pid: int) -> None:
    try:
        root = psutil.Process(pid)
        family = [*root.children(recursive=True), root]
    except psutil.Error:
        return
    for proc in family:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(family, timeout=10)


def _cmdline(proc) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:
        return []


def _is_python(proc) -> bool:
    """A Python interpreter, or a Ray worker (its title is `ray::TASK_OR_ACTOR`)."""
    line = _cmdline(proc)
    return bool(line) and ("python" in line[0].rsplit("/", 1)[-1] or line[0].startswith("ray::"))
