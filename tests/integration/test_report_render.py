"""The sweep report in a real browser, and the report of a real sweep.

Headless Chromium (playwright, Debian's chromium package) opens the report offline and must
draw every figure without a page error, a console error or a network request. The real
sweep is the session's `digits` fixture (a 2-trial ASHA sweep that other modules use too):
`run_pipeline` must have written its report, logged it to the MLflow run and said where.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from bs4 import BeautifulSoup

from tests.unit.test_report import TRIALS, build_store, figure_data, network_references

# One lane for the module, the session's (conftest.SESSION_LANE_MARK): its sweep test needs the session's
# digits run, and the others then share its browser and synthetic store instead of a second of each.
pytestmark = pytest.mark.session_lane

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--no-first-run", "--disable-sync"]

# Per figure, what plotly drew: its SVG, every trace's group and the parallel coordinates' axes.
_DRAWN = """(id) => {
  const div = document.getElementById(id);
  return {
    plotted: div.classList.contains('js-plotly-plot'),
    svgs: div.querySelectorAll('svg.main-svg').length,
    traces: div.querySelectorAll('g.trace').length,
    marks: div.querySelectorAll('g.trace path').length,
    parcoords: div.querySelectorAll('g.parcoords').length,
    axes: div.querySelectorAll('g.parcoords g.y-axis').length,
    canvases: div.querySelectorAll('canvas').length,
    failed: div.textContent.includes('could not be drawn'),
  };
}"""


def _chromium() -> str:
    path = shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(path).exists():
        pytest.fail("chromium is not installed: the report's render test needs it "
                    "(apt-get install chromium; playwright's Python package drives it)")
    return path


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    executable = _chromium()
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def render(browser, path: Path) -> dict:
    """Open the report from disk; every figure's drawing, and what went wrong on the page."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors, requests = [], []
    page.on("pageerror", lambda exc: errors.append(f"page error: {exc}"))
    page.on("console", lambda msg: errors.append(f"console {msg.type}: {msg.text}") if msg.type == "error" else None)
    page.on("request", lambda req: None if req.url.startswith(("file:", "data:", "blob:", "about:"))
            else requests.append(req.url))
    try:
        page.goto(path.resolve().as_uri(), wait_until="load", timeout=60_000)
        ids = page.evaluate("() => [...document.querySelectorAll('script[data-figure]')].map(s => s.dataset.figure)")
        # Drawn, or given up on with the page's own message (the boot script's catch).
        page.wait_for_function("(ids) => ids.every(id => { const d = document.getElementById(id); "
                               "return d.classList.contains('js-plotly-plot') || d.textContent.includes('could not be drawn'); })",
                               arg=ids, timeout=30_000)
        page.wait_for_timeout(300)  # parcoords draws its WebGL lines on the next frames
        drawn = {fig_id: page.evaluate(_DRAWN, fig_id) for fig_id in ids}
    finally:
        page.close()
    return {"figures": drawn, "errors": errors, "requests": requests}


def assert_every_figure_drew(path: Path, result: dict) -> None:
    assert result["errors"] == [], result["errors"]
    assert result["requests"] == [], f"the report fetched from the network: {result['requests']}"
    figures = figure_data(BeautifulSoup(path.read_text(), "html.parser"))
    assert set(result["figures"]) == set(figures)
    for fig_id, fig in figures.items():
        drawn = result["figures"][fig_id]
        assert drawn["plotted"] and drawn["svgs"] >= 1 and not drawn["failed"], (fig_id, drawn)
        if fig["data"][0]["type"] == "parcoords":
            assert drawn["parcoords"] == 1 and drawn["canvases"] >= 1, (fig_id, drawn)
            assert drawn["axes"] == len(fig["data"][0]["dimensions"]), (fig_id, drawn)
        else:
            assert drawn["traces"] == len(fig["data"]), (fig_id, drawn)  # one <g class="trace"> per trace
            assert drawn["marks"] >= len(fig["data"]), (fig_id, drawn)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """The unit tests' store (completed, early-stopped, exploited, failed trials; two families;
    an older run without the newer tags), its two sweeps' reports written in-process."""
    from rayline.registry import Registry
    from rayline.report import write_report
    from rayline.workspace import workspace

    root = tmp_path_factory.mktemp("renderws")
    runs = build_store(root)
    registry = Registry(workspace(root))
    return {kind: write_report(registry, runs[kind], root / f"{kind}.html") for kind in ("sweep", "legacy")}


