"""Serving benchmark: rayline's endpoint against a hand-written FastAPI server, one machine, one run.

    python benchmarks/serving.py [--quick] [--workspace W] [--json-out result.json]

1. A registered digits model: a local Ray head (`rayline cluster up`) in a temporary
   workspace under benchmarks/, then `rayline run pipelines/digits-torch.yaml` (1 trial,
   3 epochs), which deploys the endpoint and returns. `--workspace W` reuses W's endpoint
   when it already answers. Everything this script started is stopped in a `finally`
   (Ctrl-C included): `rayline cluster down`, the baseline server, the temporary workspace.
2. (a) benchmarks/baseline_server.py: FastAPI + uvicorn, the same torch weights and standard
   scaling, bare float lists.  (b) rayline: `POST /digits/predict` with `{"instances": [...]}`.
   (c) benchmarks/rayline_app_server.py: the same app (b)'s replicas run, under plain uvicorn
   with no Ray: (c)/(a) is what rayline's own code costs, (b)/(c) what the Ray Serve hop costs.
3. One client (harness.LoadClient: aiohttp in its own process) measures every server with
   real digits rows: p50/p99 and requests/s at concurrency 1, 8, 32 with one-row requests,
   and rows/s with 1,000-row requests; after a correctness check that both servers answer
   200 and agree with each other and with rayline's offline predictor on a sample of rows.
4. Prints the figures, the ratio (b)/(a) and the issue's targets (PASS/MISS), the machine,
   the versions, and the client's own CPU use next to the machine's.

Exit code: 0 when it measured (targets missed or not), 1 when a correctness check failed or
a server answered errors, 2 on a setup failure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import LoadResult, ServerProcess, format_table, load_client, machine_info, wait_http  # noqa: E402

__all__ = ["main"]

REPO = Path(__file__).resolve().parent.parent
SPEC = REPO / "pipelines" / "digits-torch.yaml"
MODEL = "digits"
ROUTE = "/digits"
BATCH_ROWS = 1000
SAMPLE_ROWS = 64  # rows of the correctness check
PACKAGES = ("rayline", "ray", "torch", "fastapi", "uvicorn", "pydantic", "numpy", "aiohttp")

SERVER_NAMES = {"(b)": "(b) rayline, printed ROUTE/predict", "(c)": "(c) rayline app, no Ray",
                "(f)": "(f) rayline app, no Ray, monitoring off",
                "(d)": "(d) rayline, ROUTE/v/N/predict", "(e)": "(e) rayline, /v2/models/NAME/infer"}

# The targets, as (b)/(a) ratios in the same run: (figure key, comparison, bound).
TARGETS = {
    "p50_ms@1": ("<=", 1.3),
    "req/s@32": (">=", 1.0),
    f"rows/s@{BATCH_ROWS}": (">=", 0.8),
    f"rows/s@{BATCH_ROWS} arrays": (">=", 0.8),
}


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="rayline endpoint vs a hand-written FastAPI server (same weights).")
    p.add_argument("--quick", action="store_true", help="short run: 1 s warm-up and 4 s per measurement")
    p.add_argument("--seconds", type=float, help="seconds per measurement (default 15; --quick 4)")
    p.add_argument("--warmup", type=float, help="warm-up seconds before each measurement (default 3; --quick 1)")
    p.add_argument("--concurrency", default="1,8,32", help="one-row request concurrencies (default 1,8,32)")
    p.add_argument("--batch-concurrency", type=int, default=2, help=f"concurrency of the {BATCH_ROWS}-row requests")
    p.add_argument("--workspace", type=Path, help="reuse this workspace (its endpoint if it answers); default: a temporary one")
    p.add_argument("--ray-port", type=int, default=6390, help="GCS port of the Ray head it starts")
    p.add_argument("--dashboard-port", type=int, default=8290)
    p.add_argument("--serve-port", type=int, default=8820, help="Ray Serve HTTP port (b)")
    p.add_argument("--baseline-port", type=int, default=8821, help="hand-written server port (a)")
    p.add_argument("--app-port", type=int, default=8822, help="rayline's app under plain uvicorn, no Ray (c)")
    p.add_argument("--app-off-port", type=int, default=8823, help="the same app with serve.monitoring off (f)")
    p.add_argument("--baseline-threads", type=int, default=1, help="torch threads of the hand-written server")
    p.add_argument("--ingress", choices=("haproxy", "proxy"), help="Serve ingress of the head it starts (default: "
                   "rayline's, HAProxy): compare the two for large bodies")
    p.add_argument("--batch-rows", type=int, default=BATCH_ROWS, help=f"rows per large request (default {BATCH_ROWS})")
    p.add_argument("--no-object-rows", action="store_true", help="large requests as value arrays only (10,000 rows as "
                   "objects are ~12 MB, over the default serve.max_body_bytes)")
    p.add_argument("--canary", type=int, metavar="PERCENT", help="measure (b) during a canary: register a copy of the "
                   "served version and `rayline serve deploy digits --version N --canary PERCENT` before measuring")
    p.add_argument("--client", choices=("auto", "hey", "aiohttp"), default="auto",
                   help="load generator: hey (Debian's package; auto picks it when installed) or the aiohttp client")
    p.add_argument("--json-out", type=Path, help="also write the results as JSON here")
    args = p.parse_args(argv)
    args.seconds = args.seconds or (4.0 if args.quick else 15.0)
    args.warmup = args.warmup if args.warmup is not None else (1.0 if args.quick else 3.0)
    args.concurrency = [int(c) for c in str(args.concurrency).split(",") if c]
    _set_batch_rows(args.batch_rows)
    return args


def _set_batch_rows(rows: int) -> None:
    global BATCH_ROWS
    BATCH_ROWS = rows


def _rayline(*argv: str, timeout_s: float) -> None:
    """A rayline CLI command from the repo root (never /tmp: a Ray driver there imports /tmp/ray)."""
    cmd = [shutil.which("rayline") or "rayline", *argv]
    print("$ rayline " + " ".join(argv), flush=True)
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise SystemExit(f"setup failed: `rayline {' '.join(argv)}` exited {proc.returncode}:\n{tail}")


def _healthy(url: str) -> bool:
    try:
        wait_http(url, timeout_s=2)
        return True
    except RuntimeError:
        return False


def _head_alive(ws: Path) -> bool:
    """Whether `ws` records a live head from `rayline cluster up` (then it is not ours to stop)."""
    from rayline.cluster.head import cluster_status
    from rayline.workspace import workspace

    return bool(cluster_status(workspace(str(ws), None)).get("alive"))


def head_temp_dir(ws: Path) -> str | None:
    try:
        return json.loads((ws / "cluster.json").read_text()).get("temp_dir")
    except (OSError, ValueError):
        return None


def _ingress(ws: Path) -> str:
    """Which Serve ingress (b) ran behind: an haproxy process of this head, or Ray's Python proxy."""
    import psutil

    temp_dir = head_temp_dir(ws)
    from rayline.cluster.head import haproxy_state_dir

    mark = haproxy_state_dir(temp_dir) if temp_dir else None  # HAProxy's config lives in this head's state dir
    for proc in psutil.process_iter(["name", "cmdline"]):
        try:
            if "haproxy" in (proc.info["name"] or "") and (not mark or any(mark in a for a in proc.info["cmdline"] or ())):
                return "HAProxy ingress"
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return "Python proxy (no haproxy process of this head found)"


