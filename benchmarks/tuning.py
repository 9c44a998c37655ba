"""Tuning, side by side: ASHA against random search with FIFO, and a sweep's overhead against plain runs.

    python benchmarks/tuning.py                         # both parts, ~10-15 min on 2 cores
    python benchmarks/tuning.py --part asha --seeds 0,1 --json-out tuning.json

Part 1, ASHA vs FIFO (`--part asha`). One space, one budget (`--trials` trials, `--concurrent` at
a time, `--epochs` epochs each), one seed: a torch MLP (256, 256) on a synthetic 4-class problem
(sklearn's make_classification, `--rows` rows x 40 features, written to Parquet here: an epoch
takes seconds, so training, not a trial's start-up, dominates), learning rate drawn
log-uniformly over [1e-6, 1] with adam, so most draws plateau (too small) or diverge (too
large) and few learn; early stopping matters on such a space. Random search draws the
same configurations in the same order for both (Tune's generator seeded with `--seed`). For
each scheduler, from the per-report timestamps Tune writes (each trial's result.json), it
prints:
- the time from the sweep's first trial start until some trial first reports valid accuracy
  >= the target (`--target`; default: 97% of the best valid accuracy either sweep reached);
- the best valid accuracy reached by the time the faster sweep ended (equal wall time);
- each sweep's wall time and how many epochs its trials trained in all.
The ratio line says how many times faster ASHA reached the target.

Part 2, sweep overhead (`--part overhead`): the same `--overhead-trials` learning rates run as
one FIFO grid sweep with one trial at a time (rayline's tune stage: Tune, a trial driver per
trial, each a Ray Train run) and as that many `run_pipeline` calls without `tune:` one after
another on the same Ray (what a user scripting `rayline run --set train.optimizer.lr=...` gets,
minus Ray's start each time). Both train the same epochs on the same data; the ratio is the
sweep's wall time over the plain runs'.

Everything runs in this process on an embedded Ray (`rayline.cluster.connect`, as `rayline run`
starts it) with a temporary workspace under benchmarks/ that is removed afterwards. The load
average is printed beside the figures: on a shared machine it says how much to trust them.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "platform"))


def synthetic(path: Path, rows: int, seed: int = 0) -> Path:
    """A 4-class problem with 40 features (20 informative) as Parquet: hard enough that an MLP
    improves over many epochs, made here (no download)."""
    import pandas as pd
    from sklearn.datasets import make_classification

    x, y = make_classification(n_samples=rows, n_features=40, n_informative=20, n_redundant=10, n_classes=4,
                               class_sep=0.8, flip_y=0.02, random_state=seed)
    frame = pd.DataFrame(x.astype("float32"), columns=[f"f{i}" for i in range(x.shape[1])])
    frame["target"] = y
    frame.to_parquet(path, index=False)
    return path


def _spec(name: str, *, scheduler: str, trials: int, concurrent: int, epochs: int, seed: int,
          lrs: list[float] | None = None, tune: bool = True, data: Path | None = None):
    from rayline.spec import parse_spec

    source = ({"format": "parquet", "path": str(data)} if data else {"format": "sklearn", "name": "digits"})
    raw = {
        "name": name,
        "data": {"source": source, "label": "target",
                 "split": {"valid": 0.2, "test": 0.1, "seed": seed},
                 "preprocess": [{"standard_scale": {"columns": "numeric"}}]},
        "task": "classification",
        "model": {"framework": "torch", "kind": "mlp", "params": {"hidden_sizes": [256, 256] if data else [64]}},
        "train": {"workers": 1, "epochs": epochs, "batch_size": 64, "optimizer": {"name": "adam", "lr": 1e-3},
                  "metric": "accuracy"},
    }
    if tune:
        space = ({"train.optimizer.lr": {"grid": lrs}} if lrs else {"train.optimizer.lr": {"loguniform": [1e-6, 1.0]}})
        raw["tune"] = {"num_samples": trials if not lrs else 1, "max_concurrent": concurrent, "scheduler": scheduler,
                       "search": "grid" if lrs else "random", "space": space}
    return parse_spec(raw)


def _reports(ws, name: str) -> list[dict]:
    """Every report of the newest sweep of `name`: Tune's per-trial result.json lines."""
    sweeps = sorted(glob.glob(os.path.join(ws.runs_dir, f"{name}-*-tune")), key=os.path.getmtime)
    rows = []
    for path in glob.glob(os.path.join(sweeps[-1], "*", "result.json")):
        with open(path) as fh:
            rows.extend(json.loads(line) for line in fh if line.strip())
    return rows