def test_report_draws_every_figure_in_chromium(browser, synthetic):
    report = synthetic["sweep"]
    assert report.figures == ["curves", "parallel", "effects", "decisions", "families"]
    assert_every_figure_drew(report.path, render(browser, report.path))
    # An older run: fewer figures, the same clean page.
    legacy = synthetic["legacy"]
    assert legacy.figures == ["curves", "parallel", "effects"]
    assert_every_figure_drew(legacy.path, render(browser, legacy.path))
    assert len(TRIALS) == len(report.sweep.trials)


def test_a_sweep_run_writes_logs_and_names_its_report(digits, ws, browser):
    """`run_pipeline` of a real sweep: the summary's report path, the file, the MLflow artifact,
    and a page that draws the run's own trials."""
    from rayline.registry import Registry
    from rayline.report import ARTIFACT_PATH

    assert digits.report, "run_pipeline returned no report path for a sweep"
    path = Path(digits.report)
    assert path.is_file() and path.suffix == ".html"
    registry = Registry(ws)
    logged = [a.path for a in registry.client.list_artifacts(digits.run_id, "report")]
    assert logged == [ARTIFACT_PATH]
    html = path.read_text()
    soup = BeautifulSoup(html, "html.parser")
    assert network_references(html, soup) == []
    curves = figure_data(soup)["curves"]["data"]
    drawn = {t["meta"]["trial_id"]: t["y"] for t in curves if "trial_id" in (t.get("meta") or {})}
    expected = {t.trial_id: [row[digits.metric] for row in t.result.history] for t in digits.trials if t.result}
    assert drawn.keys() == expected.keys()
    for trial_id, values in expected.items():
        assert drawn[trial_id] == pytest.approx(values)
    test = {tr.find_all("td")[0].text.rstrip(" *"): tr.find_all("td")[2].text for tr in soup.select("table.test-metrics tbody tr")}
    assert test[digits.metric] == f"{digits.test_metrics[digits.metric]:.4f}"
    assert_every_figure_drew(path, render(browser, path))


def test_the_render_check_catches_a_figure_that_does_not_draw(browser, synthetic, tmp_path):
    """The checks above are not vacuous: a figure whose JSON is broken fails them."""
    good = synthetic["sweep"].path.read_text()
    marker = '<script type="application/json" data-figure="decisions">'
    broken = tmp_path / "broken.html"
    broken.write_text(good.replace(marker, marker + "{oops ", 1))
    result = render(browser, broken)
    assert result["figures"]["decisions"]["failed"]
    assert any("figure decisions" in e for e in result["errors"]), result["errors"]
    with pytest.raises(AssertionError):
        assert_every_figure_drew(broken, result)


def test_the_drift_report_draws_a_panel_per_feature_in_chromium(browser, tmp_path):
    """`rayline predict --drift-report`'s page (rayline/monitoring/report.py) for a shifted numeric
    feature and an unseen category: every panel draws its training and scored bars, offline."""
    import numpy as np

    from rayline.monitoring import FeatureCounts, drift
    from rayline.monitoring.report import render_drift_html
    from rayline.report import write_html
    from tests.unit.test_monitoring import _frame, _statistics

    stats = _statistics(_frame())
    scored = _frame(2000, seed=9)
    scored["x"] = scored["x"] + 4.0
    scored.loc[:500, "city"] = "<script>alert(1)</script>"  # a category is text the page must escape
    drifts = drift(stats, FeatureCounts.of_frame(stats, scored))
    path = write_html(render_drift_html(drifts, "Drift report: t v1", "--input shifted.csv"), tmp_path / "drift.html")
    result = render(browser, path)
    assert_every_figure_drew(path, result)
    assert len(result["figures"]) == 3 and all(np.isfinite(d.psi) for d in drifts)
    assert "<script>alert(1)</script>" not in path.read_text()  # only JSON-escaped, inside the figure's data