def _copy_artifact(model_dir: str, dest: Path) -> None:
    """The files the hand-written server reads, copied out of the registered artifact (either layout:
    a pyfunc model keeps them under artifacts/, see rayline.inference.predictor.artifact_root)."""
    from rayline.inference.predictor import artifact_root

    model_dir = artifact_root(model_dir)
    (dest / "weights").mkdir(parents=True, exist_ok=True)
    for name in ("arch.json", "weights.pt"):
        shutil.copy(os.path.join(model_dir, "weights", name), dest / "weights" / name)
    shutil.copy(os.path.join(model_dir, "preprocessing.json"), dest / "preprocessing.json")


def _digits(features: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """sklearn's bundled digits as (rows in `features` order, labels)."""
    from sklearn.datasets import load_digits

    frame = load_digits(as_frame=True).frame
    return frame[features].to_numpy(dtype=np.float64), frame["target"].to_numpy()


def _bodies(x: np.ndarray, features: list[str], rows: int, count: int, arrays: bool = False) -> tuple[list[bytes], list[bytes]]:
    """`count` pre-encoded request bodies of `rows` rows each, for (a) and for rayline: instances
    as objects {feature: value}, or with `arrays` as value arrays in feature order (the same
    wire format as (a)'s bare float lists)."""
    a, b = [], []
    for k in range(count):
        idx = [(k * rows + j) % len(x) for j in range(rows)]
        a.append(json.dumps({"inputs": x[idx].tolist()}).encode())
        instances = x[idx].tolist() if arrays else [dict(zip(features, r)) for r in x[idx].tolist()]
        b.append(json.dumps({"instances": instances}).encode())
    return a, b


def _v2_bodies(x: np.ndarray, features: list[str], rows: int, count: int) -> list[bytes]:
    """The same rows as Open Inference Protocol requests: one FP64 tensor per feature, asking for the
    `predictions` output only (what /predict answers by default; without `outputs` V2 answers the
    class probabilities too, ten times the numbers to encode)."""
    out = []
    for k in range(count):
        idx = [(k * rows + j) % len(x) for j in range(rows)]
        block = x[idx]
        out.append(json.dumps({"inputs": [{"name": f, "shape": [rows], "datatype": "FP64", "data": block[:, i].tolist()}
                                          for i, f in enumerate(features)],
                               "outputs": [{"name": "predictions"}]}).encode())
    return out


def _check_agreement(a_url: str, b_url: str, predictor, x: np.ndarray, y: np.ndarray, features: list[str]) -> dict:
    """Both servers answer 200 and predict the same labels as rayline's offline predictor."""
    import httpx

    rng = np.random.default_rng(0)
    idx = rng.choice(len(x), SAMPLE_ROWS, replace=False)
    rows = x[idx]
    ra = httpx.post(a_url, json={"inputs": rows.tolist()}, timeout=30)
    rb = httpx.post(b_url, json={"instances": [dict(zip(features, r)) for r in rows.tolist()]}, timeout=30)
    problems = [f"{name}: HTTP {r.status_code}: {r.text[:300]}" for name, r in (("(a)", ra), ("(b)", rb)) if r.status_code != 200]
    if problems:
        return {"ok": False, "problems": problems}
    pa, body_b = ra.json()["predictions"], rb.json()
    pb = body_b["predictions"]
    try:
        offline = predictor.predict([dict(zip(features, r)) for r in rows.tolist()])["predictions"]
    except Exception as exc:  # a broken offline path is a finding of the check, not a crash of the benchmark
        return {"ok": False, "problems": [f"offline predictor: {type(exc).__name__}: {exc}"]}
    agree_ab = sum(int(p == q) for p, q in zip(pa, pb))
    agree_offline = sum(int(p == q) for p, q in zip(pb, offline))
    if agree_ab != len(idx) or agree_offline != len(idx):
        problems.append(f"predictions differ on a sample of {len(idx)} rows: (a)=(b) on {agree_ab}, (b)=offline on {agree_offline}")
    if str(body_b.get("version")) != str(predictor.version):
        problems.append(f"the endpoint serves version {body_b.get('version')}, the registry's newest is {predictor.version}")
    accuracy = float(np.mean(np.asarray(pb) == y[idx]))
    return {"ok": not problems, "problems": problems, "rows": len(idx), "agree_a_b": agree_ab,
            "agree_b_offline": agree_offline, "sample_accuracy": accuracy, "version": body_b.get("version")}


def _ratio(key: str, a: dict, b: dict) -> float:
    return b[key] / a[key] if a.get(key) else float("nan")


def _figures(results: dict[str, LoadResult]) -> dict[str, float]:
    out = {}
    for scenario, r in results.items():
        if scenario.startswith("rows"):
            out[f"rows/s@{BATCH_ROWS}"] = r.rows_per_s
            out[f"p50_ms@{BATCH_ROWS}"] = r.p50_ms
        elif scenario.startswith("arrays"):
            out[f"rows/s@{BATCH_ROWS} arrays"] = r.rows_per_s
            out[f"p50_ms@{BATCH_ROWS} arrays"] = r.p50_ms
        else:
            c = r.concurrency
            out[f"p50_ms@{c}"], out[f"p99_ms@{c}"], out[f"req/s@{c}"] = r.p50_ms, r.p99_ms, r.requests_per_s
    return out


def _start_canary(ws: Path, version: str, percent: int) -> None:
    """A new version holding `version`'s artifact, deployed as a canary with `percent`% of the route."""
    from rayline.registry import DEPLOYMENTS_TAG, Registry
    from rayline.workspace import workspace

    client = Registry(workspace(str(ws), None)).client
    mv = client.get_model_version(MODEL, version)
    tags = {k: v for k, v in mv.tags.items() if k != DEPLOYMENTS_TAG}
    copy = str(client.create_model_version(MODEL, mv.source, mv.run_id, tags=tags).version)
    _rayline("serve", "deploy", MODEL, "--version", copy, "--canary", str(percent), "--workspace", str(ws), timeout_s=300)


def _side_by_side(figures: dict, first: str, second: str, title: str, names: tuple[str, str]) -> list[str]:
    """Two servers' figures side by side with first/second ratios (empty when `first` was not measured)."""
    if first not in figures:
        return []
    f1, f2 = figures[first], figures[second]
    cell = lambda f, key: f"{f[key]:.2f}" if "ms" in key else f"{f[key]:.0f}"  # noqa: E731
    rows = [[key.replace("@", " @ "), cell(f1, key), cell(f2, key), f"{_ratio(key, f2, f1):.2f}x"] for key in f1]
    return ["", title, format_table(["figure", *names, f"{first}/{second}"], rows)]


def _router_hop(figures: dict) -> list[str]:
    """What the model's route costs: (b) printed `ROUTE/predict` against (d) `ROUTE/v/N/predict`."""
    if "(d)" not in figures:
        return []
    return _side_by_side(figures, "(b)", "(d)", "route: (b) the printed ROUTE/predict vs (d) ROUTE/v/N/predict, same version:",
                         ("(b) printed route", "(d) version route"))


def _v2_cost(figures: dict) -> list[str]:
    """What the Open Inference Protocol costs: (e) /v2 infer against (b) ROUTE/predict, same rows."""
    return _side_by_side(figures, "(e)", "(b)", "V2: (e) /v2/models/NAME/infer vs (b) ROUTE/predict, same rows "
                         "(target: p50 <= 1.2x):", ("(e) /v2 infer", "(b) /predict"))


def _monitoring_cost(figures: dict) -> list[str]:
    """What live drift monitoring costs a request: (c) the app with serve.monitoring on (the
    default) against (f) the same app with it off, both under plain uvicorn (target: p50 <= 1.05x)."""
    if "(f)" not in figures:
        return []
    return _side_by_side(figures, "(c)", "(f)", "monitoring: (c) the app with serve.monitoring on (default) vs (f) off, "
                         "no Ray (target: p50 <= 1.05x):", ("(c) monitoring on", "(f) monitoring off"))


def _report(args, machine: dict, check: dict, results: dict[str, dict]) -> tuple[str, dict]:
    """`results`: server label -> scenario -> LoadResult, (a) first; ratios are against (a)."""
    figures = {label: _figures(res) for label, res in results.items()}
    fa, fb = figures["(a)"], figures["(b)"]
    others = [label for label in figures if label != "(a)"]
    rows, verdicts = [], {}
    for key in fa:
        ratio = _ratio(key, fa, fb)
        target, verdict = "", ""
        if key in TARGETS:
            op, bound = TARGETS[key]
            ok = ratio <= bound if op == "<=" else ratio >= bound
            target, verdict = f"{op} {bound}x", ("PASS" if ok else "MISS")
            verdicts[key] = {"ratio": ratio, "target": f"{op} {bound}", "result": verdict}
        fmt = "{:.2f}" if "ms" in key else "{:.0f}"
        label = key.replace("@", " @ ")
        if f"@{BATCH_ROWS}" in key:
            label = label.replace(" arrays", "") + f" rows/request ({'value arrays' if key.endswith('arrays') else 'objects'}), concurrency {args.batch_concurrency}"
        cells = [fmt.format(fa[key])]
        for other in others:
            cells += [fmt.format(figures[other][key]), f"{_ratio(key, fa, figures[other]):.2f}x"]
        rows.append([label, *cells, target, verdict])
    header = ["figure", "(a) FastAPI by hand"]
    for other in others:
        header += [SERVER_NAMES[other], f"{other}/(a)"]
    table = format_table(header + ["target for (b)", ""], rows)
    load_rows = []
    for scenario in results["(a)"]:
        for name, res in results.items():
            r = res[scenario]
            load_rows.append([scenario, name, r.requests, r.errors, f"{r.client_cpu:.2f}", f"{r.machine_cpu:.2f}"])
    load = format_table(["scenario", "server", "requests", "errors", "client cores", "machine cores busy"], load_rows)
    v = machine["versions"]
    text = "\n".join([
        f"\nmachine: {machine['cores']} cores, {machine['cpu']}, {machine['ram_gib']} GiB RAM, {machine['os']}, "
        f"load average (1 min) at start {machine['load_avg_1m']}; (b) behind the {machine['ingress']}",
        "versions: python " + machine["python"] + ", " + ", ".join(f"{k} {v[k]}" for k in v),
        f"run: {args.warmup:g} s warm-up + {args.seconds:g} s per measurement, closed loop, keep-alive, client "
        f"{machine['client']}; {machine.get('canary', 'no canary')}; "
        f"baseline torch threads {args.baseline_threads}; correctness: {check.get('agree_a_b')}/{check.get('rows')} rows agree "
        f"(a)=(b), {check.get('agree_b_offline')}/{check.get('rows')} (b)=offline, model version {check.get('version')}",
        "", table, *_router_hop(figures), *_v2_cost(figures), *_monitoring_cost(figures), "",
        "client and machine CPU (cores busy over each measurement; the machine figure includes everyone):", load,
    ])
    summary = {"figures": {**{label.strip("()"): f for label, f in figures.items()},
                           "ratio": {k: _ratio(k, fa, fb) for k in fa},
                           "ratio_c": {k: _ratio(k, fa, figures["(c)"]) for k in fa} if "(c)" in figures else {},
                           "ratio_router": {k: _ratio(k, figures["(d)"], fb) for k in fb} if "(d)" in figures else {},
                           "ratio_v2": {k: _ratio(k, fb, figures["(e)"]) for k in fb} if "(e)" in figures else {},
                           "ratio_monitoring": ({k: _ratio(k, figures["(f)"], figures["(c)"]) for k in fb}
                                                if "(f)" in figures else {})},
               "targets": verdicts}
    return text, summary


def _measure_all(args, client, urls: dict[str, str], x: np.ndarray, features: list[str]):
    """server label -> scenario -> LoadResult; (a) takes bare float lists, the others rayline's instances."""
    results: dict[str, dict[str, LoadResult]] = {label: {} for label in urls}
    one_a, one_b = _bodies(x, features, 1, len(x))
    big_a, big_b = _bodies(x, features, BATCH_ROWS, 4)
    _, big_arrays = _bodies(x, features, BATCH_ROWS, 4, arrays=True)
    one_v2, big_v2 = _v2_bodies(x, features, 1, 64), _v2_bodies(x, features, BATCH_ROWS, 4)
    scenarios = [(f"1 row @ {c}", one_a, one_b, one_v2, c, 1) for c in args.concurrency]
    if not args.no_object_rows:
        scenarios.append((f"rows {BATCH_ROWS} @ {args.batch_concurrency}", big_a, big_b, big_v2, args.batch_concurrency,
                          BATCH_ROWS))
    scenarios.append((f"arrays {BATCH_ROWS} @ {args.batch_concurrency}", big_a, big_arrays, big_v2, args.batch_concurrency,
                      BATCH_ROWS))
    for name, bodies_a, bodies_b, bodies_v2, conc, rows in scenarios:
        # Every server per scenario in turn, so slow drifts in the neighbours' load hit all alike.
        for label, url in urls.items():
            bodies = bodies_a if label == "(a)" else bodies_v2 if label == "(e)" else bodies_b
            r = client.measure(url, bodies, conc, args.seconds, warmup_s=args.warmup, rows_per_request=rows)
            results[label][name] = r
            print(f"  {name:<16} {label} {r.requests_per_s:8.1f} req/s  p50 {r.p50_ms:7.2f} ms  p99 {r.p99_ms:7.2f} ms  "
                  f"errors {r.errors}  client {r.client_cpu:.2f} cores  machine {r.machine_cpu:.2f} cores", flush=True)
            if r.first_error:
                print(f"    first error: {r.first_error}", flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    started = time.monotonic()
    owned_ws = args.workspace is None
    ws = (args.workspace or REPO / "benchmarks" / f".workspace-{os.getpid()}").resolve()
    started_cluster = False
    a_url = f"http://127.0.0.1:{args.baseline_port}"
    b_url = f"http://127.0.0.1:{args.serve_port}{ROUTE}"
    c_url = f"http://127.0.0.1:{args.app_port}"
    baseline = None
    app_server = None
    app_off_server = None
    f_url = f"http://127.0.0.1:{args.app_off_port}"
    client = None
    try:
        if owned_ws or not _healthy(f"{b_url}/health"):
            ws.mkdir(parents=True, exist_ok=True)
            if owned_ws or not _head_alive(ws):
                _rayline("cluster", "up", "--workspace", str(ws), "--port", str(args.ray_port),
                         "--dashboard-port", str(args.dashboard_port), *(["--ingress", args.ingress] if args.ingress else []),
                         timeout_s=300)
                started_cluster = True
            _rayline("run", str(SPEC.relative_to(REPO)), "--workspace", str(ws), "--port", str(args.serve_port),
                     "--set", "tune.num_samples=1", "--set", "train.epochs=3", timeout_s=900)
        else:
            print(f"reusing the endpoint at {b_url} (workspace {ws})", flush=True)
        setup_s = time.monotonic() - started

        import rayline

        predictor = rayline.load_model(MODEL, workspace=str(ws))
        features = [f.name for f in predictor.preprocessing.features]
        model_copy = ws / "baseline-model"
        _copy_artifact(predictor.model_dir, model_copy)
        # load_model downloaded the artifact to a temporary folder; the Predictor holds it in memory.
        download = Path(predictor.model_dir).parent
        if download.name.startswith("rayline-") and str(download).startswith(tempfile.gettempdir()):
            shutil.rmtree(download, ignore_errors=True)
        x, y = _digits(features)

        baseline = ServerProcess(
            [sys.executable, str(REPO / "benchmarks" / "baseline_server.py"), "--model-dir", str(model_copy),
             "--port", str(args.baseline_port), "--threads", str(args.baseline_threads)],
            health_url=f"{a_url}/health", cwd=str(REPO), log_path=str(ws / "baseline_server.log"),
        ).__enter__()
        app_server = ServerProcess(
            [sys.executable, str(REPO / "benchmarks" / "rayline_app_server.py"), "--workspace", str(ws),
             "--port", str(args.app_port)],
            health_url=f"{c_url}/health", cwd=str(REPO), log_path=str(ws / "rayline_app_server.log"),
        ).__enter__()
        app_off_server = ServerProcess(
            [sys.executable, str(REPO / "benchmarks" / "rayline_app_server.py"), "--workspace", str(ws),
             "--port", str(args.app_off_port), "--no-monitoring"],
            health_url=f"{f_url}/health", cwd=str(REPO), log_path=str(ws / "rayline_app_off_server.log"),
        ).__enter__()
        wait_http(f"{b_url}/health", timeout_s=60)
        check = _check_agreement(f"{a_url}/predict", f"{b_url}/predict", predictor, x, y, features)
        print(f"correctness: {'ok' if check['ok'] else 'FAILED'} {check}", flush=True)
        if not check["ok"]:
            print("not measuring: the servers must answer 200 and agree first", file=sys.stderr)
            return 1

        machine = machine_info(PACKAGES)
        machine["ingress"] = _ingress(ws) if head_temp_dir(ws) else "unknown (endpoint not on a `rayline cluster up` head)"
        client = load_client(args.client)
        machine["client"] = f"hey ({client.binary})" if hasattr(client, "binary") else "aiohttp (harness.LoadClient)"
        print(f"measuring ({args.warmup:g} s warm-up + {args.seconds:g} s each):", flush=True)
        urls = {"(a)": f"{a_url}/predict", "(b)": f"{b_url}/predict", "(c)": f"{c_url}/predict",
                "(f)": f"{f_url}/predict"}
        if _healthy(f"{b_url}/v/{check['version']}/health"):  # the version's own route (rayline/serve/versions.py)
            urls["(d)"] = f"{b_url}/v/{check['version']}/predict"
        v2 = f"http://127.0.0.1:{args.serve_port}/v2/models/{MODEL}"
        if _healthy(f"{v2}/ready"):
            urls["(e)"] = f"{v2}/infer"
        if args.canary:
            _start_canary(ws, check["version"], args.canary)
            machine["canary"] = f"{args.canary}% to a copy of version {check['version']} during every (b) cell"
        results = _measure_all(args, client, urls, x, features)
        text, summary = _report(args, machine, check, results)
        print(text)
        errors = sum(r.errors for res in results.values() for r in res.values())
        total_s = time.monotonic() - started
        print(f"\nsetup {setup_s:.0f} s, total {total_s:.0f} s (teardown follows)")
        if args.json_out:
            result = {
                "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "machine": machine, "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                "correctness": check, **summary,
                "results": {label.strip("()"): {k: r.to_dict() for k, r in res.items()} for label, res in results.items()},
                "setup_s": setup_s, "total_s": total_s,
            }
            args.json_out.write_text(json.dumps(result, indent=1))
            print(f"wrote {args.json_out}")
        return 0 if check["ok"] and not errors else 1
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted; stopping what this run started", file=sys.stderr)
        return 130
    finally:
        # A second Ctrl-C must not cut the teardown short and leave a Ray head behind.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if client is not None:
            client.close()
        if baseline is not None:
            baseline.stop()
        if app_server is not None:
            app_server.stop()
        if app_off_server is not None:
            app_off_server.stop()
        if started_cluster:
            stop_head(ws, args.ray_port, remove_session=owned_ws)
        if owned_ws:
            shutil.rmtree(ws, ignore_errors=True)


def stop_head(ws: Path, ray_port: int, remove_session: bool) -> None:
    """`rayline cluster down` of the head this run started, what it leaves behind, and (with
    `remove_session`) that head's Ray session logs."""
    head_temp = head_temp_dir(ws)
    _teardown_cluster(ws)
    _stop_strays(ray_port)
    if remove_session and head_temp:
        shutil.rmtree(head_temp, ignore_errors=True)


def _teardown_cluster(ws: Path) -> None:
    print(f"$ rayline cluster down --workspace {ws}", flush=True)
    proc = subprocess.run([shutil.which("rayline") or "rayline", "cluster", "down", "--workspace", str(ws)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        print(f"warning: `rayline cluster down` exited {proc.returncode}: {proc.stderr.strip()[-300:]}", file=sys.stderr)


def _stop_strays(ray_port: int) -> None:
    """Stop what `cluster down` left of our head: Ray's client server (port 10001) is started
    by `ray start`, loses the head's temp dir from its command line and is re-parented to
    init, so `rayline cluster down` (2026-11-22) does not find it; one was left per run.
    Only processes of this run's own process group that name our head's GCS port are touched."""
    import psutil

    group = os.getpgrp()
    strays = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmd = proc.info["cmdline"] or []
            if (proc.pid != os.getpid() and os.getpgid(proc.pid) == group
                    and any(a.startswith("--address=") and a.endswith(f":{ray_port}") for a in cmd)):
                strays.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
            continue
    for proc in strays:
        print(f"stopping a process `rayline cluster down` left behind: {proc.pid} {' '.join(proc.info['cmdline'][:3])}")
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(strays, timeout=10)
    for proc in alive:
        proc.kill()


if __name__ == "__main__":
    sys.exit(main())
