"""From a drift alert to a promoted version, by phase: rayline's retrain loop against the same steps
scripted by hand with rayline's own commands (what a user without the loop would cron).

Both sides start alike, one after the other on one embedded Ray (2 CPUs): a model trained on
distribution A (xgboost, 1 worker) serves; steady traffic from distribution B starts; the moment
the endpoint's `/monitoring` says drifting (the alert), B's labelled file lands in the source
folder. Then
- loop: the spec's `retrain: {on: [drift], drift_for, ...}` does the rest: it notices the drift,
  runs `rayline run --no-serve`, reads the judgement, deploys the canary, promotes it;
- by hand: a script polls `/monitoring` (the same alert), runs the same `rayline run --no-serve`
  subprocess, reads the judgement the run recorded, `serve deploy --canary` (rayline.serve.versions
  .deploy), counts the canary's requests the way the loop does, and promotes.

Phases, each side: alert -> retrain started; the retrain run (subprocess: start, data, train,
register, judge); judged -> canary serving; canary -> promoted (promote_after requests at the
traffic's pace); the total. The ratio loop / by hand is the loop's own overhead.

    python benchmarks/retrain_loop.py                    # ~4-6 min on 2 cores
    python benchmarks/retrain_loop.py --rows 20000 --promote-after 300
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "platform"))
PORT = 8830


def _rows(rng, centre: float, n: int) -> pd.DataFrame:
    x1 = rng.normal(centre, 1.0, n)
    return pd.DataFrame({"x1": x1.round(4), "x2": rng.normal(0, 1, n).round(4), "y": np.where(x1 > centre, "yes", "no")})


def _spec_text(name: str, folder: Path, loop: bool, args) -> str:
    retrain = f"""
retrain:
  on: [drift]
  drift_for: {args.drift_for}
  min_interval: 1s
  check_every: {args.check_every}
  compare: {{metric: accuracy, min_delta: 0.01}}
  canary: {{percent: 50, min_requests: 20, promote_after: {args.promote_after}}}
""" if loop else ""
    return f"""
name: {name}
data:
  source: {{format: csv, path: {folder}}}
  label: y
  split: {{valid: 0.2, test: 0.2, seed: 0}}
