"""What a run costs beyond its work, side by side with the same work written by hand (issue 37).

    python benchmarks/overhead.py                  # every section, ~6 min on 2 cores
    python benchmarks/overhead.py --only loop      # one section: loop | tf-loop | job | sweep | xgboost | quickstart
    python benchmarks/overhead.py --json-out overhead.json

Sections, each run here, in one process tree, and printed as a ratio:

- **loop**: the torch training loop's steady-state samples/s. By hand: a DDP script of
  `--workers` gloo ranks (torch.multiprocessing, one thread each, as rayline's plan gives one
  worker per core), each rank a plain loop over its half of the rows as in-memory tensors with
  a fresh permutation every epoch. rayline: `run_pipeline` of the same MLP (13 inputs -> 32 ->
  16 -> 2, Adam 1e-3), the same global batch, workers and epochs, on the same rows as a CSV;
  its per-epoch "samples_per_s" (the training loop alone, no validation or checkpoint), the
  median of the epochs after the first (the first pays for the shard's fetch and the model's
  warm-up, as the hand loop's first epoch pays for its own, which is left out alike).
- **tf-loop**: the same for TensorFlow on one worker: a hand-written Keras `fit` over the rows as
  in-memory arrays (tf_keras, as rayline trains; the same threads as rayline's plan gives its
  worker) against rayline's TensorFlow loop on the same MLP, batch and epochs.
- **job**: the same pipeline on `--small-rows` rows, the whole job: the hand script's process
  start to exit (torch import, gloo init, training, one checkpoint) against `rayline run
  --no-serve` in a fresh process (CLI import, embedded Ray start and stop, data, train,
  register), with rayline's own per-phase seconds; and the same run against a head `rayline
  cluster up` started beforehand (its start not counted). With `--workers 1` the run trains in rayline's
  own process (`train.in_process: auto`), and the same run in a Train worker group
  (`train.in_process: never`) is a second row.
- **xgboost**: the 1M-row churn CSV of benchmarks/data_stage.py (impute, one-hot, scale, xgboost
  10 rounds on 2 workers), the whole job: pandas + sklearn + xgboost in one process against
  `rayline run --no-serve` with its own embedded Ray, and against a head `rayline cluster up`
  started beforehand (its start not counted: it stays up between runs).
- **sweep**: a sweep's per-trial overhead. Sweeps of 2 and of 6 trials (one trial at a time, FIFO, a
  space over the learning rate) of the `--small-rows` pipeline in one warm embedded Ray, with 1 and
  with 2 workers a trial: what the 4 extra trials added to the train stage, less their own
  training-loop seconds (the sum of their epochs' `train_s`), per trial; and the fixed rest (Tune's
  start, the first trial's process and imports), which a sweep pays once. The per-trial part is
  everything a trial costs beyond its steps: its actor when not reused (and Train's controller and
  workers on 2), data hand-off, per-epoch validation and checkpoints, the report to Tune. No baseline run: issue 37's targets are 2 s
  (one worker) and 4 s (two).
- **quickstart**: the README's first command after the install, `rayline run
  pipelines/digits-torch.yaml` (4-trial ASHA sweep, 2 workers as one process, then served), in a
  fresh workspace, as a user runs it: from its start to the first 200 of the printed route's
  /predict and to the printed URL, then Ctrl-C (SIGINT) to the command's exit (Ray stopped);
  with its phases. No
  baseline: the issue's target is 45 s to a served model.

The load average is printed: on a shared machine it says how much to trust the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "platform"))
sys.path.insert(0, str(ROOT / "benchmarks"))

FEATURES = 13
HIDDEN = (32, 16)


def churn_like(path: Path, rows: int, seed: int = 0) -> Path:
    """A churn-like binary problem: 13 numeric inputs, label "yes"/"no", as a CSV (made here, no download)."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, FEATURES)).astype("float32")
    score = x[:, 0] - 0.7 * x[:, 1] + 0.5 * x[:, 2] * x[:, 3] + rng.normal(scale=0.5, size=rows)
    frame = pd.DataFrame(x, columns=[f"f{i}" for i in range(FEATURES)])
    frame["churn"] = np.where(score > 0.6, "yes", "no")
    frame.to_csv(path, index=False)
    return path


