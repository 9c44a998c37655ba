"""The sweep report as one self-contained HTML page, written atomically.

plotly.js is inlined once (about 4.8 MB; no CDN, so the file opens offline and from an
MLflow artifact view), each figure's JSON sits in its own
`<script type="application/json" data-figure=ID>` next to its `<div id=ID>`, and one small
script draws them all. The JSON is readable by tools and tests without running JavaScript.
"""

from __future__ import annotations

import datetime
import html
import os
from pathlib import Path

from rayline.errors import RaylineError
from rayline.report import figures as figs
from rayline.report.sweep import Sweep

__all__ = ["render_html", "write_html", "page_html", "figure_html", "table_html", "escape", "FIGURE_IDS"]

# The figures a report can hold, in page order.
FIGURE_IDS = ("curves", "parallel", "effects", "decisions", "families")

_CSS = """
body { font-family: -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; margin: 0 auto;
       max-width: 1200px; padding: 1.5rem; color: #222; }
h1 { margin-bottom: .2rem; } h2 { margin-top: 2.2rem; border-bottom: 1px solid #ddd; padding-bottom: .3rem; }
table { border-collapse: collapse; margin: .6rem 0; font-size: .9rem; }
th, td { border: 1px solid #ddd; padding: .25rem .6rem; text-align: left; vertical-align: top; }
th { background: #f5f5f5; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.winner td { background: #fff6d5; font-weight: 600; }
.note { color: #555; background: #f7f7f7; border-left: 4px solid #bbb; padding: .5rem .8rem; }
.figure { width: 100%; min-height: 320px; }
code { background: #f2f2f2; padding: 0 .25rem; }
section#trials, section#section-decisions { overflow-x: auto; }
"""

# Draws every figure from its JSON; a figure that fails leaves a visible message and the
# error on the console (what the Chromium test watches), the others still draw.
_BOOT = """
(function () {
  var nodes = document.querySelectorAll('script[type="application/json"][data-figure]');
  nodes.forEach(function (node) {
    var id = node.getAttribute('data-figure');
    var target = document.getElementById(id);
    try {
      var fig = JSON.parse(node.textContent);
      Plotly.newPlot(target, fig.data, fig.layout, {responsive: true, displaylogo: false});
    } catch (err) {
      target.textContent = 'This figure could not be drawn: ' + err;
      console.error('rayline report: figure ' + id + ': ' + err);
    }
  });
})();
"""


def escape(value) -> str:
    return html.escape(str(value), quote=True)


_e = escape


def _num(value, digits: int = 4) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else _e(value)


def table_html(header: list[str], rows: list[list], cls: str = "", row_classes: list[str] | None = None,
           numeric: set[int] = frozenset()) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = []
    for i, row in enumerate(rows):
        rc = f' class="{row_classes[i]}"' if row_classes and row_classes[i] else ""
        cells = "".join(f'<td class="num">{c}</td>' if j in numeric else f"<td>{c}</td>" for j, c in enumerate(row))
        body.append(f"<tr{rc}>{cells}</tr>")
    cls_attr = f' class="{cls}"' if cls else ""
    return f"<table{cls_attr}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def figure_html(fig_id: str, fig) -> str:
    # "<", ">" and "&" escaped inside the JSON strings, so no parameter value or trial id can
    # close the <script> element (JSON allows \\u003c for "<").
    data = fig.to_json().replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return (f'<div class="figure" id="{fig_id}"></div>\n'
            f'<script type="application/json" data-figure="{fig_id}">{data}</script>')


def _note(text: str, cls: str = "note") -> str:
    return f'<p class="{cls}">{text}</p>'


def _events_text(events: list) -> str:
    parts = []
    for e in events:
        what = str(e.get("kind", "decision"))
        if e.get("from_trial"):
            what += f" from trial {e['from_trial']}"
        if e.get("unit") is not None:
            what += f" at unit {e['unit']}"
        if e.get("config"):
            what += f" ({figs.value_text(e['config'])})"
        parts.append(_e(what))
    return "; ".join(parts) or "-"


