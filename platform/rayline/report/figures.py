"""The sweep report's figures, built with plotly from a `Sweep` (no MLflow, no I/O here).

Every figure uses SVG trace types (`scatter`, `bar`) except the parallel coordinates,
which plotly draws only with WebGL; values are plain lists, so each figure's JSON in the
page carries the trials' data as written (trial ids, parameters, metric values).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from rayline.report.sweep import Sweep, Trial

__all__ = [
    "Axis",
    "encode_param",
    "tuned_params",
    "curves_figure",
    "parallel_figure",
    "effects_figure",
    "decisions_figure",
    "families_figure",
    "family_leaderboard",
    "value_text",
    "STOP_COLORS",
]

# One colour per stop reason, the same in the curves and the decisions figure.
STOP_COLORS = {"completed": "#2ca02c", "early_stopped": "#ff7f0e", "time_budget": "#9467bd",
               "error": "#d62728", None: "#7f7f7f"}
STOP_SYMBOLS = {"early_stopped": "x", "time_budget": "hourglass", "error": "x-thin-open"}
STOP_LABELS = {"completed": "completed", "early_stopped": "stopped early by the scheduler",
               "time_budget": "stopped by tune.time_budget_s", "error": "failed", None: "not recorded"}
_TEMPLATE = "plotly_white"
UNSET = "(unset)"
# A positive parameter spanning this factor or more is drawn on a log scale (learning rates:
# 1e-4..1e-1 squeezed into the bottom tenth of a linear axis said nothing).
_LOG_SPAN = 20.0


def value_text(value) -> str:
    """A parameter value as the report shows it: lists and dicts as compact JSON."""
    if value is None:
        return UNSET
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(", ", ": "))
    return str(value)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass
class Axis:
    """One parameter encoded as numbers plotly can draw.

    kind: numeric | log (values are log10 of the parameter) | categorical (values are
    category indices; ticktext names them). Trials without the parameter (another model
    family's sub-space) get the `UNSET` tick, below the others.
    """

    path: str
    kind: str
    values: list  # per trial: a float
    tickvals: list | None = None
    ticktext: list | None = None

    @property
    def label(self) -> str:
        return f"log10 {self.path}" if self.kind == "log" else self.path


def encode_param(path: str, raw: list) -> Axis:
    """Encode one parameter's values (one per trial, None where unset) for parcoords."""
    present = [v for v in raw if v is not None]
    if present and all(_number(v) for v in present):
        lo, hi = min(present), max(present)
        log = lo > 0 and hi / lo >= _LOG_SPAN
        scale = (lambda v: math.log10(v)) if log else (lambda v: float(v))
        values = [scale(v) if v is not None else None for v in raw]
        shown = sorted(set(present))
        ticks = shown if len(shown) <= 6 else [lo, hi]
        tickvals, ticktext = [scale(v) for v in ticks], [value_text(v) for v in ticks]
        if any(v is None for v in values):
            span = (scale(hi) - scale(lo)) or 1.0
            below = scale(lo) - 0.15 * span
            values = [below if v is None else v for v in values]
            tickvals, ticktext = [below, *tickvals], [UNSET, *ticktext]
        return Axis(path, "log" if log else "numeric", values, tickvals, ticktext)
    texts = [value_text(v) for v in raw]
    order = sorted(set(texts), key=lambda t: (t != UNSET, _sort_key(t)))
    index = {t: i for i, t in enumerate(order)}
    return Axis(path, "categorical", [float(index[t]) for t in texts], list(range(len(order))), order)


def _sort_key(text: str):
    """Categories in a natural order: numbers by value, lists shortest first then by their items
    ([64] before [128, 64]), words alphabetically."""
    try:
        value = json.loads(text)
    except ValueError:
        return (2, 0, (), text)
    if _number(value):
        return (0, 0, (value,), text)
    if isinstance(value, list) and all(_number(v) for v in value):
        return (1, len(value), tuple(value), text)
    return (2, 0, (), text)


def tuned_params(sweep: Sweep) -> list[str]:
    """The parameters the sweep varied (those with 2+ distinct values); all of them when none did."""
    paths = sorted({p for t in sweep.trials for p in t.params})
    varied = [p for p in paths if len({value_text(t.params.get(p)) for t in sweep.trials}) > 1]
    return varied or paths


def _hover(trial: Trial, sweep: Sweep) -> str:
    best = trial.best(sweep.mode)
    lines = [f"trial {trial.trial_id}" + (" (winner)" if trial.winner else ""),
             f"best {sweep.metric}: {best:.4f}" if best is not None else f"no {sweep.metric}"]
    lines += [f"{p} = {value_text(v)}" for p, v in trial.params.items()]
    return "<br>".join(_escape(x) for x in lines)


def _escape(text: str) -> str:
    # plotly renders hover and tick text as a small HTML subset: user text must stay text.
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _value_at(trial: Trial, unit) -> float | None:
    """The trial's metric after `unit` units (the nearest reported point at or before it)."""
    points = [(u, v) for u, v in trial.curve if _number(unit) and u <= unit]
    if points:
        return points[-1][1]
    return trial.curve[0][1] if trial.curve else None


def _ordered(sweep: Sweep) -> list[Trial]:
    """Trials best first (unscored last): the legend and tables read as a ranking."""
    sign = -1 if sweep.mode == "max" else 1
    return sorted(sweep.trials, key=lambda t: (t.best(sweep.mode) is None, sign * (t.best(sweep.mode) or 0.0)))


def curves_figure(sweep: Sweep):
    """The metric per epoch of every trial; where each stopped early, failed or ran out of
    time, and each PBT exploit (the trial continued from another's checkpoint) marked."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for trial in _ordered(sweep):
        if not trial.curve:
            continue
        fig.add_trace(go.Scatter(
            x=[u for u, _ in trial.curve], y=[v for _, v in trial.curve], mode="lines+markers",
            name=trial.trial_id + (" (winner)" if trial.winner else ""), legendgroup=trial.trial_id,
            line={"width": 4 if trial.winner else 1.5}, marker={"size": 5},
            hovertext=_hover(trial, sweep), hoverinfo="x+y+text",
            meta={"trial_id": trial.trial_id},
        ))
    for reason in ("early_stopped", "time_budget", "error"):
        stopped = [t for t in sweep.trials if t.stop_reason == reason and t.curve]
        if stopped:
            fig.add_trace(go.Scatter(
                x=[t.curve[-1][0] for t in stopped], y=[t.curve[-1][1] for t in stopped], mode="markers",
                name=STOP_LABELS[reason], marker={"symbol": STOP_SYMBOLS[reason], "size": 13, "color": STOP_COLORS[reason],
                                                  "line": {"width": 2, "color": STOP_COLORS[reason]}},
                text=[t.trial_id for t in stopped], hovertemplate="trial %{text}: " + STOP_LABELS[reason]
                + " after %{x} units<extra></extra>", meta={"stop_reason": reason},
            ))
    exploits = [(t, e) for t in sweep.trials for e in t.events if e.get("kind") == "exploit"]
    if exploits:
        fig.add_trace(go.Scatter(
            x=[e.get("unit") for _, e in exploits], y=[_value_at(t, e.get("unit")) for t, e in exploits],
            mode="markers", name="PBT exploit", marker={"symbol": "star", "size": 15, "color": "#e377c2",
                                                        "line": {"width": 1, "color": "#333"}},
            text=[_escape(f"trial {t.trial_id} copied trial {e.get('from_trial', '?')}'s checkpoint"
                          + (f"; new config {value_text(e.get('config'))}" if e.get("config") else ""))
                  for t, e in exploits],
            customdata=[t.trial_id for t, _ in exploits],
            hovertemplate="%{text} at unit %{x}<extra></extra>", meta={"events": "exploit"},
        ))
    fig.update_layout(template=_TEMPLATE, title=f"Learning curves: validation {sweep.metric} per epoch",
                      xaxis_title="units trained (epochs; boosting rounds for xgboost)",
                      yaxis_title=f"validation {sweep.metric} ({'higher' if sweep.mode == 'max' else 'lower'} is better)",
                      legend_title="trial", height=520)
    return fig


def _scored(sweep: Sweep) -> list[Trial]:
    return [t for t in sweep.trials if t.best(sweep.mode) is not None]


def parallel_figure(sweep: Sweep):
    """Parallel coordinates: every tuned parameter and the trial's best metric, one line per
    trial coloured by the metric. None when no trial reported the metric."""
    import plotly.graph_objects as go

    trials = _scored(sweep)
    if not trials:
        return None
    dims = []
    for path in tuned_params(sweep):
        axis = encode_param(path, [t.params.get(path) for t in trials])
        dim = {"label": axis.label, "values": axis.values}
        if axis.tickvals is not None:
            dim.update(tickvals=axis.tickvals, ticktext=axis.ticktext)
        dims.append(dim)
    scores = [t.best(sweep.mode) for t in trials]
    dims.append({"label": sweep.metric, "values": scores})
    fig = go.Figure(go.Parcoords(
        line={"color": scores, "colorscale": "Viridis", "reversescale": sweep.mode == "min", "showscale": True,
              "colorbar": {"title": {"text": sweep.metric}}},
        dimensions=dims, meta={"trial_ids": [t.trial_id for t in trials]},
    ))
    fig.update_layout(template=_TEMPLATE, title=f"Parameters against best validation {sweep.metric} (one line per trial)",
                      height=480, margin={"l": 80, "r": 80, "t": 100})
    return fig


def effects_figure(sweep: Sweep):
    """Each tuned parameter's effect: a scatter of its value against the trial's best metric,
    one panel per parameter (log axis for wide positive ranges, categories for the rest)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    trials = _scored(sweep)
    paths = tuned_params(sweep)
    if not trials or not paths:
        return None
    cols = min(3, len(paths))
    rows = math.ceil(len(paths) / cols)
    # One metric scale for every panel: how far apart the points sit is comparable across parameters.
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=paths, vertical_spacing=min(0.3, 0.6 / rows),
                        shared_yaxes="all")
    for i, path in enumerate(paths):
        row, col = i // cols + 1, i % cols + 1
        axis = encode_param(path, [t.params.get(path) for t in trials])
        if axis.kind == "categorical":
            panel = trials
            xs = [value_text(t.params.get(path)) for t in panel]
            fig.update_xaxes(type="category", categoryorder="array", categoryarray=axis.ticktext, row=row, col=col)
        else:
            # Trials of another model family lack this parameter: left out of its panel.
            panel = [t for t in trials if t.params.get(path) is not None]
            xs = [t.params[path] for t in panel]
            if axis.kind == "log":
                fig.update_xaxes(type="log", row=row, col=col)
        fig.add_trace(go.Scatter(
            x=xs, y=[t.best(sweep.mode) for t in panel], mode="markers", name=path, showlegend=False,
            text=[t.trial_id for t in panel], customdata=[value_text(t.params.get(path)) for t in panel],
            marker={"size": [14 if t.winner else 9 for t in panel],
                    "color": [STOP_COLORS.get(t.stop_reason, STOP_COLORS[None]) for t in panel],
                    "symbol": ["star" if t.winner else "circle" for t in panel], "line": {"width": 1, "color": "#333"}},
            hovertemplate="trial %{text}<br>" + _escape(path) + " = %{customdata}<br>" + _escape(sweep.metric)
            + " = %{y:.4f}<extra></extra>", meta={"param": path},
        ), row=row, col=col)
        fig.update_yaxes(title_text=sweep.metric if col == 1 else None, row=row, col=col)
    fig.update_layout(template=_TEMPLATE, height=max(360, 320 * rows),
                      title=f"Each parameter's effect on best validation {sweep.metric} "
                            "(star: winner; colour: how the trial ended)")
    return fig


