"""`rayline ARGS` run in this process: the same entry point (`rayline.cli.main`), its exit code and
what it printed to stdout and stderr, without a new Python's 2-5 s of start-up and imports.

    from tests.cli import rayline
    done = rayline("validate", "spec.yaml", cwd=tmp_path)   # a subprocess.CompletedProcess
    assert done.returncode == 2 and "train.epocs" in done.stderr

Tests that check what only a separate process shows (a command's import time, signals, a Ray the
command starts and stops itself, an environment that must not leak) keep `python -m rayline.cli`;
the suite keeps at least one real subprocess per command family (predict: test_client.py and
test_batch_scoring.py's `auto`; models: test_lineage.py; serve: test_serve_access.py; validate:
test_cli_output.py; run: test_elastic.py, test_cluster.py).

In the session-Ray lane a command that needs Ray joins the session's Ray (rayline.cluster.connection
.connect reuses an initialized Ray and leaves it running), as `rayline ... --address` would.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
from pathlib import Path

__all__ = ["rayline"]


@contextlib.contextmanager
def _environment(env: dict | None):
    if env is None:
        yield
        return
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update({k: str(v) for k, v in env.items()})
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def rayline(*args, cwd: str | Path | None = None, env: dict | None = None, extra_env: dict | None = None,
            stdin: str = "") -> subprocess.CompletedProcess:
    """Run `rayline *args` in this process as the console script would. `env` replaces the environment
    for the call (as subprocess's env= does), `extra_env` adds to it; both are restored afterwards, as
    are the working directory, sys.argv, stdin and the SIGTERM handler `main` installs."""
    from rayline.cli import main
    from rayline.console import console, err_console

    argv = ["rayline", *map(str, args)]
    out, err = io.StringIO(), io.StringIO()
    code = 0
    saved_argv, saved_stdin, saved_cwd = sys.argv, sys.stdin, os.getcwd()
    saved_sigterm = signal.getsignal(signal.SIGTERM)
    full_env = None if env is None and extra_env is None else {**(os.environ if env is None else env), **(extra_env or {})}
    # rich fixes a console's width from COLUMNS when the console is made (at rayline.console's import,
    # in whichever call or test imported it first): each call gets the width its own COLUMNS asks for,
    # as a new process would (a table laid out at another call's width failed a test under xdist).
    columns = (os.environ if full_env is None else full_env).get("COLUMNS", "")
    saved_widths = [(c, c._width) for c in (console, err_console)]
    for c, _ in saved_widths:
        c._width = int(columns) if columns.isdigit() else None
    try:
        with _environment(full_env), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            if cwd is not None:
                os.chdir(cwd)
            sys.argv, sys.stdin = argv, io.StringIO(stdin)
            try:
                main()
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                if isinstance(exc.code, str):  # sys.exit("message") prints it, as Python does
                    err.write(exc.code + "\n")
    finally:
        sys.argv, sys.stdin = saved_argv, saved_stdin
        os.chdir(saved_cwd)
        signal.signal(signal.SIGTERM, saved_sigterm)
        for c, width in saved_widths:
            c._width = width
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())