def render_html(sweep: Sweep) -> tuple[str, list[str]]:
    """(the page, the ids of the figures it draws)."""
    winner = sweep.winner
    drawn: list[str] = []
    sections: list[str] = []
    started = (datetime.datetime.fromtimestamp(sweep.started_ms / 1000, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
               if sweep.started_ms else "-")
    counts: dict[str, int] = {}
    for t in sweep.trials:
        counts[t.stop_reason or t.status] = counts.get(t.stop_reason or t.status, 0) + 1
    overview = [
        ["pipeline", _e(sweep.name)], ["MLflow run", f"<code>{_e(sweep.run_id)}</code> ({_e(sweep.run_name)})"],
        ["started", _e(started)], ["status", _e(sweep.status)],
        ["metric", f"{_e(sweep.metric)} ({'higher' if sweep.mode == 'max' else 'lower'} is better)"],
        ["trials", _e(f"{len(sweep.trials)} (" + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) + ")")],
        ["registered", _e(f"model {sweep.name} version {sweep.version}" if sweep.version else "no registered version")],
    ]
    sections.append('<section id="overview">' + table_html(["", ""], overview) + "</section>")

    # The winner and its test metrics (the pipeline run's test_* metrics: the registered model
    # evaluated on the held-out test split).
    parts = ['<section id="winner"><h2>Winner</h2>']
    if winner is None:
        parts.append(_note("No trial reported the metric: there is no winner."))
    else:
        best = winner.best(sweep.mode)
        parts.append(f'<p>Trial <strong class="winner-id">{_e(winner.trial_id)}</strong>: best validation '
                     f"{_e(sweep.metric)} {_num(best)} after {_e(winner.units if winner.units is not None else '-')} units"
                     + (f"; family {_e(winner.family)}" if winner.family else "") + ".</p>")
        if winner.params:
            parts.append(table_html(["parameter", "value"], [[_e(p), _e(figs.value_text(v))] for p, v in winner.params.items()],
                                cls="winner-params"))
        metrics = sorted(set(sweep.test_metrics) | set(sweep.valid_metrics))
        if metrics:
            parts.append(table_html(["metric", "validation (best epoch)", "test"],
                                [[_e(m) + (" *" if m == sweep.metric else ""), _num(sweep.valid_metrics.get(m)),
                                  _num(sweep.test_metrics.get(m))] for m in metrics],
                                cls="test-metrics", numeric={1, 2}))
        else:
            parts.append(_note("The run has no test metrics (nothing was registered)."))
    parts.append("</section>")
    sections.append("".join(parts))

    def add(fig_id: str, title: str, fig, intro: str, missing: str, extra: str = "") -> None:
        body = [f'<section id="section-{fig_id}"><h2>{_e(title)}</h2>', _note(intro, "intro")]
        if fig is None:
            body.append(_note(missing))
        else:
            body.append(figure_html(fig_id, fig))
            drawn.append(fig_id)
        sections.append("".join(body) + extra + "</section>")

    add("curves", "Learning curves", figs.curves_figure(sweep) if any(t.curve for t in sweep.trials) else None,
        f"Validation {_e(sweep.metric)} after each epoch of every trial. Crosses mark trials the scheduler stopped "
        "early, hourglasses the ones the time budget stopped, stars PBT exploits (the trial continued from a better "
        "trial's checkpoint).", f"No trial reported {_e(sweep.metric)} per epoch.")
    add("parallel", "Parallel coordinates", figs.parallel_figure(sweep),
        "Each line is a trial: its parameters and its best validation metric. Drag on an axis to select a range. "
        "Lists and words are drawn as categories; wide positive ranges on a log10 axis.",
        f"No trial reported {_e(sweep.metric)}.")
    add("effects", "Parameter effects", figs.effects_figure(sweep),
        f"The best validation {_e(sweep.metric)} of each trial against the value of each tuned parameter.",
        "No tuned parameter with a scored trial.")

    rows, classes = [], []
    for t in figs._ordered(sweep):
        rows.append([_e(t.trial_id), _e(t.status), _e(t.stop_reason or "not recorded"),
                     _e(t.units if t.units is not None else "-"), _num(t.best(sweep.mode)), _events_text(t.events)])
        classes.append("winner" if t is winner else "")
    add("decisions", "Scheduler decisions", figs.decisions_figure(sweep),
        "How far each trial trained and why it stopped (completed, stopped early by ASHA or median stopping, "
        "stopped by the time budget, failed), and the scheduler's decisions about it, such as PBT exploits.",
        "This run did not record the scheduler's decisions (it was logged by a rayline version before "
        "rayline.stop_reason and rayline.trial_events): the table below shows what is known.",
        table_html(["trial", "status", "stop reason", "units trained", f"best {sweep.metric}", "scheduler decisions"],
               rows, cls="decisions", row_classes=classes, numeric={3, 4}))

    board = figs.family_leaderboard(sweep)
    if board:
        add("families", "Model families", figs.families_figure(sweep),
            f"The best trial of each model family (H2O-AutoML-style leaderboard), by best validation {_e(sweep.metric)}.",
            f"No family's trial reported {_e(sweep.metric)}.",
            table_html(["family", "trials", "best trial", f"best {sweep.metric}"],
                   [[_e(r["family"]), _e(r["trials"]), _e(r["best_trial"] or "-"), _num(r["best"])] for r in board],
                   cls="families", numeric={1, 3}))
    else:
        sections.append('<section id="section-families"><h2>Model families</h2>'
                        + _note("The trials did not record their model family (rayline.family): no leaderboard.")
                        + "</section>")

    params = sorted({p for t in sweep.trials for p in t.params})
    rows = [[_e(t.trial_id), _e(t.family or "-"), _num(t.best(sweep.mode)), _e(t.stop_reason or t.status),
             *[_e(figs.value_text(t.params.get(p))) for p in params]] for t in figs._ordered(sweep)]
    sections.append('<section id="trials"><h2>All trials</h2>'
                    + table_html(["trial", "family", f"best {sweep.metric}", "ended", *params], rows, cls="trials",
                             row_classes=["winner" if t is winner else "" for t in figs._ordered(sweep)], numeric={2})
                    + "</section>")

    title = f"Sweep report: {sweep.name} ({sweep.run_id[:8]})"
    return page_html(title, sections), drawn


