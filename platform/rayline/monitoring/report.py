"""The drift report: one self-contained HTML page (plotly inlined, as `rayline report`), a panel
per summarised feature with its training and scored distributions side by side (shares per
training bin or category, unseen categories as one more bar), flagged features first.

Two sources: a scored batch (`rayline predict --drift-report`, `render_drift_html`) and the live
windows of served versions (`rayline report NAME --live`, `render_versions_html`: a part per version).
"""

from __future__ import annotations

__all__ = ["render_drift_html", "render_versions_html", "live_report_html"]


def render_drift_html(drifts: list, title: str, subtitle: str = "") -> str:
    """The page for `drifts` (monitoring.drift's FeatureDrift list, the largest PSI first)."""
    from rayline.report.page import page_html

    return page_html(title, _sections(drifts, subtitle, "feature"))


def render_versions_html(title: str, parts: list) -> str:
    """One page of several versions' drift: `parts` is [(heading, subtitle, drifts)], each drawn as
    `render_drift_html` draws one, under its heading."""
    from rayline.report.page import escape, page_html

    sections = []
    for i, (heading, subtitle, drifts) in enumerate(parts):
        sections.append(f'<h2 class="version">{escape(heading)}</h2>')
        sections.extend(_sections(drifts, subtitle, f"v{i}-feature"))
    return page_html(title, sections)


def _sections(drifts: list, subtitle: str, figure_prefix: str) -> list[str]:
    import plotly.graph_objects as go

    from rayline.report.page import escape, figure_html, table_html

    rows = [[escape(d.name), escape(d.kind), f"{d.psi:.3f}", f"{d.null_share:.1%} ({d.train_null_share:.1%})",
             f"{d.outside_share:.1%}", escape(d.level if d.level == "ok" else f"{d.level}: {'; '.join(d.reasons)}")]
            for d in drifts]
    flagged = sum(d.level != "ok" for d in drifts)
    sections = [f"<p>{escape(subtitle)}</p>" if subtitle else "",
                f'<section class="summary"><p>{flagged} of {len(drifts)} features drifted.</p>'
                + table_html(["feature", "kind", "PSI", "nulls (train)", "outside range / unseen", "level"], rows,
                             cls="drift", row_classes=["winner" if d.level != "ok" else "" for d in drifts],
                             numeric={2, 3, 4}) + "</section>"]
    for i, d in enumerate(drifts):
        fig = go.Figure([go.Bar(name="training", x=d.labels, y=d.train_shares),
                         go.Bar(name="scored", x=d.labels, y=d.shares)])
        fig.update_layout(barmode="group", height=320, margin={"t": 30, "b": 60},
                          yaxis={"title": "share of rows", "tickformat": ".0%"},
                          title={"text": f"{d.name}: PSI {d.psi:.3f} ({d.level})"})
        sections.append(f'<section class="feature" data-feature="{escape(d.name)}"><h2>{escape(d.name)}</h2>'
                        + figure_html(f"{figure_prefix}-{i}", fig) + "</section>")
    return sections


def live_report_html(model: str, versions: list[str] | None = None) -> tuple[str, list[dict]]:
    """The page of `model`'s live windows on the connected cluster (every version serving with
    monitoring, or `versions`), and a summary per version: {version, status, window_rows, flagged}."""
    from rayline.errors import ServeError
    from rayline.monitoring.live import live_drift, live_versions, window_status

    live = live_versions(model)
    if not live:
        raise ServeError(f"report --live: model {model!r} has no monitored version serving on this cluster (allowed: "
                         "a model served with serve.monitoring on, whose replicas published a window in the last "
                         "30 s; `rayline serve status` lists what is served)")
    unknown = [v for v in versions or () if v not in live]
    if unknown:
        raise ServeError(f"--version: model {model!r} has no monitored window for version {unknown[0]!r} "
                         f"(allowed: {', '.join(live)})")
    parts, summaries = [], []
    for version in versions or live:
        found = live_drift(model, version)
        if found is None:
            raise ServeError(f"report --live: the replicas of {model} v{version} published no training statistics "
                             "yet (they do within 2 s of their first request); try again")
        drifts, counts, reference = found
        status = window_status(drifts, counts.rows, reference["min_rows"])
        flagged = [d.name for d in drifts if d.level != "ok"]
        subtitle = (f"{counts.rows:,} rows in the live window (its size: {reference['window_size']:,} rows; judged "
                    f"from {reference['min_rows']:,}); status {status}")
        parts.append((f"{model} v{version}", subtitle, drifts))
        summaries.append({"version": version, "status": status, "window_rows": counts.rows, "flagged": flagged})
    return render_versions_html(f"rayline live drift: {model}", parts), summaries
