"""The `rayline` command: parse, load the spec, call one library function, render.

Heavy imports (Ray, MLflow, frameworks) happen inside commands, so `rayline --help` is fast.
Every `RaylineError` is printed as a message with its exit code; never a traceback.

One module per command group (`run`, `predict`, `models`, `cluster`, `serve`, `jobs`, `cache`),
the Typer apps in `apps`, shared options in `options`, shared renderings in `render`; importing
this package registers every command. `main` is the entry point: one line per error, never a
traceback.
"""

from __future__ import annotations

import os
import sys

from rayline.cli.apps import app
from rayline.cli.render import shown
from rayline.console import err_console, styled
from rayline.errors import RaylineError

# Each module registers its commands on the apps when imported, in the order `rayline --help` lists them.
from rayline.cli import run, predict, models, cluster, serve, retrain, jobs, cache  # noqa: E402,F401,I001

__all__ = ["app", "main", "entry"]


def _debug() -> bool:
    """RAYLINE_DEBUG=1 (or true/yes): print the full exception chain before the one-line error."""
    return os.environ.get("RAYLINE_DEBUG", "").strip().lower() in ("1", "true", "yes", "on")


def _print_chain(exc: BaseException) -> None:
    import traceback

    err_console.print(shown("".join(traceback.format_exception(exc)).rstrip()))


def _environment_fault(exc: RaylineError) -> str | None:
    """The one-line environment message (rayline.faults) for a fault anywhere in a rayline error's
    chain: a TrainingError raised from a worker lost with its node or a full disk says that and what
    to do, not "training failed: <Ray's text>". An EnvironmentFault already is that line; an
    interrupted run is the user's doing."""
    from rayline.errors import EnvironmentFault, InterruptedRun

    if isinstance(exc, (EnvironmentFault, InterruptedRun)):
        return None
    from rayline.faults import describe_fault

    return describe_fault(exc)


def main() -> None:
    import time

    from rayline.cli import apps
    from rayline.signals import stop_on_sigterm

    apps.ENTERED_AT = time.time()  # the CLI's start, for `rayline run --timings`

    stop_on_sigterm()  # SIGTERM (docker stop, Kubernetes, `ray job stop`) stops every command as Ctrl-C does
    try:
        app()
    except RaylineError as exc:
        if _debug():
            _print_chain(exc)
        fault = _environment_fault(exc)
        if fault is not None:
            from rayline.errors import EnvironmentFault

            err_console.print(styled(("error:", "red"), " " + shown(fault)))
            sys.exit(EnvironmentFault.exit_code)
        err_console.print(styled(("error:", "red"), " " + shown(str(exc))))
        sys.exit(exc.exit_code)
    except KeyboardInterrupt as exc:
        if _debug():
            _print_chain(exc)
        err_console.print("interrupted")
        sys.exit(130)
    except Exception as exc:  # a bug in rayline or a library it calls: one line, the chain on request
        from rayline.faults import describe_fault

        fault = describe_fault(exc)
        if fault is not None:  # the machine or the cluster failed, not rayline: what happened, what to do
            if _debug():
                _print_chain(exc)
            err_console.print(styled(("error:", "red"), " " + shown(fault)))
            sys.exit(1)
        if _debug():
            _print_chain(exc)
            err_console.print(styled(("internal error:", "red"), shown(f" {type(exc).__name__}: {exc}")))
        else:
            err_console.print(styled(("internal error:", "red"), shown(f" {type(exc).__name__}: {exc}"),
                                     " (set RAYLINE_DEBUG=1 for the traceback, and please report it)"))
        sys.exit(1)


def _join_threads_as_python_does() -> None:
    """What the interpreter does first at exit (threading._shutdown): threading's own exit hooks,
    then every non-daemon thread joined. The hooks come first for a reason: concurrent.futures'
    wakes the idle workers of every thread pool still alive, which otherwise wait for work forever.
    Joining before them hung `rayline run --no-serve` after its last line whenever MLflow's artifact
    pool (pyfunc save_model's download, in the register stage) had not been garbage-collected yet."""
    import threading

    shutdown = getattr(threading, "_shutdown", None)  # CPython 3.8-3.13
    if shutdown is not None:
        shutdown()
        return
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()


def entry() -> None:
    """The process's entry point (`rayline`, `python -m rayline.cli`): `main`, then a prompt exit.

    After `main` the process ends as Python would end it (non-daemon threads joined, atexit handlers
    run, the standard streams flushed) but without the interpreter's finalization, which tore down
    Ray's core worker, torch, Arrow and some thousand modules for 1.8-2.3 s after `rayline run` had
    printed its last line (2-core box, 2026-11-29). `main` itself returns, for callers in a process
    that goes on (tests/cli.py)."""
    import atexit

    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)  # sys.exit("message"), as Python prints it
        code = 1
    _join_threads_as_python_does()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # a closed pipe: nothing more to say on it
    os._exit(code or 0)