task: classification
model: {{framework: xgboost, kind: gbdt, params: {{max_depth: 4, num_boost_round: 40}}}}
train: {{workers: 1}}
serve:
  monitoring: {{window_rows: 1000, min_rows: 200}}
{retrain}"""


class Load:
    """Steady traffic from B: one closed-loop client, 10 rows a request."""

    def __init__(self, url: str, rows: list):
        self.url, self.rows, self.codes, self._stop = url, rows, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        i = 0
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                body = {"instances": self.rows[i % (len(self.rows) - 10):][:10]}
                try:
                    self.codes.append(client.post(f"{self.url}/predict", json=body).status_code)
                except httpx.HTTPError as exc:
                    self.codes.append(type(exc).__name__)
                i += 10

    def stop(self) -> list:
        self._stop.set()
        self._thread.join(timeout=60)
        return self.codes


def _wait(check, timeout_s: float, what: str, poll_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(poll_s)
    raise SystemExit(f"{what}: not within {timeout_s:.0f} s")


def _drifting(url: str) -> bool:
    try:
        return httpx.get(f"{url}/monitoring", timeout=10).json().get("status") == "drifting"
    except (httpx.HTTPError, ValueError):
        return False


def _side(loop: bool, ws, root: Path, rng, args) -> dict:
    from rayline.pipeline.run import run_pipeline
    from rayline.retrain.loop import loop_status, stop_loop
    from rayline.spec import load_spec

    name = "bench-loop" if loop else "bench-hand"
    folder = root / name
    folder.mkdir()
    _rows(rng, 0.0, args.rows).to_csv(folder / "a.csv", index=False)
    b_rows = _rows(rng, 4.0, args.rows)
    spec_path = root / f"{name}.yaml"
    spec_path.write_text(_spec_text(name, folder, loop, args))
    summary = run_pipeline(load_spec(spec_path), ws, port=PORT, data_cache=False)
    load = Load(summary.endpoint, b_rows.drop(columns="y").to_dict("records"))
    t = {}
    try:
        _wait(lambda: _drifting(summary.endpoint), 300, "the drift alert")
        t["alert"] = time.time()
        b_rows.to_csv(folder / ".b.csv", index=False)
        os.replace(folder / ".b.csv", folder / "b.csv")
        if loop:
            seen = {}

            def look():
                status = loop_status(name) or {}
                record = status.get("record") or {}
                if record.get("current"):
                    seen.update(record["current"])
                return record

            def decided():
                last = (look().get("decisions") or [{}])[-1]
                return last if last.get("decision") in ("promoted", "rolled_back", "not_deployed", "failed") else None

            outcome = _wait(decided, 900, "the loop's decision", 0.05)["decision"]
            t["promoted"] = time.time()
            # The loop's own clock for what happened inside it (its record, epoch seconds).
            t["retrain started"], t["run done"] = seen["started"], seen["run_done"]
            t["canary"] = seen.get("canary_at", t["promoted"])
        else:
            from rayline.registry import JUDGEMENT_TAG, Registry
            from rayline.serve.routing_table import canary_counts, rollout_state
            from rayline.serve.versions import deploy, promote
            import ray

            t["retrain started"] = time.time()  # the script acts on the alert at once
            log = root / f"{name}-run.log"
            with open(log, "wb") as out:
                code = subprocess.call([sys.executable, "-m", "rayline.cli", "run", str(spec_path), "--no-serve",
                                        "--address", ray.get_runtime_context().gcs_address, "--workspace", str(ws.root)],
                                       stdout=out, stderr=subprocess.STDOUT, cwd=str(root))
            if code != 0:
                raise SystemExit(f"by hand: the run failed, see {log}")
            t["run done"] = time.time()
            registry = Registry(ws)
            mv, _ = registry.version_details(name, "latest")
            judged = json.loads((mv.tags or {}).get(JUDGEMENT_TAG) or "{}")
            if not judged.get("qualifies"):
                raise SystemExit(f"by hand: the challenger does not qualify: {judged}")
            deploy(name, str(mv.version), ws=ws, canary_percent=50, port=PORT,
                   gate={"max_error_rate": 0.05, "max_p99_ms": None, "min_requests": 20})
            t["canary"] = time.time()
            rollout = rollout_state(name)["rollout"]
            _wait(lambda: canary_counts(name, rollout, str(mv.version))[0] >= args.promote_after, 600, "canary requests", 0.05)
            promote(name, ws=ws)
            t["promoted"] = time.time()
            outcome = "promoted"
    finally:
        codes = load.stop()
        if loop:
            stop_loop(name)
        from ray import serve

        for app in list(serve.status().applications):  # the other side gets the CPUs this one's replicas held
            if app == name or app.startswith(f"{name}-"):
                serve.delete(app)
    failed = [c for c in codes if c != 200]
    return {"outcome": outcome, "requests": len(codes), "failed": len(failed), "t": t}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=5000, help="rows of each distribution's file")
    parser.add_argument("--promote-after", type=int, default=200)
    parser.add_argument("--drift-for", default="1s")
    parser.add_argument("--check-every", default="1s")
    args = parser.parse_args()

    import ray

    from rayline.cluster.env import serve_env, train_env
    from rayline.workspace import workspace

    root = ROOT / "benchmarks" / f".workspace-{os.getpid()}"
    root.mkdir()
    try:
        os.environ.update(train_env(single_machine=True))
        os.environ.update(serve_env())
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="rayline")
        ws = workspace(root / "ws").ensure()
        rng = np.random.default_rng(0)
        results = {"loop": _side(True, ws, root, rng, args), "by hand": _side(False, ws, root, rng, args)}
    finally:
        from ray import serve

        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            shutil.rmtree(root, ignore_errors=True)
    phases = [("alert -> retrain started", "alert", "retrain started"), ("retrain run", "retrain started", "run done"),
              ("judged -> canary serving", "run done", "canary"), ("canary -> promoted", "canary", "promoted"),
              ("alert -> promoted", "alert", "promoted")]
    print(f"drift_for {args.drift_for}, check_every {args.check_every}, promote_after {args.promote_after}, "
          f"{args.rows} rows a file; machine: {os.cpu_count()} CPUs")
    print(f"{'phase':28} {'loop s':>8} {'by hand s':>10} {'ratio':>7}")
    for label, a, b in phases:
        lo = results["loop"]["t"][b] - results["loop"]["t"][a]
        hand = results["by hand"]["t"][b] - results["by hand"]["t"][a]
        print(f"{label:28} {lo:8.1f} {hand:10.1f} {lo / hand if hand else float('nan'):7.2f}")
    for side, r in results.items():
        print(f"{side}: {r['outcome']}, {r['requests']} requests under load, {r['failed']} failed")


if __name__ == "__main__":
    main()
