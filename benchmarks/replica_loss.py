"""Replica loss at saturation: SIGKILL one of the route's two replicas while `wrk` drives the printed
route at its maximum rate, then again while `rayline.Client`s (with their retries) drive it.

    python benchmarks/replica_loss.py [--seconds 40] [--kill-at 10] [--workspace W]

1. A registered digits model served by `rayline run pipelines/digits-torch.yaml` on a local head
   (`rayline cluster up`, temporary workspace under benchmarks/), the route with exactly two
   replicas (`--set serve.replicas.min=2 --set serve.replicas.max=2`).
2. Without retries: `wrk` closed loop at 32 connections (saturation: its rate is the route's
   maximum) for `--seconds`, in 2-second runs each counting every request it sent: answers by
   status and connect/read/write errors and timeouts (hey's CSV leaves out requests that got no
   answer at all, so it cannot count them). At `--kill-at` one route replica process
   (`ray::ServeReplica:digits:digits-router`) gets SIGKILL. Reported: requests, failures by kind,
   the share answered 2xx, p99 before the kill and during recovery (the worst 2-second run from
   the kill until Serve reports two RUNNING replicas again), and that recovery time.
3. With retries: 8 threads of `rayline.Client.predict` (max_retries 5) for `--seconds`, the other
   replica killed at `--kill-at`: every call must succeed.
Targets: >= 99.9% 2xx without client retries, 100% with them, replica back within 60 s.
Exit code: 0 when every target is met, 1 when one is missed, 2 on a setup failure.
Needs `wrk` (Debian: apt-get install wrk).
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
from harness import format_table, machine_info, wait_http  # noqa: E402
from serving import REPO, SPEC, _rayline, stop_head  # noqa: E402

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


_WRK_SCRIPT = """wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = [==[%s]==]
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT %%d %%d %%d %%d %%d %%d %%.3f\\n", summary.requests, e.connect, e.read, e.write,
    e.status, e.timeout, latency:percentile(99) / 1000))
end
"""


def _wrk_segment(url: str, script: str, seconds: float) -> dict:
    """One closed-loop wrk run (32 connections, 2 threads): requests, failures by kind, p99 (ms)."""
    proc = subprocess.run([shutil.which("wrk"), "-t2", "-c32", f"-d{seconds:g}s", "--timeout", "30s", "-s", script, url],
                          capture_output=True, text=True, timeout=seconds + 60)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"wrk gave no result: {proc.stdout[-500:]} {proc.stderr[-500:]}")
    requests, connect, read, write, status, timeout, p99 = line.split()[1:]
    return {"requests": int(requests), "failed": int(connect) + int(read) + int(write) + int(status) + int(timeout),
            "by_kind": {"connect": int(connect), "read": int(read), "write": int(write), "non_2xx_3xx": int(status),
                        "timeout": int(timeout)}, "p99_ms": float(p99)}


def _wrk_phase(url: str, body: bytes, args) -> dict:
    """wrk at saturation (closed loop, 32 connections) for args.seconds in 2-second segments, each
    counting every request wrk sent (answers of any status, and connect/read/write errors and
    timeouts); one replica killed at args.kill_at. p99 during recovery: the worst segment between
    the kill and the replica's return."""
    segment_s = 2.0
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as fh:
        fh.write(_WRK_SCRIPT % body.decode())
        fh.flush()
        timeline: dict = {}
        killer = None
        segments = []
        started = time.monotonic()
        while time.monotonic() - started < args.seconds:
            if killer is None and time.monotonic() - started >= args.kill_at:
                killer = threading.Thread(target=_kill_one_and_time_recovery, args=(_replica_pids(), timeline))
                killer.start()
                time.sleep(0.3)  # the kill lands inside this segment
            t0 = time.monotonic()
            segments.append((t0, time.monotonic() + segment_s, _wrk_segment(url, fh.name, segment_s)))
        if killer is not None:
            killer.join()
    requests = sum(s["requests"] for *_, s in segments)
    failed = sum(s["failed"] for *_, s in segments)
    by_kind: dict = {}
    for *_, s in segments:
        for k, v in s["by_kind"].items():
            by_kind[k] = by_kind.get(k, 0) + v
    killed, back = timeline.get("killed_at"), timeline.get("back_at")
    before = [s["p99_ms"] for t0, _, s in segments if killed and t0 + segment_s < killed]
    during = [s["p99_ms"] for t0, t1, s in segments if killed and back and t1 >= killed and t0 <= back]
    wall = segments[-1][1] - segments[0][0] if segments else 0.0
    return {"requests": requests, "failed": failed, "by_kind": by_kind, "ok_share": (requests - failed) / max(1, requests),
            "rate": requests / wall if wall else 0.0,
            "p99_before_ms": max(before) if before else float("nan"),
            "p99_recovery_ms": max(during) if during else float("nan"),
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
    if not shutil.which("wrk"):
        print("needs `wrk` (Debian: apt-get install wrk)", file=sys.stderr)
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
        from rayline.cluster.connection import connect
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

        no_retries = _wrk_phase(f"{url}/predict", body, args)
        rate = no_retries["rate"]
        print(f"wrk at saturation ({rate:.0f}/s), one replica killed: {no_retries}", flush=True)
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
            ("replica back (wrk phase)", f"{no_retries['recovery_s']:.1f} s", "<= 60 s", no_retries["recovery_s"] <= 60),
            ("replica back (client phase)", f"{with_retries['recovery_s']:.1f} s", "<= 60 s", with_retries["recovery_s"] <= 60),
        ]
        machine = machine_info(("rayline", "ray"))
        print(f"\nmachine: {machine['cores']} cores, {machine['cpu']}, {machine['ram_gib']} GiB RAM; route with 2 replicas")
        print(f"wrk phase: {no_retries['requests']} requests at {rate:.0f}/s, {no_retries['failed']} failed "
              f"({no_retries['by_kind']}); p99 {no_retries['p99_before_ms']:.1f} ms before the kill, "
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
            stop_head(ws, args.ray_port, remove_session=True)
        if owned_ws:
            shutil.rmtree(ws, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
