"""The drift report: one self-contained HTML page (plotly inlined, as `rayline report`), a panel
per summarised feature with its training and scored distributions side by side (shares per
training bin or category, unseen categories as one more bar), flagged features first.
"""

from __future__ import annotations

__all__ = ["render_drift_html"]


def render_drift_html(drifts: list, title: str, subtitle: str = "") -> str:
    """The page for `drifts` (monitoring.drift's FeatureDrift list, the largest PSI first)."""
    import plotly.graph_objects as go

    from rayline.report.page import escape, figure_html, page_html, table_html

    rows = [[escape(d.name), escape(d.kind), f"{d.psi:.3f}", f"{d.null_share:.1%} ({d.train_null_share:.1%})",
             f"{d.outside_share:.1%}", escape(d.level if d.level == "ok" else f"{d.level}: {'; '.join(d.reasons)}")]
            for d in drifts]
    flagged = sum(d.level != "ok" for d in drifts)
    sections = [f"<p>{escape(subtitle)}</p>" if subtitle else "",
                f'<section id="summary"><p>{flagged} of {len(drifts)} features drifted.</p>'
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
                        + figure_html(f"feature-{i}", fig) + "</section>")
    return page_html(title, sections)
