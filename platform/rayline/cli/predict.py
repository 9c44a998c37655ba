"""`rayline predict`: a served model over HTTP, or offline batch scoring of a dataset."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from rayline.cli.apps import app
from rayline.cli.options import WorkspaceOpt, open_workspace
from rayline.console import console, err_console
from rayline.errors import RaylineError


@app.command()
def predict(
    target: str = typer.Argument(..., metavar="ROUTE_OR_URL_OR_NAME", help="A /route on this machine's Serve or an "
                                 "http(s):// URL: query the served model online. A registered model NAME (no leading "
                                 "/): score --input offline (in this process, or with Ray Data on a cluster: --engine) into "
                                 "--output FILE.parquet."),
    json_body: Optional[str] = typer.Option(None, "--json", help='Instances as JSON: \'{"instances": [...]}\' or a list of rows.'),
    input_file: Optional[Path] = typer.Option(None, "--input", help="Rows from a file in any format training reads: .csv, .parquet/.pq, "
                                              ".json (an array of rows, or JSON Lines), .jsonl/.ndjson; offline also a "
                                              "directory of such files."),
    probabilities: bool = typer.Option(False, "--probabilities", help="Also return class probabilities."),
    output: str = typer.Option("table", "--output", "-o", help="table | json: print the answer; any other value is a file "
                               "to write the predictions to (online: .parquet, .csv, .json/.jsonl; offline: .parquet)."),
    version: Optional[str] = typer.Option(None, "--version", help="With a NAME: the registered version (default: the champion alias, else the newest). "
                                          "With a route or URL: ask that deployed version (ROUTE/v/N)."),
    keep: Optional[List[str]] = typer.Option(None, "--keep", help="Input column copied into an output file, e.g. an id "
                                             "(repeat for several; default: every input column)."),
    workspace: Optional[Path] = WorkspaceOpt,
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="RAYLINE_API_KEY", show_envvar=True,
                                          help="API key of a model served with serve.auth (sent as a Bearer token)."),
    host: str = typer.Option("127.0.0.1", help="Serve host when ROUTE_OR_URL is a route."),
    port: int = typer.Option(8000, help="Serve port when ROUTE_OR_URL is a route."),
    timeout: float = typer.Option(60.0, help="Seconds to wait for each request to the endpoint."),
    retries: int = typer.Option(3, "--retries", min=0, help="Retries on 429 (after Retry-After), 502, 503, 504 and "
                                "connection failures, with exponential backoff and jitter."),
    engine: str = typer.Option("auto", "--engine", help="Offline scoring only: local (in this process), ray (Ray "
                               "Data on the cluster, or on an embedded Ray), or auto: ray when a cluster is configured "
                               "(RAY_ADDRESS or a `rayline cluster up` head) or the input is not local Parquet or CSV, "
                               "else local."),
    drift_report: Optional[Path] = typer.Option(None, "--drift-report", help="Offline scoring only: also write the "
                                                "input's drift against the version's training data as a "
                                                "self-contained HTML page (a panel per feature)."),
) -> None:
    """Predictions from a served model (ROUTE or URL), or offline batch scoring of a dataset (NAME).

    Online, with a /route or URL: `rayline predict /digits --input rows.csv` prints a table; `-o json` prints the answer; `-o out.parquet` writes a file.

    Offline, with a registered model NAME: `rayline predict digits --input data.parquet --output scores.parquet` scores every row in bounded memory, rows in input order (in this process, or with Ray Data on a cluster: --engine).
    """
    online = target.startswith(("/", "http://", "https://"))
    to_file = output not in ("table", "json")
    if online and engine != "auto":
        raise RaylineError(f"--engine: applies to offline scoring of a registered model NAME (got --engine {engine} "
                           f"with {target}; allowed: leave it out when querying a served model)")
    if online and drift_report is not None:
        raise RaylineError(f"--drift-report: applies to offline scoring of a registered model NAME (got {target}; "
                           "allowed: a model NAME with --input and --output)")
    if drift_report is not None and not drift_report.parent.is_dir():
        raise RaylineError(f"--drift-report: no such directory {str(drift_report.parent)!r} (got {str(drift_report)!r})")
    if not online:
        _score_offline(target, json_body, input_file, output, to_file, version, keep, workspace, probabilities, engine,
                       drift_report)
        return
    from rayline.client import ONLINE_WRITERS, Client, write_predictions
    from rayline.serve.request_rows import load_instances, prediction_rows

    if to_file and Path(output).suffix.lower() not in ONLINE_WRITERS:
        raise RaylineError(f"--output: unknown format (got {output!r}; allowed: table, json, or a file ending in "
                           f"{', '.join(ONLINE_WRITERS)})")
    instances = load_instances(json_body, input_file)
    url = target if target.startswith(("http://", "https://")) else f"http://{host}:{port}{target}"
    url = url.rstrip("/")
    url = url[: -len("/predict")] if url.endswith("/predict") else url
    if version is not None:
        url = f"{url}/v/{version}"
    if to_file:
        rows, answered = write_predictions(url, instances, Path(output), probabilities=probabilities, keep=keep,
                                           api_key=api_key, timeout=timeout, retries=retries)
        console.print(f"wrote {rows:,} predictions to {Path(output)} (version {answered or '?'} answered)")
        return
    with Client(url, api_key=api_key, timeout=timeout, max_retries=retries) as client:
        result = client.predict_raw(instances, probabilities)
    if output == "json":
        print(json.dumps(result, indent=2))
        return
    rows, with_probabilities = prediction_rows(result)
    table = Table(title=f"{result.get('model', '?')} v{result.get('version', '?')}")
    table.add_column("#", justify="right")
    table.add_column("prediction")
    if with_probabilities:
        table.add_column("probability", justify="right")
    for row in rows:
        table.add_row(*(row if with_probabilities else row[:2]))
    console.print(table)


def _score_offline(name, json_body, input_file, output, to_file, version, keep, workspace, probabilities,
                   engine="auto", drift_report: Path | None = None) -> None:
    """`rayline predict NAME --input DATA --output FILE.parquet`: batch scoring (rayline/batch/)."""
    if json_body is not None or input_file is None or not to_file:
        got = "--json" if json_body is not None else "no --input" if input_file is None else f"--output {output}"
        raise RaylineError(f"{name}: a registered model name scores a dataset offline: give --input DATA and "
                           f"--output FILE.parquet (got {got}); to query the served model, give its route "
                           f"/{name} or a URL")
    from rayline.batch import score

    with _progress_reporter() as report:
        result = score(name, str(input_file), output, version=version, workspace=open_workspace(workspace),
                       probabilities=probabilities, keep=keep, progress=report, engine=engine)
    where = "in this process" if result.engine == "local" else "on Ray"
    console.print(f"wrote {result.rows:,} rows to {result.output} (model {result.model} v{result.version}, {where}; "
                  f"{result.seconds:.1f} s, {result.rows_per_s:,.0f} rows/s)")
    if result.drift:
        _print_drift(result.drift, f"v{result.version}")
    if drift_report is not None:
        if result.drift is None:
            raise RaylineError(f"--drift-report: model {result.model} v{result.version} has no training statistics "
                               "(registered before rayline kept them; allowed: a version trained since)")
        from rayline.monitoring.report import render_drift_html
        from rayline.report import write_html

        page = render_drift_html(result.drift, f"Drift report: {result.model} v{result.version}",
                                 f"--input {input_file} ({result.rows:,} rows) against the version's train split")
        console.print(f"wrote the drift report to {write_html(page, drift_report)}")


_DRIFT_SHOWN = 10  # features listed; the rest are counted


def _print_drift(drifts, version: str) -> None:
    """The scored data's drift against the version's training statistics, the largest PSI first."""
    from rayline.monitoring import Thresholds

    t = Thresholds()
    flagged = [d for d in drifts if d.level != "ok"]
    table = Table(title=f"drift of --input against {version}'s training data (PSI >= {t.psi_warn:g} warn, "
                        f">= {t.psi_alert:g} alert)")
    for column in ("feature", "kind", "PSI", "nulls (train)", "outside range / unseen", "level"):
        table.add_column(column)
    for d in drifts[:_DRIFT_SHOWN]:
        table.add_row(d.name, d.kind, f"{d.psi:.3f}", f"{d.null_share:.1%} ({d.train_null_share:.1%})",
                      f"{d.outside_share:.1%}", d.level if d.level == "ok" else f"{d.level}: {'; '.join(d.reasons)}")
    console.print(table)
    rest = len(drifts) - _DRIFT_SHOWN
    console.print(f"{len(flagged)} of {len(drifts)} features drifted" + (f" ({rest} more not shown)" if rest > 0 else ""))


class _progress_reporter:
    """A rich progress bar on a terminal; otherwise a plain line at most every 5 s (logs, CI)."""

    def __enter__(self):
        self.bar = None
        self.task = None
        self.last = 0.0
        self.pending = None  # (rows, total) not printed yet
        if err_console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("scoring"), BarColumn(), MofNCompleteColumn(), TextColumn("rows"),
                                TimeElapsedColumn(), console=err_console, transient=True)
            self.bar.start()
        return self

    def __call__(self, rows: int, total) -> None:
        if self.bar is not None:
            if self.task is None:
                self.task = self.bar.add_task("scoring", total=total)
            self.bar.update(self.task, completed=rows, total=total)
            return
        now = time.monotonic()
        self.pending = (rows, total)
        if now - self.last >= 5.0 or (total and rows >= total):
            self._line()

    def _line(self) -> None:
        rows, total = self.pending
        self.last, self.pending = time.monotonic(), None
        of = f" of {total:,}" if total else ""
        err_console.print(f"scored {rows:,}{of} rows")

    def __exit__(self, exc_type, *exc):
        if self.bar is not None:
            self.bar.stop()
        elif exc_type is None and self.pending is not None:
            self._line()  # the last count, whenever the run ends between two lines
