"""The data plane, side by side: `rayline run --no-serve` (xgboost) vs pandas + sklearn + xgboost by hand.

    python benchmarks/data_stage.py                       # 1M rows (~2 min on 2 cores)
    python benchmarks/data_stage.py --rows 1000000,10000000 --json-out data_stage.json
    python benchmarks/data_stage.py --rows 1000000 --profile prof.txt   # py-spy of rayline's driver
    python benchmarks/data_stage.py --rows 100000000 --no-by-hand        # 3.5 GB: more than pandas can hold here

What one run does, for each row count:
1. Data: a churn-like CSV (6 feature columns: `tenure` int, `monthly` float with 5% missing,
   `total` float; `contract`, `payment`, `internet` strings; label `churn` yes/no from a
   noisy rule), written 500,000 rows at a time, so the generator never holds the file.
2. (a) by hand, one process: `pd.read_csv`, `train_test_split` (80/10/10, seed 0), an sklearn
   `ColumnTransformer` fitted on train (median `SimpleImputer` + `StandardScaler` on the numeric
   columns, `OneHotEncoder` on the three strings), `xgboost.train` (10 rounds, depth 6, eta
   0.3, `nthread` 2, hist), test accuracy. Its "data" time is read -> transformed arrays.
3. (b) `rayline run SPEC --no-serve` as a subprocess, with its own embedded Ray (start-up in
   its time): the same split fractions and steps (`impute` median, `one_hot`, `standard_scale`),
   xgboost `gbdt` 10 rounds on 2 workers. Its data time is what the CLI prints for the stage
   (`data: done in X s`, the CLI's plain lines when not at a terminal), and its phases' lines.
4. (c) the same `rayline run` again in the same workspace: the unchanged data stage must come
   from the data cache (the run fails otherwise); its data-stage seconds and (b)'s share.
5. (d) batch scoring of the same CSV with the model (b) registered: `rayline predict bench-churn
   --input CSV --output OUT.parquet` against, by hand, `pd.read_csv` + `rayline.load_model(...)
   .predict` + `to_parquet`; both outputs must hold the same predictions in the same order.
   (benchmarks/batch_scoring.py does the same for 64-column Parquet files, with both engines.)
Both run as subprocesses; every 0.2 s the RSS and PSS of each one's whole process tree are
summed (see batch_scoring.py's TreeSampler: PSS is the fair figure for Ray's shared memory),
and the driver's own peak RSS is recorded separately (the figure that decides whether the
driver runs out of memory before pandas does). Both test accuracies are printed: a data
plane that is fast but trains on something else is not a result.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from batch_scoring import TreeSampler, mib  # noqa: E402 - the same process-tree sampler

ROOT = Path(__file__).resolve().parents[1]
CHUNK_ROWS = 500_000
NUMERIC, CATEGORICAL, LABEL = ["tenure", "monthly", "total"], ["contract", "payment", "internet"], "churn"


def generate(path: Path, rows: int, seed: int = 0) -> None:
    """A churn-like CSV of `rows` rows, written a chunk at a time."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    with open(path, "w") as fh:
        for start in range(0, rows, CHUNK_ROWS):
            n = min(CHUNK_ROWS, rows - start)
            contract = rng.choice(["month", "one_year", "two_year"], n, p=[0.55, 0.25, 0.2])
            payment = rng.choice(["card", "bank", "check", "mail"], n)
            internet = rng.choice(["fiber", "dsl", "none"], n, p=[0.45, 0.35, 0.2])
            tenure = rng.integers(1, 73, n)
            monthly = rng.normal(65, 30, n).clip(18, 120).round(2)
            total = (monthly * tenure * rng.uniform(0.9, 1.1, n)).round(2)
            score = ((contract == "month") * 1.2 + (internet == "fiber") * 0.6 + (payment == "check") * 0.4
                     - tenure / 24 + (monthly - 65) / 40 + rng.normal(0, 0.8, n))
            monthly_shown = monthly.astype(object)
            monthly_shown[rng.random(n) < 0.05] = None
            frame = pd.DataFrame({"tenure": tenure, "monthly": monthly_shown, "total": total, "contract": contract,
                                  "payment": payment, "internet": internet,
                                  LABEL: np.where(score > 0.3, "yes", "no")})
            frame.to_csv(fh, index=False, header=start == 0)


