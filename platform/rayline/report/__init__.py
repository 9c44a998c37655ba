"""The sweep report: one self-contained HTML page of a sweep, read back from MLflow.

`rayline report RUN_ID|NAME` and `run_pipeline` (after registering a sweep) call
`write_report`; the modules: `sweep` reads the pipeline run and its trial runs, `figures`
builds the plotly figures, `page` assembles and writes the HTML.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rayline.errors import RaylineError, RegistryError
from rayline.report.page import FIGURE_IDS, render_html, write_html
from rayline.report.sweep import Sweep, Trial, load_sweep

__all__ = [
    "ARTIFACT_PATH",
    "FIGURE_IDS",
    "Report",
    "Sweep",
    "Trial",
    "default_path",
    "load_sweep",
    "make_reports_dir",
    "open_store",
    "report_after_sweep",
    "write_report",
]

# Where the report goes in the MLflow run's artifacts: a stable name, so links and tools find it.
ARTIFACT_PATH = "report/sweep_report.html"


@dataclass
class Report:
    path: Path
    sweep: Sweep
    figures: list  # ids of the figures drawn (FIGURE_IDS order)
    bytes: int
    seconds: float


def default_path(ws, sweep: Sweep) -> Path:
    """`<workspace>/reports/<pipeline>-<run id, 8 characters>.html`."""
    return Path(ws.root) / "reports" / f"{sweep.name}-{sweep.run_id[:8]}.html"


def open_store(ws):
    """The workspace's Registry for reading, without creating a store that is not there.

    A default SQLite store that does not exist yet means the workspace has no runs: opening
    it would create an empty database, so that is an error naming the path instead.
    """
    from rayline.registry import Registry, sqlite_path

    db = sqlite_path(ws.tracking_uri)
    if db is not None and not db.is_file():
        raise RegistryError(f"report: no MLflow store at {db} (allowed: the workspace of a `rayline run`, "
                            "chosen with --workspace or RAYLINE_WORKSPACE)")
    return Registry(ws)


def make_reports_dir(path: Path) -> None:
    """The folder of a report written to its default path in the workspace."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RaylineError(f"report: cannot create {path.parent}: {exc.strerror or exc} "
                           "(allowed: a writable workspace, or --output FILE)") from exc


def write_report(registry, target: str, output: str | os.PathLike | None = None) -> Report:
    """Write the report of sweep `target` (a pipeline run id, or a pipeline name: its newest
    run with tuning trials) to `output` (default: `default_path`)."""
    t0 = time.monotonic()
    if output is not None and not Path(output).parent.is_dir():  # before minutes of reading, not after
        raise RaylineError(f"--output: no such directory {str(Path(output).parent)!r} (got {str(output)!r})")
    sweep = load_sweep(registry, target)
    text, drawn = render_html(sweep)
    path = Path(output) if output is not None else default_path(registry.ws, sweep)
    if output is None:
        make_reports_dir(path)
    write_html(text, path)
    return Report(path=path, sweep=sweep, figures=drawn, bytes=len(text.encode("utf-8")), seconds=time.monotonic() - t0)


def report_after_sweep(registry, run_id: str) -> str | None:
    """`run_pipeline`'s step after registering a sweep: write the report to its default path
    and log it as the MLflow run's artifact `ARTIFACT_PATH`. Returns its path; a failure is
    one warning line on stderr and None, never a failed run (the model is registered)."""
    try:
        report = write_report(registry, run_id)
        staging = registry.ws.temp_dir("report")
        try:
            folder, name = os.path.split(ARTIFACT_PATH)
            shutil.copyfile(report.path, os.path.join(staging, name))
            with registry._guard(f"log the sweep report of run {run_id}"):
                registry.client.log_artifact(run_id, os.path.join(staging, name), artifact_path=folder)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return str(report.path)
    except Exception as exc:  # noqa: BLE001 - the report is a by-product: the run succeeded
        line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"warning: the sweep report was not written: {line}", file=sys.stderr)
        return None