def _timeline(reports: list[dict]) -> list[tuple[float, float, str]]:
    """(seconds since the sweep's first trial started, valid accuracy, trial id), in time order.

    Tune stamps each report with whole seconds (`timestamp`) and the trial's own clock
    (`time_total_s`): a trial's start is its first report's timestamp minus its clock then,
    and each report's time that start plus its clock (sub-second within a trial)."""
    by_trial: dict[str, list[dict]] = {}
    for row in reports:
        by_trial.setdefault(row["trial_id"], []).append(row)
    starts, points = {}, []
    for trial, rows in by_trial.items():
        rows.sort(key=lambda r: r["time_total_s"])
        starts[trial] = rows[0]["timestamp"] - rows[0]["time_total_s"]
        points += [(starts[trial] + r["time_total_s"], float(r["accuracy"]), trial) for r in rows if "accuracy" in r]
    t0 = min(starts.values())
    return sorted((t - t0, acc, trial) for t, acc, trial in points)


def asha_vs_fifo(ws, *, trials: int, concurrent: int, epochs: int, seed: int, target: float | None, data: Path) -> dict:
    from rayline.pipeline.run import run_pipeline

    out = {}
    for scheduler in ("fifo", "asha"):
        name = f"bench-{scheduler}-s{seed}"
        spec = _spec(name, scheduler=scheduler, trials=trials, concurrent=concurrent, epochs=epochs, seed=seed, data=data)
        started = time.monotonic()
        summary = run_pipeline(spec, ws, deploy=False)
        timeline = _timeline(_reports(ws, name))
        out[scheduler] = {"timeline": timeline, "end_s": timeline[-1][0],
                          "epochs_trained": len(timeline), "best": max(acc for _, acc, _ in timeline),
                          "tune_stage_s": summary.seconds.get("train"), "run_s": time.monotonic() - started,
                          "load": os.getloadavg()}
    # The target: as given, or 97% of the best either sweep reached (no calibration run needed).
    target = target or 0.97 * max(out[s]["best"] for s in ("fifo", "asha"))
    out["target"] = target
    for result in (out["fifo"], out["asha"]):
        result["to_target_s"] = next((t for t, acc, _ in result["timeline"] if acc >= target), None)
    equal = min(out["fifo"]["end_s"], out["asha"]["end_s"])
    for result in (out["fifo"], out["asha"]):
        result["best_at_equal_time"] = max((acc for t, acc, _ in result["timeline"] if t <= equal), default=None)
    out["equal_time_s"] = equal
    return out


def overhead(ws, *, trials: int, epochs: int, seed: int) -> dict:
    from rayline.pipeline.run import run_pipeline
    from rayline.spec import apply_overrides

    lrs = [round(10 ** (-3 + 1.5 * i / max(1, trials - 1)), 6) for i in range(trials)]  # 1e-3 .. ~3e-2
    sweep_spec = _spec("bench-sweep", scheduler="fifo", trials=trials, concurrent=1, epochs=epochs, seed=seed, lrs=lrs)
    started = time.monotonic()
    sweep = run_pipeline(sweep_spec, ws, deploy=False)
    sweep_s = time.monotonic() - started
    plain = _spec("bench-plain", scheduler="fifo", trials=1, concurrent=1, epochs=epochs, seed=seed, tune=False)
    started = time.monotonic()
    plain_train_s = 0.0
    for lr in lrs:
        summary = run_pipeline(apply_overrides(plain, {"train.optimizer.lr": lr}), ws, deploy=False)
        plain_train_s += summary.seconds.get("train", 0.0)
    plain_s = time.monotonic() - started
    return {"trials": trials, "lrs": lrs, "sweep_s": sweep_s, "sweep_tune_stage_s": sweep.seconds.get("train"),
            "plain_s": plain_s, "plain_train_stages_s": plain_train_s, "load": os.getloadavg()}


