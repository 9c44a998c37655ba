"""Batch scoring, side by side: `rayline predict NAME --input --output` vs the same by hand.

    python benchmarks/batch_scoring.py                      # 1M rows; trains a small digits model first (~1-2 min)
    python benchmarks/batch_scoring.py --workspace W --rows 1000000,10000000 --json-out batch.json

What one run does, for each row count:
1. Data: a digits-like Parquet file (the 64 `pixel_i_j` float columns of sklearn's digits, rows
   drawn from its 1,797 images plus noise, and an int64 `id`), written in chunks of 50,000 rows
   with pyarrow, so the generator itself holds one chunk at a time.
2. The baselines a user would write by hand, in one process each:
   (a) pandas: `pd.read_parquet` the file, `rayline.load_model(NAME).predict(frame)`, write `id` +
       `prediction` to Parquet (at 10M rows, 4.6 GB of Parquet, it is killed for memory on a
       24 GB machine: reported as such);
   (b) streaming: pyarrow `iter_batches` of 65,536 rows, `predict` each, a `ParquetWriter`.
3. rayline: (c) `rayline predict NAME --input FILE --output OUT.parquet --keep id` as a subprocess
   (`--engine auto`: no cluster configured, so it scores in its own process) and (d) the same
   with `--engine ray` (its own embedded Ray and Ray Data's actors: the start-up is in its time).
Every one runs as a subprocess; every 0.2 s the RSS and PSS of each one's whole process tree (the
command, and for (d) the Ray processes it starts: GCS, raylet, dashboard, workers) are summed.
RSS counts a shared page (Ray's object store in /dev/shm, shared libraries) once per process
that maps it, so the tree's RSS overstates (d); PSS divides each shared page among its users
and is the fair figure. Every output must hold the same predictions in the same order as (b)'s,
or the run fails (exit 1). Ratios are against (a), or (b) where (a) did not finish.

The model: with `--workspace W` the newest version of `--model` in W; otherwise
`rayline run pipelines/digits-torch.yaml --no-serve` (1 trial, 3 epochs, 1 worker) trains one
into a temporary workspace under benchmarks/ that is removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parents[1]
CHUNK_ROWS = 50_000


def generate(path: Path, rows: int, seed: int = 0) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from sklearn.datasets import load_digits

    digits = load_digits()
    names = list(digits.feature_names)
    rng = np.random.default_rng(seed)
    schema = pa.schema([("id", pa.int64())] + [(n, pa.float64()) for n in names])
    with pq.ParquetWriter(path, schema) as writer:
        for start in range(0, rows, CHUNK_ROWS):
            n = min(CHUNK_ROWS, rows - start)
            picks = digits.data[rng.integers(0, len(digits.data), n)]
            values = np.clip(picks + rng.normal(0.0, 0.5, picks.shape), 0.0, 16.0)
            columns = [pa.array(np.arange(start, start + n, dtype=np.int64))] + [pa.array(values[:, i]) for i in range(64)]
            writer.write_table(pa.Table.from_arrays(columns, schema=schema), row_group_size=CHUNK_ROWS)


class TreeSampler:
    """Peak summed RSS and PSS of a process and all its descendants, and the process's own peak
    RSS (a driver's: what decides whether it runs out of memory), sampled every `period` s."""

    def __init__(self, pid: int, period: float = 0.2):
        self.root = psutil.Process(pid)
        self.period = period
        self.peak_rss = 0
        self.peak_root_rss = 0
        self.peak_pss = 0
        self.peak_procs = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                procs = [self.root] + self.root.children(recursive=True)
            except psutil.Error:
                procs = []
            rss = pss = 0
            for proc in procs:
                try:
                    info = proc.memory_full_info()
                except psutil.Error:
                    continue
                rss += info.rss
                pss += getattr(info, "pss", info.rss)
                if proc.pid == self.root.pid:
                    self.peak_root_rss = max(self.peak_root_rss, info.rss)
            self.peak_rss = max(self.peak_rss, rss)
            self.peak_pss = max(self.peak_pss, pss)
            self.peak_procs = max(self.peak_procs, len(procs))
            self._stop.wait(self.period)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def measured(cmd: list[str], env: dict, may_run_out_of_memory: bool = False) -> dict:
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sampler = TreeSampler(proc.pid)
    output, _ = proc.communicate()
    seconds = time.monotonic() - started
    sampler.stop()
    result = {"seconds": seconds, "peak_rss": sampler.peak_rss, "peak_pss": sampler.peak_pss,
              "peak_processes": sampler.peak_procs, "output": output.strip().splitlines()[-1:]}
    if proc.returncode == -9 and may_run_out_of_memory:  # the kernel's OOM killer
        return {**result, "killed": "out of memory (SIGKILL)"}
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{output}")
    return result


BASELINE = """
import sys, pandas as pd, rayline
data, out, name, ws = sys.argv[1:5]
frame = pd.read_parquet(data)
model = rayline.load_model(name, workspace=ws)
predictions = model.predict(frame.drop(columns=["id"]))["predictions"]
pd.DataFrame({"id": frame["id"], "prediction": predictions}).to_parquet(out, index=False)
print(f"baseline wrote {len(frame)} rows")
"""


STREAMING = """
import sys, pyarrow as pa, pyarrow.parquet as pq, rayline
data, out, name, ws = sys.argv[1:5]
model = rayline.load_model(name, workspace=ws)
writer, rows = None, 0
for batch in pq.ParquetFile(data).iter_batches(batch_size=65536):
    frame = batch.to_pandas()
    predictions = model.predict(frame.drop(columns=["id"]))["predictions"]
    table = pa.table({"id": frame["id"], "prediction": predictions})
    writer = writer or pq.ParquetWriter(out, table.schema)
    writer.write_table(table)
    rows += len(frame)
writer.close()
print(f"streaming wrote {rows} rows")
"""


def differences(a: Path, b: Path) -> str | None:
    """None when both files hold the same ids and predictions in the same order, else what differs."""
    import pyarrow.parquet as pq

    ta, tb = pq.read_table(a, columns=["id", "prediction"]), pq.read_table(b, columns=["id", "prediction"])
    if ta.num_rows != tb.num_rows:
        return f"{ta.num_rows} rows vs {tb.num_rows}"
    ia, ib = ta.column("id").to_numpy(), tb.column("id").to_numpy()
    if not np.array_equal(ia, ib):
        return f"ids differ at {int(np.flatnonzero(ia != ib)[0])} of {len(ia)} (order not kept)"
    pa_, pb = ta.column("prediction").to_numpy(), tb.column("prediction").to_numpy()
    bad = np.flatnonzero(pa_ != pb)
    return f"{len(bad)} predictions differ, first at row {bad[0]}" if len(bad) else None


def train(ws: Path, env: dict) -> None:
    cmd = [sys.executable, "-m", "rayline.cli", "run", "pipelines/digits-torch.yaml", "--no-serve", "-w", str(ws),
           "--set", "tune.num_samples=1", "--set", "train.epochs=3", "--set", "train.workers=1"]
    print("training:", " ".join(cmd[2:]), flush=True)
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)


def mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="1000000", help="comma-separated row counts (default 1000000)")
    parser.add_argument("--workspace", help="a workspace holding --model (default: train one into a temporary one)")
    parser.add_argument("--model", default="digits")
    parser.add_argument("--json-out")
    args = parser.parse_args()
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("RAY_ADDRESS", None)
    tmp = Path(tempfile.mkdtemp(prefix=".batch-bench-", dir=ROOT / "benchmarks"))
    report = {"machine": {"cores": os.cpu_count(), "cpu": platform.processor() or platform.machine(),
                          "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
                          "load_average_start": os.getloadavg()}, "runs": []}
    try:
        ws = Path(args.workspace) if args.workspace else tmp / "workspace"
        if not args.workspace:
            train(ws, env)
        for rows in (int(r) for r in args.rows.split(",")):
            data = tmp / f"digits-{rows}.parquet"
            t0 = time.monotonic()
            generate(data, rows)
            print(f"\n{rows:,} rows: generated {data.stat().st_size / 2**20:,.0f} MiB of Parquet in "
                  f"{time.monotonic() - t0:.1f} s", flush=True)
            outs = {k: tmp / f"{k}.parquet" for k in ("pandas", "streaming", "auto", "ray")}
            load_before = os.getloadavg()[0]
            results = {
                "pandas": measured([sys.executable, "-c", BASELINE, str(data), str(outs["pandas"]), args.model, str(ws)],
                                   env, may_run_out_of_memory=True),
                "streaming": measured([sys.executable, "-c", STREAMING, str(data), str(outs["streaming"]), args.model,
                                       str(ws)], env),
            }
            for engine in ("auto", "ray"):
                results[engine] = measured([sys.executable, "-m", "rayline.cli", "predict", args.model, "--input",
                                            str(data), "--output", str(outs[engine]), "--keep", "id", "-w", str(ws),
                                            "--engine", engine], env)
            for key in ("pandas", "auto", "ray"):
                if "killed" in results[key]:
                    continue
                diff = differences(outs["streaming"], outs[key])
                if diff:
                    raise SystemExit(f"the outputs of {key} and streaming differ ({diff}): nothing measured")
            run = {"rows": rows, **results, "load_average_before": load_before, "load_average_after": os.getloadavg()[0]}
            report["runs"].append(run)
            base_key = "streaming" if "killed" in results["pandas"] else "pandas"
            labels = {"pandas": "(a) pandas", "streaming": "(b) streaming", "auto": "(c) rayline", "ray": "(d) --engine ray"}
            print(f"{'':<24}" + "".join(f"{labels[k]:>17}" for k in labels)
                  + f"{'(c)/' + labels[base_key][:3]:>10}{'(d)/' + labels[base_key][:3]:>10}")
            base = results[base_key]
            for label, key, fmt in (("seconds (wall)", "seconds", "{:.1f}"), ("rows/s", None, "{:,.0f}"),
                                    ("peak RSS, process tree", "peak_rss", None), ("peak PSS, process tree", "peak_pss", None)):
                shown = (lambda v: fmt.format(v)) if fmt else mib
                value = (lambda r: rows / r["seconds"]) if key is None else (lambda r: r[key])
                cells = "".join(f"{('killed (OOM)' if 'killed' in results[k] else shown(value(results[k]))):>17}"
                                for k in labels)
                ratios = "".join(f"{value(results[k]) / value(base):>9.2f}x" for k in ("auto", "ray"))
                print(f"{label:<24}{cells}{ratios}")
            print(f"processes in (d)'s tree at most: {results['ray']['peak_processes']}; load average {load_before:.1f} -> "
                  f"{run['load_average_after']:.1f}; outputs identical ({rows:,} rows, same order)"
                  + ("; (a) was killed for memory" if base_key == "streaming" else ""), flush=True)
            for f in (data, *outs.values()):
                f.unlink(missing_ok=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
