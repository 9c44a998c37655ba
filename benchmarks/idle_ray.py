"""What an idle Ray costs a minute, by process: a Ray as rayline embeds it (rayline.cluster.env.train_env,
and no log monitor without --verbose: rayline.cluster.connection.stop_log_monitor) against Ray's
defaults (a log monitor that looks for new log files on every 0.1-s pass while the folder holds under
1,000 files). Each side is its own embedded Ray, in its own process,
with the dashboard, after 150 short-lived actors have left their log files (what a few runs leave).

    python benchmarks/idle_ray.py               # 2 rounds x 2 sides x 60 s, 6-11 min on 2 cores
    python benchmarks/idle_ray.py --seconds 30 --rounds 1

Prints each side's median CPU-seconds a minute: the log monitor, and every Ray process together.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
_ACTORS = 150


def _one_side(seconds: float, side: str) -> dict:
    """In a child process: start Ray, leave _ACTORS actors' log files, idle, measure."""
    import psutil
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=True, log_to_driver=False)
    if side == "rayline":
        from rayline.cluster.connection import stop_log_monitor

        stop_log_monitor()

    @ray.remote(num_cpus=0.01)
    class Short:
        def pid(self):
            return os.getpid()

    for _ in range(0, _ACTORS, 15):
        batch = [Short.remote() for _ in range(15)]
        ray.get([a.pid.remote() for a in batch])
        for actor in batch:
            ray.kill(actor)
    time.sleep(15)  # the killed actors' processes gone
    procs = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if p.pid != os.getpid() and ("ray" in cmd) and ("session_" in cmd or "ray::" in cmd or "dashboard" in cmd):
            procs.append((p, "log monitor" if "log_monitor" in cmd else "other"))
    start = {p.pid: sum(p.cpu_times()[:2]) for p, _ in procs}
    time.sleep(seconds)
    used = {"log monitor": 0.0, "all Ray processes": 0.0}
    for p, kind in procs:
        try:
            cpu = sum(p.cpu_times()[:2]) - start[p.pid]
        except psutil.NoSuchProcess:
            continue
        used["all Ray processes"] += cpu
        if kind == "log monitor":
            used["log monitor"] += cpu
    logs = len(os.listdir(ray._private.worker._global_node.get_logs_dir_path()))
    ray.shutdown()
    return {"per_min": {k: v * 60 / seconds for k, v in used.items()}, "log_files": logs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--side", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        print(json.dumps(_one_side(args.seconds, args.side)))
        return
    sys.path.insert(0, str(ROOT / "platform"))
    from rayline.cluster.env import train_env

    ours = train_env(single_machine=True)
    base_env = {k: v for k, v in os.environ.items() if k not in ours}
    sides = {"ray default": base_env, "rayline": {**base_env, **ours}}
    figures: dict[str, list[dict]] = {name: [] for name in sides}
    for _ in range(args.rounds):
        for name, env in sides.items():
            env = {**env, "PYTHONPATH": str(ROOT / "platform")}
            done = subprocess.run([sys.executable, __file__, "--side", name, "--seconds", str(args.seconds)],
                                  capture_output=True, text=True, env=env, check=True)
            figures[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    files = figures["rayline"][0]["log_files"]
    print(f"idle Ray after {_ACTORS} actors ({files} log files), CPU-s a minute, median of {args.rounds}")
    print(f"{'':22}{'ray default':>12}{'rayline':>10}{'ratio':>8}")
    for key in ("log monitor", "all Ray processes"):
        base = median(f["per_min"][key] for f in figures["ray default"])
        new = median(f["per_min"][key] for f in figures["rayline"])
        print(f"{key:22}{base:12.2f}{new:10.2f}{new / base:8.2f}")


if __name__ == "__main__":
    main()