def decisions_figure(sweep: Sweep):
    """Where each trial stopped and why: one bar per trial to the units it trained, coloured
    by its stop reason, with the scheduler's other decisions (PBT exploits) marked on it.
    None when the run recorded no decisions (runs logged before rayline.stop_reason)."""
    import plotly.graph_objects as go

    if not sweep.has_decisions:
        return None
    trials = _ordered(sweep)
    fig = go.Figure()
    for reason in ("completed", "early_stopped", "time_budget", "error", None):
        group = [t for t in trials if t.stop_reason == reason]
        if not group:
            continue
        fig.add_trace(go.Bar(
            y=[t.trial_id for t in group], x=[t.units or 0 for t in group], orientation="h",
            name=STOP_LABELS[reason], marker={"color": STOP_COLORS[reason]},
            customdata=[f"{t.best(sweep.mode):.4f}" if t.best(sweep.mode) is not None else "-" for t in group],
            hovertemplate="trial %{y}: " + STOP_LABELS[reason] + " after %{x} units (best " + _escape(sweep.metric)
            + " %{customdata})<extra></extra>", meta={"stop_reason": reason or "unknown"},
        ))
    events = [(t, e) for t in trials for e in t.events]
    if events:
        fig.add_trace(go.Scatter(
            x=[e.get("unit") for _, e in events], y=[t.trial_id for t, _ in events], mode="markers",
            name="scheduler decision (PBT exploit)" if all(e.get("kind") == "exploit" for _, e in events) else "scheduler decision",
            marker={"symbol": "star", "size": 15, "color": "#e377c2", "line": {"width": 1, "color": "#333"}},
            text=[_escape(f"{e.get('kind', 'decision')}" + (f" from trial {e['from_trial']}" if e.get("from_trial") else "")
                          + (f": {value_text(e.get('config'))}" if e.get("config") else "")) for _, e in events],
            hovertemplate="trial %{y} at unit %{x}: %{text}<extra></extra>", meta={"events": "all"},
        ))
    fig.update_layout(template=_TEMPLATE, title="Scheduler decisions: where each trial stopped and why",
                      xaxis_title="units trained",
                      # Best trial on top, as in the table below (bars are added by stop reason).
                      yaxis={"type": "category", "categoryorder": "array", "categoryarray": [t.trial_id for t in trials],
                             "autorange": "reversed", "title": "trial"},
                      barmode="overlay", height=max(320, 120 + 28 * len(trials)))
    return fig