def spec_dict(data: Path, args, epochs: int, framework: str = "torch", workers: int | None = None,
              in_process: str = "auto") -> dict:
    return {
        "name": "bench-overhead",
        "data": {"source": {"format": "csv", "path": str(data)}, "label": "churn",
                 "split": {"valid": 0.1, "test": 0.1, "seed": 0},
                 "preprocess": [{"standard_scale": {"columns": "numeric"}}]},
        "task": "classification",
        "model": {"framework": framework, "kind": "mlp", "params": {"hidden_sizes": list(HIDDEN)}},
        "train": {"workers": workers or args.workers, "epochs": epochs, "batch_size": args.batch,
                  "in_memory": args.in_memory, "in_process": in_process, **({"use_gpu": True} if getattr(args, "gpu", False) else {}),
                  "optimizer": {"name": "adam", "lr": 0.001}, "metric": "accuracy"},
    }


# ---- by hand ---------------------------------------------------------------------------------

def _hand_rank(rank: int, world: int, data: str, args: dict, out: str) -> None:
    """One rank of the hand-written DDP script: its half of the rows in memory, a plain loop."""
    import numpy as np
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    torch.manual_seed(0)
    gpu = args.get("gpu", False)
    device = torch.device(f"cuda:{rank}") if gpu else torch.device("cpu")
    dist.init_process_group("nccl" if gpu else "gloo", rank=rank, world_size=world)
    arrays = np.load(data)
    # On a GPU the rows live on the device, as a hand-written loop over in-memory tensors would keep them.
    x = torch.from_numpy(arrays["x"][rank::world].copy()).to(device)
    y = torch.from_numpy(arrays["y"][rank::world].copy()).to(device)
    layers, width = [], FEATURES
    for hidden in HIDDEN:
        layers += [torch.nn.Linear(width, hidden), torch.nn.ReLU()]
        width = hidden
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(*layers, torch.nn.Linear(width, 2)).to(device),
                                                      device_ids=[rank] if gpu else None)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.001)
    loss_fn = torch.nn.CrossEntropyLoss()
    per_rank = args["batch"] // world
    times, ends = [], []
    for epoch in range(args["epochs"]):
        started = time.perf_counter()
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(epoch)).to(device)
        for i in range(0, len(x), per_rank):
            idx = order[i:i + per_rank]
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(x[idx]), y[idx]).backward()
            optimizer.step()
        if gpu:
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - started)
        ends.append(time.time())
    if rank == 0:
        state = {k: v for k, v in model.module.state_dict().items()}
        torch.save(state, os.path.join(os.path.dirname(out), "hand-weights.pt"))
        Path(out).write_text(json.dumps({"epoch_s": times, "epoch_end_at": ends, "rows": len(x) * world}))
    dist.destroy_process_group()


def _hand_main(data: str, workers: int, batch: int, epochs: int, out: str, gpu: bool = False) -> None:
    import torch.multiprocessing as mp

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    mp.start_processes(_hand_rank, args=(workers, data, {"batch": batch, "epochs": epochs, "gpu": gpu}, out),
                       nprocs=workers, start_method="spawn")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def hand_arrays(csv: Path, out: Path) -> Path:
    """The CSV's rows as the hand script holds them: standardized float32 features, int64 labels
    (the train split's share is left to chance alike: every row is used; only speed is compared)."""
    import numpy as np
    import pandas as pd

    frame = pd.read_csv(csv)
    x = frame[[f"f{i}" for i in range(FEATURES)]].to_numpy("float32")
    x = (x - x.mean(0)) / x.std(0)
    np.savez(out, x=x, y=(frame["churn"] == "yes").to_numpy("int64"))
    return out


