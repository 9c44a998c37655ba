"""OpenMP's wait policy, side by side: libgomp's default (threads spin after each parallel region) against
OMP_WAIT_POLICY=PASSIVE (they sleep), which the test suite sets for its processes (tests/conftest.py:
its box is always busy) and rayline leaves at libgomp's default. Each case runs in a fresh process
(libgomp reads the policy once, at load),
on an idle machine and with --load busy processes beside it (what a run's other workers, Ray's own
processes or a CI box's other jobs are).

    python benchmarks/thread_waits.py                  # idle, then beside 2 busy processes; 3 rounds
    python benchmarks/thread_waits.py --load 0 --rounds 5

The work: a torch MLP (64 -> 128 -> 10, Adam, batch 32, 8 epochs of 3,000 rows) on 2 intra-op threads,
as rayline trains in process on 2 CPUs, and xgboost (30 rounds, depth 6, 20,000 x 20) on 2 threads.
Prints each case's median wall seconds and CPU-seconds and the ratio passive / default.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
from statistics import median

_TORCH = """
import json, time, torch
torch.manual_seed(0)
torch.set_num_threads(2)
x, y = torch.randn(3000, 64), torch.randint(0, 10, (3000,))
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
opt = torch.optim.Adam(model.parameters())
wall, cpu = time.perf_counter(), time.process_time()
for epoch in range(8):
    for i in range(0, 3000, 32):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[i:i + 32]), y[i:i + 32]).backward()
        opt.step()
print(json.dumps([time.perf_counter() - wall, time.process_time() - cpu]))
"""

_XGBOOST = """
import json, time, numpy as np, xgboost as xgb
rng = np.random.default_rng(0)
x = rng.normal(size=(20000, 20))
y = (x[:, 0] + rng.normal(size=20000) > 0).astype(int)
wall, cpu = time.perf_counter(), time.process_time()
xgb.train({"objective": "binary:logistic", "nthread": 2, "max_depth": 6}, xgb.DMatrix(x, label=y, nthread=2), 30)
print(json.dumps([time.perf_counter() - wall, time.process_time() - cpu]))
"""


def _busy() -> None:
    while True:
        pass


def _one(script: str, policy: str | None) -> tuple[float, float]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    wall, cpu = json.loads(out.stdout.strip().splitlines()[-1])
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--load", type=int, default=2, help="busy processes beside the second pass (0: idle only)")
    parser.add_argument("--json-out")
    args = parser.parse_args()
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the start")
    results = {}
    for load in sorted({0, args.load}):
        hogs = [multiprocessing.Process(target=_busy, daemon=True) for _ in range(load)]
        for hog in hogs:
            hog.start()
        try:
            for work, script in (("torch MLP, 2 threads", _TORCH), ("xgboost, 2 threads", _XGBOOST)):
                runs = {"default": [], "PASSIVE": []}
                for _ in range(args.rounds):  # alternated, so a drift of the machine reaches both alike
                    for policy in runs:
                        runs[policy].append(_one(script, None if policy == "default" else policy))
                row = {p: (median(w for w, _ in r), median(c for _, c in r)) for p, r in runs.items()}
                results[f"{work}, {load} busy"] = row
                (dw, dc), (pw, pc) = row["default"], row["PASSIVE"]
                print(f"{work:22} beside {load} busy: default {dw:6.2f} s wall {dc:6.2f} CPU-s | passive {pw:6.2f} s wall "
                      f"{pc:6.2f} CPU-s | passive/default wall {pw / dw:.2f}x, CPU {pc / dc:.2f}x", flush=True)
        finally:
            for hog in hogs:
                hog.terminate()
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