BY_HAND = r"""
import json, sys, time
t0 = time.monotonic()
import numpy as np, pandas as pd, xgboost as xgb
from sklearn.compose import ColumnTransformer
from sklearn.impute import SimpleImputer
from sklearn.model_selection import train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler
path, numeric, categorical, label = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(","), sys.argv[4]
frame = pd.read_csv(path)
y = (frame.pop(label) == "yes").to_numpy(np.int32)
x_train, x_rest, y_train, y_rest = train_test_split(frame, y, test_size=0.2, random_state=0)
x_valid, x_test, y_valid, y_test = train_test_split(x_rest, y_rest, test_size=0.5, random_state=0)
prep = ColumnTransformer([("num", make_pipeline(SimpleImputer(strategy="median"), StandardScaler()), numeric),
                          ("cat", OneHotEncoder(handle_unknown="ignore"), categorical)], sparse_threshold=0)
train = prep.fit_transform(x_train).astype(np.float32)
valid, test = (prep.transform(x).astype(np.float32) for x in (x_valid, x_test))
data_s = time.monotonic() - t0
params = {"objective": "binary:logistic", "max_depth": 6, "eta": 0.3, "nthread": 2, "tree_method": "hist",
          "eval_metric": "logloss"}
booster = xgb.train(params, xgb.DMatrix(train, y_train), 10, evals=[(xgb.DMatrix(valid, y_valid), "valid")],
                    verbose_eval=False)
accuracy = float(((booster.predict(xgb.DMatrix(test)) > 0.5) == y_test).mean())
print(json.dumps({"data_s": data_s, "accuracy": accuracy, "rows": [len(x_train), len(x_valid), len(x_test)]}))
"""


def spec_for(data: Path) -> dict:
    return {
        "name": "bench-churn",
        "data": {"source": {"format": "csv", "path": str(data)}, "label": LABEL,
                 "split": {"valid": 0.1, "test": 0.1, "seed": 0},
                 "preprocess": [{"impute": {"columns": ["monthly"], "strategy": "median"}},
                                {"one_hot": {"columns": CATEGORICAL}},
                                {"standard_scale": {"columns": "numeric"}}]},
        "task": "classification",
        "model": {"framework": "xgboost", "kind": "gbdt",
                  "params": {"max_depth": 6, "eta": 0.3, "num_boost_round": 10}},
        "train": {"workers": 2, "metric": "accuracy"},
    }


