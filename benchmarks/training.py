"""Training techniques, side by side: each train.* option against plain fp32 DDP on the same
model and data, and rayline's train stage against a hand-written Ray Train script.

    python benchmarks/training.py                      # 3 repeats, ~15 min on 2 cores
    python benchmarks/training.py --rows 40000 --epochs 4 --json-out training.json

One embedded Ray (as `rayline run` starts it), one synthetic 4-class problem (sklearn's
make_classification, `--rows` x 40 features, Parquet written here), a torch MLP (256, 256) on
`--workers` DDP workers, `--epochs` epochs of global batch `--batch`. For each configuration
rayline's pipeline runs once (no serving) and the table gives: the train stage's wall time
(Ray Train start-up included), the mean training throughput over the epochs (samples/s, all
workers; rayline's own per-epoch measure, which excludes validation and checkpointing), the
final valid accuracy, and the ratios to fp32 DDP: medians of `--repeats` runs, taken
round-robin across the configurations (two single runs on the 2-core machine disagreed by up
to 2x in throughput).

The baseline: a hand-written Ray Train script (TorchTrainer, `prepare_model`, the same model,
optimizer, batch and epochs, the same Ray Data input, a validation pass and a checkpoint each
epoch), timed from `fit()` to its return, against rayline's train stage for the same spec. It
runs once first as a warm-up (not measured), then after rayline's runs.

On CPUs, fp16 precision and bf16 compression are GPU-only (refused by the spec); they are
listed as skipped. The load average is printed: on a shared machine it says how much to trust
the figures.
"""

from __future__ import annotations

import argparse
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
sys.path.insert(0, str(ROOT / "benchmarks"))

from tuning import synthetic  # noqa: E402 - the same synthetic 4-class Parquet data as the tuning benchmark

CONFIGS = [
    ("fp32 DDP (baseline)", {}),
    ("bf16", {"train.precision": "bf16"}),
    ("fp16 (GPU only)", {"train.precision": "fp16"}),
    ("grad_accumulation 4", {"train.grad_accumulation": 4}),
    ("fp16 compression", {"train.grad_compression": "fp16"}),
    ("powersgd rank 2", {"train.grad_compression": {"powersgd": {"rank": 2, "start_iter": 10}}}),
    ("fsdp", {"train.strategy": "fsdp"}),
]


def base_spec(data: Path, args) -> dict:
    return {
        "name": "bench-training",
        "data": {"source": {"format": "parquet", "path": str(data)}, "label": "target",
                 "split": {"valid": 0.1, "test": 0.1, "seed": 0}},
        "task": "classification",
        "model": {"framework": "torch", "kind": "mlp", "params": {"hidden_sizes": [256, 256]}},
        "train": {"workers": args.workers, "epochs": args.epochs, "batch_size": args.batch,
                  "optimizer": {"name": "adam", "lr": 0.001}, "metric": "accuracy"},
    }


def rayline_runs(data: Path, args, ws) -> list[dict]:
    """Each configuration `--repeats` times, interleaved (round-robin, so a slow spell of a shared
    machine hits every configuration alike); the medians."""
    from statistics import median

    from rayline.errors import SpecError
    from rayline.pipeline.run import run_pipeline
    from rayline.spec import apply_overrides, parse_spec

    specs, rows = {}, {}
    for label, overrides in CONFIGS:
        try:
            specs[label] = apply_overrides(parse_spec(base_spec(data, args)), overrides) if overrides else parse_spec(base_spec(data, args))
        except SpecError as exc:
            rows[label] = {"config": label, "skipped": str(exc).splitlines()[-1].strip()}
    runs: dict[str, list] = {label: [] for label in specs}
    for repeat in range(args.repeats):
        for label, spec in specs.items():
            summary = run_pipeline(spec, ws, deploy=False)
            runs[label].append(summary)
            print(f"  [{repeat + 1}/{args.repeats}] {label}: train stage {summary.seconds['train']:.1f} s, "
                  f"{summary.throughput[0]:,.0f} samples/s", flush=True)
    for label, summaries in runs.items():
        rows[label] = {"config": label, "train_s": median(s.seconds["train"] for s in summaries),
                       "samples_per_s": median(s.throughput[0] for s in summaries),
                       "samples_per_s_per_worker": median(s.throughput[1] for s in summaries),
                       "valid_accuracy": median(s.valid_metrics["accuracy"] for s in summaries),
                       "runs": [{"train_s": s.seconds["train"], "samples_per_s": s.throughput[0]} for s in summaries]}
    return [rows[label] for label, _ in CONFIGS]


