"""Replica loss at saturation: SIGKILL one of the route's two replicas while `hey` drives the printed
route at its measured maximum rate, then again while `rayline.Client`s (with their retries) drive it.

    python benchmarks/replica_loss.py [--seconds 40] [--kill-at 10] [--workspace W]

1. A registered digits model served by `rayline run pipelines/digits-torch.yaml` on a local head
   (`rayline cluster up`, temporary workspace under benchmarks/), the route with exactly two
   replicas (`--set serve.replicas.min=2 --set serve.replicas.max=2`).
2. Saturation: `hey` at concurrency 32 for a few seconds gives the route's maximum request rate.
3. Without retries: `hey` at that rate (-q per worker) for `--seconds`; at `--kill-at` one route
   replica process (`ray::ServeReplica:digits:digits-router`) gets SIGKILL. Reported: requests,
   non-2xx (and hey's transport errors), the share of 2xx, p99 before the kill and during recovery
   (from the kill until Serve reports two RUNNING replicas again), and that recovery time.
4. With retries: 8 threads of `rayline.Client.predict` (max_retries 5) for `--seconds`, the other
   replica killed at `--kill-at`: every call must succeed.
Targets: >= 99.9% 2xx without client retries, 100% with them, replica back within 60 s.
Exit code: 0 when every target is met, 1 when one is missed, 2 on a setup failure.
Needs `hey` (Debian: apt-get install hey).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import HeyClient, format_table, machine_info, wait_http  # noqa: E402
from serving import REPO, SPEC, _head_temp_dir, _rayline, _stop_strays, _teardown_cluster  # noqa: E402

MODEL, ROUTE = "digits", "/digits"
REPLICA_TITLE = f"ray::ServeReplica:{MODEL}:{MODEL}-router"


def _parse(argv):
    p = argparse.ArgumentParser(description="SIGKILL a route replica at saturation; count failed requests.")
    p.add_argument("--seconds", type=float, default=40.0, help="length of each driven phase")
    p.add_argument("--kill-at", type=float, default=10.0, help="seconds into each phase the replica is killed")
    p.add_argument("--workspace", type=Path, help="reuse this workspace's head and endpoint")
    p.add_argument("--ray-port", type=int, default=6391)
    p.add_argument("--dashboard-port", type=int, default=8291)
    p.add_argument("--serve-port", type=int, default=8830)
    return p.parse_args(argv)


def _replica_pids() -> list[int]:
    import psutil

    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if " ".join(proc.info["cmdline"] or []).startswith(REPLICA_TITLE):
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


def _running_replicas() -> int:
    from ray import serve

    app = serve.status().applications.get(MODEL)
    deployment = app.deployments.get(f"{MODEL}-router") if app else None
    return int((deployment.replica_states or {}).get("RUNNING", 0)) if deployment else 0


def _kill_one_and_time_recovery(before: list[int], timeline: dict) -> None:
    """SIGKILL one route replica; then until Serve reports two RUNNING replicas again (a new pid)."""
    victim = before[0]
    timeline["killed_at"] = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    deadline = timeline["killed_at"] + 120
    while time.monotonic() < deadline:
        pids = _replica_pids()
        if victim not in pids and len(pids) >= 2 and _running_replicas() >= 2:
            timeline["back_at"] = time.monotonic()
            return
        time.sleep(0.2)


def _hey_phase(url: str, body: bytes, rate: float, args) -> dict:
    """hey at `rate` requests/s (32 workers, -q each) for args.seconds; one replica killed at args.kill_at."""
    workers = 32
    per_worker = max(1.0, rate / workers)
    with tempfile.NamedTemporaryFile(suffix=".json") as fh:
        fh.write(body)
        fh.flush()
        cmd = [shutil.which("hey"), "-c", str(workers), "-q", f"{per_worker:.1f}", "-z", f"{args.seconds:g}s", "-m", "POST",
               "-T", "application/json", "-D", fh.name, "-t", "30", "-o", "csv", url]
        started = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        timeline: dict = {}
        time.sleep(args.kill_at)
        killer = threading.Thread(target=_kill_one_and_time_recovery, args=(_replica_pids(), timeline))
        killer.start()
        out, _ = proc.communicate(timeout=args.seconds + 120)
        killer.join()
    rows = [line.split(",") for line in out.splitlines()[1:] if line.count(",") >= 7]
    # hey's offset column: seconds from its start to the request's start
    sent = [(started + float(r[7]), float(r[0]) * 1000, r[6]) for r in rows]
    ok = [s for s in sent if s[2].startswith("2")]
    failed = len(sent) - len(ok)  # hey writes a request that got no answer with status 0
    killed, back = timeline.get("killed_at"), timeline.get("back_at")
    before = [ms for t, ms, _ in ok if killed and t < killed]
    during = [ms for t, ms, _ in ok if killed and back and killed <= t <= back]
    return {"requests": len(sent), "non_2xx": failed, "ok_share": len(ok) / max(1, len(sent)), "rate": rate,
            "codes": sorted({s[2] for s in sent}),
            "p99_before_ms": float(np.percentile(before, 99)) if before else float("nan"),
            "p99_recovery_ms": float(np.percentile(during, 99)) if during else float("nan"),
            "recovery_s": (back - killed) if killed and back else float("nan")}


def _client_phase(url: str, rows: list, args) -> dict:
    """8 rayline.Client threads (retries on) for args.seconds; one replica killed at args.kill_at."""
    import rayline

    stop = time.monotonic() + args.seconds
    counts = {"ok": 0, "failed": 0, "first_failure": None}
    lock = threading.Lock()

    def drive(offset: int):
        import pandas as pd

        with rayline.Client(url, max_retries=5, timeout=30) as client:
            i = offset
            while time.monotonic() < stop:
                try:
                    client.predict(pd.DataFrame([rows[i % len(rows)]]))
                    with lock:
                        counts["ok"] += 1
                except Exception as exc:  # noqa: BLE001 - every failure counts, whatever it is
                    with lock:
                        counts["failed"] += 1
                        counts["first_failure"] = counts["first_failure"] or f"{type(exc).__name__}: {exc}"[:300]
                i += 8

    threads = [threading.Thread(target=drive, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    time.sleep(args.kill_at)
    timeline: dict = {}
    _kill_one_and_time_recovery(_replica_pids(), timeline)
    for t in threads:
        t.join()
    recovery = timeline["back_at"] - timeline["killed_at"] if "back_at" in timeline else float("nan")
    return {**counts, "recovery_s": recovery}


def main(argv=None) -> int:
    args = _parse(argv)
    if not shutil.which("hey"):
        print("needs `hey` (Debian: apt-get install hey)", file=sys.stderr)
        return 2
    owned_ws = args.workspace is None
    ws = (args.workspace or REPO / "benchmarks" / f".workspace-chaos-{os.getpid()}").resolve()
    url = f"http://127.0.0.1:{args.serve_port}{ROUTE}"
    started_cluster = False
    conn = None
    try:
        ws.mkdir(parents=True, exist_ok=True)
        if owned_ws:
            _rayline("cluster", "up", "--workspace", str(ws), "--port", str(args.ray_port),
                     "--dashboard-port", str(args.dashboard_port), timeout_s=300)
            started_cluster = True
            _rayline("run", str(SPEC.relative_to(REPO)), "--workspace", str(ws), "--port", str(args.serve_port),
                     "--set", "tune.num_samples=1", "--set", "train.epochs=3", "--set", "serve.replicas.min=2",
                     "--set", "serve.replicas.max=2", timeout_s=900)
        wait_http(f"{url}/health", timeout_s=120)
        from rayline.cluster import connect
        from rayline.workspace import workspace

        conn = connect(workspace(str(ws), None))
        deadline = time.monotonic() + 120
        while len(_replica_pids()) < 2 or _running_replicas() < 2:
            if time.monotonic() > deadline:
                raise SystemExit(f"the route never had two running replicas ({_replica_pids()})")
            time.sleep(0.5)
        import rayline
        from sklearn.datasets import load_digits

        predictor = rayline.load_model(MODEL, workspace=str(ws))
        features = [f.name for f in predictor.preprocessing.features]
        data = load_digits().data
        rows = [dict(zip(features, map(float, r))) for r in data[:256]]
        body = ('{"instances": [' + ",".join("[" + ",".join(f"{v:g}" for v in r) + "]" for r in data[:1]) + "]}").encode()

        saturation = HeyClient(shutil.which("hey")).measure(f"{url}/predict", [body], 32, 8.0, warmup_s=2.0)
        rate = saturation.requests_per_s
        print(f"saturation: {rate:.0f} requests/s at concurrency 32 (p99 {saturation.p99_ms:.1f} ms)", flush=True)
        no_retries = _hey_phase(f"{url}/predict", body, rate, args)
        print(f"hey at {rate:.0f}/s, one replica killed: {no_retries}", flush=True)
        deadline = time.monotonic() + 120
        while len(_replica_pids()) < 2 or _running_replicas() < 2:
            if time.monotonic() > deadline:
                raise SystemExit("the route did not get its second replica back before the retry phase")
            time.sleep(0.5)
        with_retries = _client_phase(url, rows, args)
        print(f"rayline.Client with retries, one replica killed: {with_retries}", flush=True)

        checks = [
            ("2xx without client retries", f"{100 * no_retries['ok_share']:.3f}%", ">= 99.9%", no_retries["ok_share"] >= 0.999),
            ("successes with rayline.Client retries",
             f"{with_retries['ok']}/{with_retries['ok'] + with_retries['failed']}", "100%", with_retries["failed"] == 0),
            ("replica back (hey phase)", f"{no_retries['recovery_s']:.1f} s", "<= 60 s", no_retries["recovery_s"] <= 60),
            ("replica back (client phase)", f"{with_retries['recovery_s']:.1f} s", "<= 60 s", with_retries["recovery_s"] <= 60),
        ]
        machine = machine_info(("rayline", "ray"))
        print(f"\nmachine: {machine['cores']} cores, {machine['cpu']}, {machine['ram_gib']} GiB RAM; route with 2 replicas")
        print(f"hey phase: {no_retries['requests']} requests at {rate:.0f}/s, {no_retries['non_2xx']} not 2xx "
              f"(status codes seen: {', '.join(no_retries['codes'])}); p99 {no_retries['p99_before_ms']:.1f} ms before the kill, "
              f"{no_retries['p99_recovery_ms']:.1f} ms during recovery")
        print(format_table(["check", "measured", "target", ""], [[a, b, c, "PASS" if ok else "MISS"] for a, b, c, ok in checks]))
        if with_retries["first_failure"]:
            print(f"first client failure: {with_retries['first_failure']}")
        return 0 if all(ok for *_, ok in checks) else 1
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return 2
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if conn is not None:
            conn.shutdown()
        if started_cluster:
            head_temp = _head_temp_dir(ws)
            _teardown_cluster(ws)
            _stop_strays(args.ray_port)
            if head_temp:
                shutil.rmtree(head_temp, ignore_errors=True)
        if owned_ws:
            shutil.rmtree(ws, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