def measured(cmd: list[str], env: dict, profile: Path | None = None) -> dict:
    """Run `cmd`; wall seconds, peak RSS/PSS of its process tree and of the process itself, its output."""
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sampler = TreeSampler(proc.pid)
    spy = None
    if profile is not None and shutil.which("py-spy"):
        spy = subprocess.Popen(["py-spy", "record", "--pid", str(proc.pid), "--format", "raw", "--output",
                                str(profile), "--rate", "20", "--subprocesses"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    output, _ = proc.communicate()
    seconds = time.monotonic() - started
    sampler.stop()
    if spy is not None:  # it follows Ray's processes, some outliving the driver: stop it, and it writes
        spy.send_signal(signal.SIGINT)
        spy.wait(timeout=60)
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{output}")
    return {"seconds": seconds, "peak_rss": sampler.peak_rss, "peak_pss": sampler.peak_pss,
            "driver_peak_rss": sampler.peak_root_rss, "output": output}


SCORE_BY_HAND = r"""
import sys, pandas as pd, rayline
data, out, ws, label = sys.argv[1:5]
frame = pd.read_csv(data)
model = rayline.load_model("bench-churn", workspace=ws)
predictions = model.predict(frame.drop(columns=[label]))["predictions"]
frame.assign(prediction=predictions).to_parquet(out, index=False)
print(f"scored {len(frame)} rows")
"""


def same_predictions(a: Path, b: Path) -> str | None:
    """None when both Parquet files hold the same predictions in the same order, else what differs."""
    import pyarrow.parquet as pq

    pa_, pb = (pq.read_table(f, columns=["prediction"]).column("prediction").to_pylist() for f in (a, b))
    if len(pa_) != len(pb):
        return f"{len(pa_)} rows vs {len(pb)}"
    bad = [i for i, (x, y) in enumerate(zip(pa_, pb)) if x != y]
    return f"{len(bad)} predictions differ, first at row {bad[0]}" if bad else None


def rayline_accuracy(ws: Path) -> float:
    sys.path.insert(0, str(ROOT / "platform"))
    import rayline

    return float(rayline.load_model("bench-churn", workspace=str(ws)).meta["test_metrics"]["accuracy"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="1000000", help="comma-separated row counts (default 1000000)")
    parser.add_argument("--profile", help="record rayline's driver with py-spy (raw stacks) into this file")
    parser.add_argument("--json-out")
    parser.add_argument("--no-by-hand", action="store_true",
                        help="skip (a): for sizes pandas cannot hold in this machine's memory (100M rows: ~40 GB)")
    args = parser.parse_args()
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("RAY_ADDRESS", None)
    tmp = Path(tempfile.mkdtemp(prefix=".data-bench-", dir=ROOT / "benchmarks"))
    report = {"machine": {"cores": os.cpu_count(), "cpu": platform.processor() or platform.machine(),
                          "ram_gib": round(psutil.virtual_memory().total / 2**30, 1)}, "runs": []}
    try:
        import yaml

        for rows in (int(r) for r in args.rows.split(",")):
            data = tmp / f"churn-{rows}.csv"
            t0 = time.monotonic()
            generate(data, rows)
            print(f"\n{rows:,} rows: generated {data.stat().st_size / 2**20:,.0f} MiB of CSV in "
                  f"{time.monotonic() - t0:.1f} s", flush=True)
            load_before = os.getloadavg()[0]
            hand = None
            if not args.no_by_hand:
                hand = measured([sys.executable, "-c", BY_HAND, str(data), ",".join(NUMERIC), ",".join(CATEGORICAL), LABEL], env)
                hand.update(json.loads(hand.pop("output").strip().splitlines()[-1]))
            ws = tmp / f"ws-{rows}"
            spec_path = tmp / "churn.yaml"
            spec_path.write_text(yaml.safe_dump(spec_for(data)))
            ours = measured([sys.executable, "-m", "rayline.cli", "run", str(spec_path), "--no-serve", "-w", str(ws)],
                            env, Path(args.profile) if args.profile else None)
            match = re.search(r"^data: done in ([0-9.]+) s", ours["output"], re.M)
            if not match:
                raise SystemExit(f"no 'data: done in' line in rayline's output:\n{ours['output']}")
            ours["data_s"] = float(match.group(1))
            ours["phases"] = re.findall(r"^data: (?!done|started)(.*)$", ours["output"], re.M)
            ours["accuracy"] = rayline_accuracy(ws)
            ours.pop("output")
            # (c) the same command again: an unchanged pipeline's data stage comes from the data cache.
            try:
                again = measured([sys.executable, "-m", "rayline.cli", "run", str(spec_path), "--no-serve", "-w", str(ws)], env)
            except SystemExit as exc:  # (b)'s figures still count: print them, and why (c) failed
                again = {"error": str(exc)[-3000:], "data_s": float("nan"), "seconds": float("nan"), "output": ""}
                print(f"(c) failed: {again['error']}", flush=True)
            cached = re.search(r"^data: done in ([0-9.]+) s: .*cached", again["output"], re.M)
            if not cached and "error" not in again:
                raise SystemExit(f"the re-run's data stage was not read from the cache:\n{again['output']}")
            if cached:
                again["data_s"] = float(cached.group(1))
            again.pop("output")
            ours["rerun"] = again
            # (d) batch scoring of the same file with the registered model, and by hand.
            scored = tmp / "scored.parquet"
            score = measured([sys.executable, "-m", "rayline.cli", "predict", "bench-churn", "--input", str(data),
                              "--output", str(scored), "-w", str(ws)], env)
            score.pop("output")
            ours["predict"] = score
            if hand is not None:
                by_hand_scored = tmp / "scored-by-hand.parquet"
                hand_score = measured([sys.executable, "-c", SCORE_BY_HAND, str(data), str(by_hand_scored), str(ws), LABEL],
                                      env)
                hand_score.pop("output")
                hand["predict"] = hand_score
                differ = same_predictions(scored, by_hand_scored)
                if differ:
                    raise SystemExit(f"batch scoring by hand and by rayline differ ({differ})")
                by_hand_scored.unlink()
            scored.unlink()
            run = {"rows": rows, "csv_mib": data.stat().st_size / 2**20, "by_hand": hand, "rayline": ours,
                   "load_average_before": load_before, "load_average_after": os.getloadavg()[0]}
            report["runs"].append(run)
            print(f"{'':<30}{'(a) pandas+sklearn+xgboost':>28}{'(b) rayline run':>18}{'(a)/(b) speed':>15}")
            skipped = f"{'skipped':>28}"
            for label, key in (("data stage, s", "data_s"), ("whole run, s", "seconds")):
                print(f"{label:<30}" + (f"{hand[key]:>28.1f}{ours[key]:>18.1f}{hand[key] / ours[key]:>14.2f}x" if hand
                                        else f"{skipped}{ours[key]:>18.1f}"))
            for label, key in (("driver peak RSS", "driver_peak_rss"), ("process tree peak PSS", "peak_pss")):
                print(f"{label:<30}" + (f"{mib(hand[key]):>28}{mib(ours[key]):>18}{ours[key] / hand[key]:>14.2f}x mem" if hand
                                        else f"{skipped}{mib(ours[key]):>18}"))
            print(f"{'test accuracy':<30}" + (f"{hand['accuracy']:>28.4f}" if hand else skipped) + f"{ours['accuracy']:>18.4f}")
            hs, rs = (hand or {}).get("predict"), ours["predict"]
            print(f"{'(d) batch scoring, s':<30}" + (f"{hs['seconds']:>28.1f}{rs['seconds']:>18.1f}"
                                                       f"{hs['seconds'] / rs['seconds']:>14.2f}x" if hs
                                                       else f"{skipped}{rs['seconds']:>18.1f}"))
            print(f"{'(d) scoring peak PSS':<30}" + (f"{mib(hs['peak_pss']):>28}{mib(rs['peak_pss']):>18}"
                                                       f"{rs['peak_pss'] / hs['peak_pss']:>14.2f}x mem" if hs
                                                       else f"{skipped}{mib(rs['peak_pss']):>18}"))
            print(f"(c) rayline run again (data cached): data stage {again['data_s']:.1f} s "
                  f"({again['data_s'] / ours['data_s']:.0%} of (b)'s), whole run {again['seconds']:.1f} s")
            print("(b)'s data stage, phase by phase: " + "; ".join(ours["phases"]))
            print(f"load average {load_before:.1f} -> {run['load_average_after']:.1f}", flush=True)
            data.unlink()
            shutil.rmtree(ws, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