def page_html(title: str, sections: list[str]) -> str:
    """A whole self-contained page: `sections` (HTML) under `title`, plotly.js inlined, and the
    script that draws every figure `figure_html` placed (rayline report, the drift report)."""
    from plotly.offline import get_plotlyjs

    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<meta name=\"generator\" content=\"rayline report\">\n<title>{_e(title)}</title>\n<style>{_CSS}</style>\n"
        # plotly.js inline: its text holds no "</script" (checked by the tests).
        f"<script>{get_plotlyjs()}</script>\n</head>\n<body>\n<h1>{_e(title)}</h1>\n"
        + "\n".join(sections)
        + f"\n<script>{_BOOT}</script>\n</body>\n</html>\n"
    )


def write_html(text: str, path: str | os.PathLike) -> Path:
    """Write `text` to `path` through a temporary sibling and a rename: a reader never sees
    half a report, and a failure leaves any earlier report in place."""
    path = Path(path)
    if not path.parent.is_dir():
        raise RaylineError(f"--output: no such directory {str(path.parent)!r} (got {str(path)!r})")
    from rayline.files import atomic_write

    try:
        atomic_write(path, text)
    except OSError as exc:
        raise RaylineError(f"--output: cannot write {path}: {exc.strerror or exc} "
                           "(allowed: a writable file path)") from exc
    return path