def hand_job(arrays: Path, args, epochs: int, tmp: Path) -> dict:
    """The hand script as a fresh process: wall seconds from start to exit and its epoch times."""
    out = tmp / f"hand-{time.monotonic_ns()}.json"
    started = time.monotonic()
    subprocess.run([sys.executable, __file__, "--hand", str(arrays), str(args.workers), str(args.batch), str(epochs), str(out),
                    *(["gpu"] if getattr(args, "gpu", False) else [])], check=True)
    wall = time.monotonic() - started
    result = json.loads(out.read_text())
    return {"wall_s": wall, "epoch_s": result["epoch_s"], "epoch_end_at": result["epoch_end_at"], "rows": result["rows"]}


def _keras_main(data: str, threads: int, batch: int, epochs: int, out: str) -> None:
    """The hand-written Keras `fit`: one process, the rows as in-memory arrays, shuffled every epoch."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(max(2, threads))
    import tf_keras as keras

    keras.utils.set_random_seed(0)
    arrays = np.load(data)
    model = keras.Sequential([keras.layers.Dense(h, activation="relu") for h in HIDDEN] + [keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.Adam(0.001),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    times = []

    class Timer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.started = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            times.append(time.perf_counter() - self.started)

    model.fit(arrays["x"], arrays["y"], batch_size=batch, epochs=epochs, shuffle=True, verbose=0, callbacks=[Timer()])
    Path(out).write_text(json.dumps({"epoch_s": times, "rows": int(len(arrays["y"]))}))


# ---- rayline -----------------------------------------------------------------------------------

def rayline_loop(csv: Path, args, ws, framework: str = "torch", workers: int | None = None) -> dict:
    """rayline's run of the same work (no serving) in this process; per-epoch samples/s."""
    from rayline.pipeline.run import run_pipeline
    from rayline.spec import parse_spec

    summary = run_pipeline(parse_spec(spec_dict(csv, args, args.epochs, framework, workers)), ws, deploy=False)
    (trial,) = summary.trials  # no sweep: the one training run
    history = trial.result.history
    return {"samples_per_s": [row["samples_per_s"] for row in history], "seconds": summary.seconds,
            "valid_accuracy": summary.valid_metrics["accuracy"], "trained_on": summary.trained_on,
            "report_at": [r["at"] for r in trial.result.timeline.get("reports", [])]}