def hand_written(data: Path, args) -> float:
    """A plain Ray Train script doing the same work; seconds from fit() to its return."""
    import numpy as np
    import ray
    import ray.train
    import ray.train.torch
    from ray.train.torch import TorchTrainer

    def loop(config):
        import tempfile as tf

        import torch

        torch.manual_seed(0)
        torch.set_num_threads(config["threads"])
        model = torch.nn.Sequential(torch.nn.Linear(40, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                    torch.nn.Linear(256, 4))
        model = ray.train.torch.prepare_model(model)
        opt = torch.optim.Adam(model.parameters(), lr=0.001)
        loss_fn = torch.nn.CrossEntropyLoss()
        shard = ray.train.get_dataset_shard("train")
        valid = ray.train.get_dataset_shard("valid")
        vx, vy = [], []
        for b in valid.iter_batches(batch_size=65536, batch_format="numpy"):
            vx.append(np.stack([b[f"f{i}"] for i in range(40)], axis=1).astype("float32"))
            vy.append(b["target"])
        vx, vy = torch.from_numpy(np.concatenate(vx)), np.concatenate(vy)
        per_worker = config["batch"] // ray.train.get_context().get_world_size()
        for epoch in range(config["epochs"]):
            model.train()
            for b in shard.iter_torch_batches(batch_size=per_worker, local_shuffle_buffer_size=per_worker * 4):
                x = torch.stack([b[f"f{i}"] for i in range(40)], dim=1).float()
                opt.zero_grad()
                loss_fn(model(x), b["target"].long()).backward()
                opt.step()
            model.eval()
            with torch.no_grad():
                accuracy = float((model(vx).argmax(1).numpy() == vy).mean())
            with tf.TemporaryDirectory() as d:
                if ray.train.get_context().get_world_rank() == 0:
                    torch.save(model.module.state_dict() if hasattr(model, "module") else model.state_dict(), f"{d}/w.pt")
                    ray.train.report({"accuracy": accuracy, "epoch": epoch}, checkpoint=ray.train.Checkpoint.from_directory(d))
                else:
                    ray.train.report({"accuracy": accuracy, "epoch": epoch})

    frame = ray.data.read_parquet(str(data)).random_shuffle(seed=0)
    train, valid = frame.train_test_split(test_size=0.2, seed=0)
    cpus = (ray.available_resources().get("CPU", 2) - 0.01) / args.workers
    trainer = TorchTrainer(loop, train_loop_config={"epochs": args.epochs, "batch": args.batch, "threads": max(1, int(cpus))},
                           scaling_config=ray.train.ScalingConfig(num_workers=args.workers, resources_per_worker={"CPU": cpus}),
                           run_config=ray.train.RunConfig(storage_path=tempfile.mkdtemp(prefix="bench-hand-")),
                           datasets={"train": train, "valid": valid})
    started = time.monotonic()
    trainer.fit()
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each configuration; medians are printed")
    parser.add_argument("--json-out")
    args = parser.parse_args()

    from rayline.cluster.connection import connect
    from rayline.workspace import workspace

    tmp = Path(tempfile.mkdtemp(prefix="bench-training-", dir=ROOT / "benchmarks"))
    try:
        data = synthetic(tmp / "data.parquet", args.rows)
        ws = workspace(str(tmp / "ws")).ensure()
        conn = connect(ws, None)
        try:
            _measure(data, args, ws)
        finally:
            conn.shutdown()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _measure(data: Path, args, ws) -> None:
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs; {args.rows} rows x 40, MLP (256, 256), "
          f"{args.workers} workers, {args.epochs} epochs, batch {args.batch}", flush=True)
    # Warm-up, not measured: the first Ray Train run on a fresh Ray pays for worker processes'
    # first imports and Ray Data's first plans; without it the first configuration measured
    # (fp32 DDP, the baseline) looked slower than it is.
    hand_written(data, args)
    rows = rayline_runs(data, args, ws)
    from statistics import median

    hand_s = median(hand_written(data, args) for _ in range(args.repeats))
    base = next(r for r in rows if r["config"].startswith("fp32"))
    print(f"\n{'configuration':24s} {'train stage s':>13s} {'samples/s':>10s} {'x fp32':>7s} {'valid acc':>9s}")
    for r in rows:
        if "skipped" in r:
            print(f"{r['config']:24s} skipped: {r['skipped']}")
            continue
        print(f"{r['config']:24s} {r['train_s']:13.1f} {r['samples_per_s']:10,.0f} "
              f"{r['samples_per_s'] / base['samples_per_s']:7.2f} {r['valid_accuracy']:9.3f}")
    print(f"\nhand-written Ray Train script (same work): {hand_s:.1f} s; rayline's train stage (fp32 DDP): "
          f"{base['train_s']:.1f} s; ratio rayline / hand-written: {base['train_s'] / hand_s:.2f}")
    print(f"load average: {os.getloadavg()[0]:.1f}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"rows": rows, "hand_written_s": hand_s, "args": vars(args),
                                                   "load": os.getloadavg()[0]}, indent=1))


if __name__ == "__main__":
    main()
