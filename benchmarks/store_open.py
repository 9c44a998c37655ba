"""Opening a new workspace's MLflow store: MLflow creating it (its Alembic migrations) against
rayline's copy of an empty store (rayline/registry/store_template.py), side by side (issues 36, 37).

    python benchmarks/store_open.py               # 5 rounds, ~1 min on 2 cores
    python benchmarks/store_open.py --rounds 9

Each round, in one fresh Python process per side (MLflow imported before the clock starts, as in
`rayline run`, where the import is paid earlier anyway): the time from nothing to a store whose
tracking and registry tables are open, in a new directory. "MLflow" is what rayline did before:
`MlflowClient` on a new `sqlite:///` URI, both stores opened. "rayline" is `rayline.registry.store.Store`
on a new workspace, with the template already built in the user cache (the first store on a machine
builds it, at MLflow's cost; that round is printed on its own). Medians and the ratio are printed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]

_MLFLOW = """
import sys, time
import mlflow  # noqa: F401
from mlflow.tracking import MlflowClient
t = time.perf_counter()
uri = "sqlite:///" + sys.argv[1] + "/mlflow.db"
MlflowClient(tracking_uri=uri, registry_uri=uri)._get_registry_client().store.search_registered_models()
print(time.perf_counter() - t)
"""

_RAYLINE = """
import sys, time
import mlflow  # noqa: F401
from mlflow.tracking import MlflowClient  # noqa: F401  (both sides import it before the clock)
from rayline.registry.store import Store
from rayline.workspace import workspace
t = time.perf_counter()
Store(workspace(sys.argv[1]).ensure()).client.search_registered_models()
print(time.perf_counter() - t)
"""


def _time(code: str, directory: Path, env: dict) -> float:
    out = subprocess.run([sys.executable, "-c", code, str(directory)], capture_output=True, text=True, env=env, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rayline-store-bench-") as tmp:
        root = Path(tmp)
        env = {**os.environ, "PYTHONPATH": str(ROOT / "platform"), "RAYLINE_CACHE_DIR": str(root / "cache"),
               "MLFLOW_LOGGING_LEVEL": "WARNING"}
        first = _time(_RAYLINE, root / "first", env)  # builds the template
        mlflow_s, rayline_s = [], []
        for i in range(args.rounds):  # alternating, so a busy moment hits both sides alike
            mlflow_s.append(_time(_MLFLOW, root / f"m{i}", env))
            rayline_s.append(_time(_RAYLINE, root / f"r{i}", env))
    load = os.getloadavg()[0]
    print(f"new workspace store, {args.rounds} rounds each, load average {load:.1f}")
    print(f"  MLflow creates it (migrations):   median {median(mlflow_s):.2f} s  {[round(s, 2) for s in mlflow_s]}")
    print(f"  rayline copies the empty store:   median {median(rayline_s):.2f} s  {[round(s, 2) for s in rayline_s]}")
    print(f"  the first store on a machine (builds the template): {first:.2f} s")
    print(f"  ratio rayline / MLflow: {median(rayline_s) / median(mlflow_s):.3f}x")


if __name__ == "__main__":
    main()