def _fmt(value, unit="s"):
    return "-" if value is None else (f"{value:.1f} {unit}".rstrip() if isinstance(value, float) else str(value))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("asha", "overhead", "both"), default="both")
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--concurrent", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seeds", default="0", help="comma-separated; part 1 runs once per seed")
    parser.add_argument("--target", type=float, default=None,
                        help="valid accuracy to reach (default: 97%% of the best either sweep reached)")
    parser.add_argument("--rows", type=int, default=40_000, help="rows of the synthetic data (part 1)")
    parser.add_argument("--overhead-trials", type=int, default=4)
    parser.add_argument("--overhead-epochs", type=int, default=5)
    parser.add_argument("--json-out")
    args = parser.parse_args(argv)

    from rayline.cluster.connection import connect
    from rayline.workspace import workspace

    folder = Path(tempfile.mkdtemp(prefix="tuning-bench-", dir=ROOT / "benchmarks"))
    results: dict = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": sys.version.split()[0]}}
    try:
        ws = workspace(folder / "ws").ensure()
        conn = connect(ws, None)
        try:
            if args.part in ("asha", "both"):
                results["asha_vs_fifo"] = {}
                data = synthetic(folder / "synthetic.parquet", args.rows)
                for seed in [int(s) for s in args.seeds.split(",")]:
                    r = asha_vs_fifo(ws, trials=args.trials, concurrent=args.concurrent, epochs=args.epochs, seed=seed,
                                     target=args.target, data=data)
                    results["asha_vs_fifo"][seed] = {k: ({kk: vv for kk, vv in v.items() if kk != "timeline"}
                                                         if isinstance(v, dict) else v) for k, v in r.items()}
                    print(f"\nASHA vs random search + FIFO: {args.trials} trials, {args.concurrent} at a time, "
                          f"{args.epochs} epochs max, seed {seed}, {args.rows} synthetic rows, "
                          f"target valid accuracy {r['target']:.4f}")
                    print(f"{'':28}{'FIFO':>12}{'ASHA':>12}")
                    for label, key in (("time to target", "to_target_s"), ("sweep wall time", "end_s"),
                                       ("epochs trained (all trials)", "epochs_trained"), ("best accuracy", "best"),
                                       (f"best by {r['equal_time_s']:.0f} s (equal time)", "best_at_equal_time")):
                        cells = [r[s][key] for s in ("fifo", "asha")]
                        shown = [(_fmt(c) if key.endswith("_s") else (f"{c:.4f}" if isinstance(c, float) else _fmt(c)))
                                 for c in cells]
                        print(f"{label:28}{shown[0]:>12}{shown[1]:>12}")
                    fifo_t, asha_t = r["fifo"]["to_target_s"], r["asha"]["to_target_s"]
                    if fifo_t and asha_t:
                        print(f"ASHA reached the target {fifo_t / asha_t:.2f}x as fast as FIFO "
                              f"({asha_t:.1f} s vs {fifo_t:.1f} s; goal: at least 2x)")
                    else:
                        print("target not reached by " + " and ".join(s for s in ("fifo", "asha") if not r[s]["to_target_s"]))
                    print(f"load average after: {r['asha']['load'][0]:.1f}")
            if args.part in ("overhead", "both"):
                o = overhead(ws, trials=args.overhead_trials, epochs=args.overhead_epochs, seed=0)
                results["overhead"] = o
                print(f"\nSweep overhead: {o['trials']} learning rates x {args.overhead_epochs} epochs, one at a time")
                print(f"  one sweep (tune stage):         {o['sweep_tune_stage_s']:.1f} s  (whole run {o['sweep_s']:.1f} s)")
                print(f"  {o['trials']} plain runs (train stages): {o['plain_train_stages_s']:.1f} s  (whole runs {o['plain_s']:.1f} s)")
                print(f"  ratio sweep / plain: {o['sweep_tune_stage_s'] / o['plain_train_stages_s']:.2f} (train stages), "
                      f"{o['sweep_s'] / o['plain_s']:.2f} (whole runs: data, train, register)")
                print(f"  load average after: {o['load'][0]:.1f}")
        finally:
            conn.shutdown()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