def rayline_job(csv: Path, args, epochs: int, tmp: Path, in_process: str = "auto", ws: Path | None = None) -> dict:
    """`rayline run --no-serve` as a fresh process: wall seconds and the run's own phases. `ws`: a
    workspace with a running head (`rayline cluster up`), which the run then joins."""
    spec = tmp / f"job-{time.monotonic_ns()}.yaml"
    import yaml

    spec.write_text(yaml.safe_dump(spec_dict(csv, args, epochs, in_process=in_process)))
    ws = ws or tmp / f"ws-job-{time.monotonic_ns()}"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "platform") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "rayline.cli", "run", str(spec), "--no-serve", "--workspace", str(ws)],
                          capture_output=True, text=True, env=env, cwd=tmp)
    wall = time.monotonic() - started
    if done.returncode:
        raise SystemExit(f"rayline run failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    from rayline.pipeline.record import RECORD_FILE

    records = sorted((ws / "runs").glob(f"*/{RECORD_FILE}"), key=lambda p: p.stat().st_mtime)
    return {"wall_s": wall, "seconds": json.loads(records[-1].read_text()).get("phases", {})}


@contextlib.contextmanager
def running_head(ws: Path, env: dict):
    """A `rayline cluster up` head in workspace `ws` for the block (its start not counted: a head
    stays up between runs), then `cluster down`. Runs with `-w ws` join it."""
    port = _free_port()
    subprocess.run([sys.executable, "-m", "rayline.cli", "cluster", "up", "-w", str(ws), "--port", str(port),
                    "--dashboard-port", str(_free_port()), "--client-port", str(_free_port())],
                   env=env, check=True, capture_output=True, text=True)
    try:
        yield ws
    finally:
        subprocess.run([sys.executable, "-m", "rayline.cli", "cluster", "down", "-w", str(ws)], env=env,
                       capture_output=True, text=True)


# ---- the run --------------------------------------------------------------------------------

def loop_section(tmp: Path, args) -> dict:
    from rayline.cluster.connection import connect
    from rayline.workspace import workspace

    csv = churn_like(tmp / "churn-100k.csv", args.rows)
    arrays = hand_arrays(csv, tmp / "churn-100k.npz")
    busy = {}
    with (_gpu_busy() if args.gpu else contextlib.nullcontext()) as gpu:
        hand = hand_job(arrays, args, args.epochs, tmp)
        ws = workspace(str(tmp / "ws-loop")).ensure()
        conn = connect(ws, None)
        try:
            ours = rayline_loop(csv, args, ws)
        finally:
            conn.shutdown()
    if gpu is not None:  # the GPU's busy share from the first epoch's end to the last's (the steady epochs)
        busy = {"hand_gpu_busy": gpu.share(hand["epoch_end_at"][0], hand["epoch_end_at"][-1]),
                "rayline_gpu_busy": gpu.share(ours["report_at"][0], ours["report_at"][-1]), "gpu": gpu.name}
    hand_rate = median(hand["rows"] / s for s in hand["epoch_s"][1:])
    # rayline trains on its train split only (80% of the rows): samples/s is rate, not rows, so it compares.
    ours_rate = median(ours["samples_per_s"][1:])
    return {"hand_samples_per_s": hand_rate, "rayline_samples_per_s": ours_rate, "ratio": ours_rate / hand_rate,
            "rayline_epochs": ours["samples_per_s"], "hand_epoch_s": hand["epoch_s"],
            "rayline_valid_accuracy": ours["valid_accuracy"], "trained_on": ours["trained_on"], **busy}


def _share(value) -> str:
    return "-" if value is None else f"{value:.0%}"


def _gpu_busy():
    from gpu_meter import GpuBusy

    return GpuBusy()


def tf_loop_section(tmp: Path, args) -> dict:
    from rayline.cluster.connection import connect
    from rayline.pipeline.training import plan_training
    from rayline.spec import parse_spec
    from rayline.workspace import workspace

    csv = tmp / "churn-100k.csv"
    if not csv.exists():
        churn_like(csv, args.rows)
    arrays = hand_arrays(csv, tmp / "churn-100k.npz")
    ws = workspace(str(tmp / "ws-tf-loop")).ensure()
    conn = connect(ws, None)
    try:
        threads = plan_training(parse_spec(spec_dict(csv, args, args.epochs, "tensorflow", 1))).threads_per_worker
        ours = rayline_loop(csv, args, ws, "tensorflow", 1)
    finally:
        conn.shutdown()
    out = tmp / "keras.json"
    subprocess.run([sys.executable, __file__, "--keras", str(arrays), str(threads), str(args.batch), str(args.epochs),
                    str(out)], check=True)
    hand = json.loads(out.read_text())
    hand_rate = median(hand["rows"] / s for s in hand["epoch_s"][1:])
    ours_rate = median(ours["samples_per_s"][1:])
    return {"hand_samples_per_s": hand_rate, "rayline_samples_per_s": ours_rate, "ratio": ours_rate / hand_rate,
            "rayline_epochs": ours["samples_per_s"], "hand_epoch_s": hand["epoch_s"], "threads": threads,
            "rayline_valid_accuracy": ours["valid_accuracy"]}


def job_section(tmp: Path, args) -> dict:
    csv = churn_like(tmp / "churn-small.csv", args.small_rows)
    arrays = hand_arrays(csv, tmp / "churn-small.npz")
    hand = [hand_job(arrays, args, args.small_epochs, tmp)["wall_s"] for _ in range(args.repeats)]
    ours = [rayline_job(csv, args, args.small_epochs, tmp) for _ in range(args.repeats)]
    phases = {k: median(o["seconds"].get(k, 0.0) for o in ours) for k in ours[0]["seconds"]}
    result = {"hand_s": median(hand), "rayline_s": median(o["wall_s"] for o in ours),
              "ratio": median(o["wall_s"] for o in ours) / median(hand), "rayline_phases_s": phases}
    # Against a head that stays up between runs (issue 37's target: at most 3x the torchrun job).
    env = {**os.environ, "PYTHONPATH": str(ROOT / "platform") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("RAY_ADDRESS", None)
    with running_head(tmp / "ws-job-head", env) as head_ws:
        headed = [rayline_job(csv, args, args.small_epochs, tmp, ws=head_ws) for _ in range(args.repeats)]
    result["head_s"] = median(o["wall_s"] for o in headed)
    result["head_phases_s"] = {k: median(o["seconds"].get(k, 0.0) for o in headed) for k in headed[0]["seconds"]}
    if args.workers == 1:
        # One worker trains in rayline's process (train.in_process: auto); the same run in a Train
        # worker group (never), interleaved in the same run, says what that saves.
        group = [rayline_job(csv, args, args.small_epochs, tmp, in_process="never") for _ in range(args.repeats)]
        result["worker_group_s"] = median(o["wall_s"] for o in group)
        result["worker_group_phases_s"] = {k: median(o["seconds"].get(k, 0.0) for o in group) for k in group[0]["seconds"]}
    return result


def sweep_section(tmp: Path, args, sizes: tuple[int, int] = (2, 6)) -> dict:
    """Two sweeps of each kind, of `sizes` trials: a sweep's cost is a fixed part (Tune's start, the
    first trial's process and imports) and a part per trial; their difference over the extra trials,
    less those trials' own loops, is what one more trial costs (the slope), and the rest the fixed
    part (the intercept). One sweep's seconds / its trials mixes the two (4 trials: the fixed ~10 s
    spread over 4 read as 2.5 s a trial)."""
    from rayline.cluster.connection import connect
    from rayline.pipeline.run import run_pipeline
    from rayline.spec import parse_spec
    from rayline.workspace import workspace

    csv = tmp / "churn-small.csv"
    if not csv.exists():
        churn_like(csv, args.small_rows)
    ws = workspace(str(tmp / "ws-sweep")).ensure()
    conn = connect(ws, None)
    out = {}
    try:
        for workers in (1, 2):
            runs = {}
            for trials in sizes:
                raw = spec_dict(csv, args, args.small_epochs, workers=workers)
                raw["name"] = f"bench-sweep-{workers}-{trials}"
                raw["tune"] = {"num_samples": trials, "max_concurrent": 1, "scheduler": "fifo", "search": "random",
                               "seed": 0, "space": {"train.optimizer.lr": {"loguniform": [1e-3, 1e-2]}}}
                summary = run_pipeline(parse_spec(raw), ws, deploy=False, data_cache=False)
                loops = [sum(row.get("train_s", 0.0) for row in t.result.history) for t in summary.trials if t.result]
                runs[trials] = {"train_stage_s": summary.seconds["train"], "trials": len(summary.trials), "loop_s": loops}
            small, large = (runs[n] for n in sizes)
            extra = large["trials"] - small["trials"]
            per_trial = (large["train_stage_s"] - small["train_stage_s"] - (sum(large["loop_s"]) - sum(small["loop_s"]))) / extra
            fixed = small["train_stage_s"] - sum(small["loop_s"]) - per_trial * small["trials"]
            out[workers] = {"sweeps": runs, "trials": large["trials"], "train_stage_s": large["train_stage_s"],
                            "loop_s": large["loop_s"], "per_trial_s": large["train_stage_s"] / large["trials"],
                            "overhead_per_trial_s": per_trial, "fixed_s": fixed}
    finally:
        conn.shutdown()
    return out


def xgboost_section(tmp: Path, args) -> dict:
    import yaml
    from data_stage import BY_HAND, CATEGORICAL, LABEL, NUMERIC, generate, measured, spec_for

    data = tmp / "churn-1m.csv"
    generate(data, args.xgboost_rows)
    spec = tmp / "churn-1m.yaml"
    raw = spec_for(data)
    raw["data"]["in_process"] = args.data_in_process
    spec.write_text(yaml.safe_dump(raw))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "platform") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("RAY_ADDRESS", None)
    hand = [measured([sys.executable, "-c", BY_HAND, str(data), ",".join(NUMERIC), ",".join(CATEGORICAL), LABEL], env)["seconds"]
            for _ in range(args.repeats)]

    def ours(extra: list[str], ws: Path) -> tuple[float, dict]:
        out = measured([sys.executable, "-m", "rayline.cli", "run", str(spec), "--no-serve", "--no-cache", "-w", str(ws),
                        *extra], env)
        from rayline.pipeline.record import RECORD_FILE

        records = sorted((ws / "runs").glob(f"*/{RECORD_FILE}"), key=lambda p: p.stat().st_mtime)
        return out["seconds"], json.loads(records[-1].read_text()).get("phases", {})

    embedded = [ours([], tmp / f"ws-xgb-{i}") for i in range(args.repeats)]
    with running_head(tmp / "ws-xgb-head", env) as head_ws:
        headed = [ours([], head_ws) for _ in range(args.repeats)]
    return {"hand_s": median(hand), "embedded_s": median(s for s, _ in embedded), "head_s": median(s for s, _ in headed),
            "embedded_phases": embedded[len(embedded) // 2][1], "head_phases": headed[len(headed) // 2][1]}


def quickstart_section(tmp: Path, args) -> dict:
    """The README's first command as a user runs it: `rayline run pipelines/digits-torch.yaml` in a
    fresh workspace, timed to the first 200 of the endpoint's /predict (what "to a served model"
    means to a user, and issue 37's target) and to the printed URL, then Ctrl-C (SIGINT), timed to
    the process's exit."""
    import signal

    import httpx

    env = {**os.environ, "PYTHONPATH": str(ROOT / "platform") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("RAY_ADDRESS", None)
    ws = tmp / "ws-quickstart"
    port = _free_port()
    url = f"http://127.0.0.1:{port}/digits/predict"
    row = {"instances": [{f"pixel_{i}_{j}": 1.0 for i in range(8) for j in range(8)}]}
    log = tmp / "quickstart.log"
    started = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "rayline.cli", "run", str(ROOT / "pipelines" / "digits-torch.yaml"),
                                 "-w", str(ws), "--port", str(port)], env=env, stdout=out, stderr=subprocess.STDOUT,
                                # a shell's background job ignores SIGINT; the user's terminal delivers it
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    # The route can answer a moment before the command has finished its deploy stage and printed the
    # URL (the deployment record, the summary): Ctrl-C only once it has, or the run ends "interrupted
    # while deploying" and keeps no phases. Both moments are reported.
    served = printed = None
    try:
        while served is None or printed is None:
            if proc.poll() is not None:
                raise SystemExit(f"the quick start exited {proc.returncode} before serving:\n{log.read_text()[-3000:]}")
            if served is None:
                try:
                    if httpx.post(url, json=row, timeout=5).status_code == 200:
                        served = time.monotonic() - started
                except httpx.HTTPError:
                    pass
            if printed is None and "Press Ctrl-C to stop" in log.read_text():
                printed = time.monotonic() - started
            time.sleep(0.1)
        interrupted = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
        stop_s = time.monotonic() - interrupted
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    from rayline.pipeline.record import RECORD_FILE

    record = json.loads(next((ws / "runs").glob(f"*/{RECORD_FILE}")).read_text())
    return {"served_s": served, "printed_s": printed, "ctrl_c_to_exit_s": stop_s, "exit_code": proc.returncode,
            "phases": record.get("phases", {})}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--hand":
        data, workers, batch, epochs, out = sys.argv[2:7]
        _hand_main(data, int(workers), int(batch), int(epochs), out, gpu=sys.argv[7:8] == ["gpu"])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--keras":
        data, threads, batch, epochs, out = sys.argv[2:7]
        _keras_main(data, int(threads), int(batch), int(epochs), out)
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=["loop", "tf-loop", "job", "sweep", "xgboost", "quickstart"], action="append")
    parser.add_argument("--xgboost-rows", type=int, default=1_000_000)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--small-rows", type=int, default=3_000)
    parser.add_argument("--small-epochs", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64, help="global batch (per worker: batch / workers)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--in-memory", default="auto", choices=["auto", "always", "never"],
                        help="rayline's train.in_memory (never: the streamed loop, for a before/after)")
    parser.add_argument("--gpu", action="store_true",
                        help="loop: both on the GPU (train.use_gpu; the hand loop's tensors on the device, nccl), "
                             "with each one's GPU busy share (NVML); use --workers 1 on one GPU")
    parser.add_argument("--data-in-process", default="auto", choices=["auto", "never"],
                        help="xgboost: rayline's data.in_process (never: the data stage in Ray Data's tasks, for a before/after)")
    parser.add_argument("--json-out")
    args = parser.parse_args()
    from harness import format_table, machine_info

    sections = args.only or ["loop", "tf-loop", "job", "sweep", "xgboost", "quickstart"]
    print(json.dumps(machine_info(("ray", "torch")), indent=None), flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="bench-overhead-", dir=ROOT / "benchmarks"))
    results: dict = {}
    rows = []
    try:
        if "loop" in sections:
            r = results["loop"] = loop_section(tmp, args)
            rows.append([f"training loop, {args.rows:,} rows, {args.workers} workers, batch {args.batch} (samples/s)",
                         f"{r['hand_samples_per_s']:,.0f}", f"{r['rayline_samples_per_s']:,.0f}", f"{r['ratio']:.2f}x"])
            print(f"loop: rayline per epoch {[round(v) for v in r['rayline_epochs']]}, "
                  f"valid accuracy {r['rayline_valid_accuracy']:.3f}, trained on {r['trained_on']}", flush=True)
            if args.gpu:
                rows.append([f"GPU busy share, steady epochs ({r['gpu']})", _share(r["hand_gpu_busy"]),
                             _share(r["rayline_gpu_busy"]), ""])
        if "tf-loop" in sections:
            r = results["tf-loop"] = tf_loop_section(tmp, args)
            rows.append([f"tensorflow loop, {args.rows:,} rows, 1 worker ({r['threads']} threads), batch {args.batch} "
                         "(samples/s)", f"{r['hand_samples_per_s']:,.0f}", f"{r['rayline_samples_per_s']:,.0f}",
                         f"{r['ratio']:.2f}x"])
            print(f"tf-loop: rayline per epoch {[round(v) for v in r['rayline_epochs']]}, "
                  f"valid accuracy {r['rayline_valid_accuracy']:.3f}", flush=True)
        if "job" in sections:
            r = results["job"] = job_section(tmp, args)
            rows.append([f"whole job, {args.small_rows:,} rows, {args.small_epochs} epochs (s)", f"{r['hand_s']:.1f}",
                         f"{r['rayline_s']:.1f}", f"{r['ratio']:.1f}x"])
            print("job: rayline phases (s) " + ", ".join(f"{k} {v:.1f}" for k, v in r["rayline_phases_s"].items()
                                                          if k != "trials"), flush=True)
            rows.append([f"whole job, {args.small_rows:,} rows, {args.small_epochs} epochs, running head (s)",
                         f"{r['hand_s']:.1f}", f"{r['head_s']:.1f}", f"{r['head_s'] / r['hand_s']:.1f}x (target 3x)"])
            print("job (running head): rayline phases (s) " + ", ".join(
                f"{k} {v:.1f}" for k, v in r["head_phases_s"].items() if k != "trials"), flush=True)
            if "worker_group_s" in r:
                rows.append(["whole job, 1 worker in a Train worker group (train.in_process: never) (s)",
                             f"{r['hand_s']:.1f}", f"{r['worker_group_s']:.1f}", f"{r['worker_group_s'] / r['hand_s']:.1f}x"])
                print("job (worker group): rayline phases (s) " + ", ".join(
                    f"{k} {v:.1f}" for k, v in r["worker_group_phases_s"].items() if k != "trials"), flush=True)
        if "sweep" in sections:
            r = results["sweep"] = sweep_section(tmp, args)
            for workers, target in ((1, 2.0), (2, 4.0)):
                w = r[workers]
                rows.append([f"sweep, trials one at a time, {workers} worker(s) each: overhead of one more trial (s)",
                             "-", f"{w['overhead_per_trial_s']:.1f}", f"{w['overhead_per_trial_s'] / target:.1f}x the {target:g}-s target"])
                rows.append([f"sweep, {workers} worker(s) a trial: fixed cost of a sweep (Tune, the first trial's process) (s)",
                             "-", f"{w['fixed_s']:.1f}", ""])
                for n, one in w["sweeps"].items():
                    print(f"sweep ({workers} workers, {n} trials): train stage {one['train_stage_s']:.1f} s, its training "
                          f"loops {[round(v, 2) for v in one['loop_s']]} s", flush=True)
        if "xgboost" in sections:
            r = results["xgboost"] = xgboost_section(tmp, args)
            rows.append([f"xgboost, {args.xgboost_rows:,}-row CSV, whole job, embedded Ray (s)", f"{r['hand_s']:.1f}",
                         f"{r['embedded_s']:.1f}", f"{r['embedded_s'] / r['hand_s']:.1f}x"])
            rows.append([f"xgboost, {args.xgboost_rows:,}-row CSV, whole job, running head (s)", f"{r['hand_s']:.1f}",
                         f"{r['head_s']:.1f}", f"{r['head_s'] / r['hand_s']:.1f}x"])
            for where in ("embedded", "head"):
                print(f"xgboost ({where}): phases (s) " + ", ".join(
                    f"{k} {v:.1f}" for k, v in r[f"{where}_phases"].items() if k != "trials"), flush=True)
        if "quickstart" in sections:
            r = results["quickstart"] = quickstart_section(tmp, args)
            rows.append(["README quick start to a served model: the first 200 of /predict (s)", "-", f"{r['served_s']:.1f}",
                         f"{r['served_s'] / 45:.2f}x the 45-s target"])
            rows.append(["README quick start: the URL printed, deploy stage done (s)", "-", f"{r['printed_s']:.1f}",
                         f"{r['printed_s'] / 45:.2f}x the 45-s target"])
            rows.append(["README quick start: Ctrl-C to the command's exit, Ray stopped (s)", "-",
                         f"{r['ctrl_c_to_exit_s']:.1f}", f"exit code {r['exit_code']}"])
            print("quickstart: phases (s) " + ", ".join(f"{k} {v:.1f}" for k, v in r["phases"].items() if k != "trials"),
                  flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print()
    print(format_table(["work", "by hand", "rayline", "rayline / hand (samples/s: higher is better)"], rows))
    print(f"load average: {os.getloadavg()[0]:.1f}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"results": results, "args": vars(args)}, indent=1))


if __name__ == "__main__":
    main()