def family_leaderboard(sweep: Sweep) -> list[dict]:
    """Best trial of each model family (rayline.family), best family first; [] when not recorded."""
    best: dict[str, dict] = {}
    sign = 1 if sweep.mode == "max" else -1
    for t in sweep.trials:
        if not t.family:
            continue
        row = best.setdefault(t.family, {"family": t.family, "trials": 0, "best_trial": None, "best": None})
        row["trials"] += 1
        score = t.best(sweep.mode)
        if score is not None and (row["best"] is None or sign * score > sign * row["best"]):
            row["best"], row["best_trial"] = score, t.trial_id
    return sorted(best.values(), key=lambda r: (r["best"] is None, -sign * (r["best"] or 0.0)))


def families_figure(sweep: Sweep):
    """The family leaderboard as bars: the best metric of each model family. None without families."""
    import plotly.graph_objects as go

    board = [r for r in family_leaderboard(sweep) if r["best"] is not None]
    if not board:
        return None
    fig = go.Figure(go.Bar(
        x=[r["family"] for r in board], y=[r["best"] for r in board],
        text=[f"{r['best']:.4f} (trial {r['best_trial']})" for r in board], textposition="auto",
        customdata=[r["trials"] for r in board],
        hovertemplate="%{x}: best " + _escape(sweep.metric) + " %{y:.4f} of %{customdata} trials<extra></extra>",
        meta={"best_trials": [r["best_trial"] for r in board]},
    ))
    fig.update_layout(template=_TEMPLATE, title=f"Model families: best validation {sweep.metric} of each",
                      xaxis={"type": "category", "title": "family"}, yaxis_title=sweep.metric, height=380)
    return fig
