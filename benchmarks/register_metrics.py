"""The register stage's test metrics, side by side: Ray Data tasks per block against this process.

    python benchmarks/register_metrics.py             # ~1.5 min on 2 cores
    python benchmarks/register_metrics.py --repeats 5 --rows 20000

rayline/evaluation/offline.py predicts a registered version's test split with the serving Predictor
and merges per-block MetricPartials, either in Ray Data tasks where the blocks are (one task per
block; a worker loads the framework and the model once) or, for a small materialized split, in the
driver block by block. This trains the digits pipeline once (1 trial, 1 epoch, not served) on an
embedded Ray with a temporary workspace under benchmarks/, then times `evaluate_rows` on its test
split both ways, alternating, `--repeats` times each. The first tasks call is reported apart: it is
what a `rayline run` pays (a fresh worker imports torch and loads the model). Both paths must give
the same metrics first. `--rows N` also times a split of N rows (the test split's rows repeated).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "platform"))


def _timed(fn) -> tuple[float, object]:
    started = time.perf_counter()
    value = fn()
    return time.perf_counter() - started, value


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rows", type=int, default=0, help="also time a split of this many rows")
    args = parser.parse_args(argv)

    import ray

    from rayline.cluster import connect
    from rayline.data import prepare_data
    from rayline.evaluation.offline import evaluate_rows
    from rayline.pipeline.run import run_pipeline
    from rayline.registry import Registry
    from rayline.spec import apply_overrides, load_spec
    from rayline.workspace import workspace

    root = Path(tempfile.mkdtemp(prefix=".workspace-", dir=ROOT / "benchmarks"))
    conn = None
    try:
        ws = workspace(root).ensure()
        conn = connect(ws, num_cpus=2)
        spec = apply_overrides(load_spec(ROOT / "pipelines" / "digits-torch.yaml"), {"train.epochs": 1})
        spec = spec.model_copy(update={"tune": None, "serve": None})
        summary = run_pipeline(spec, ws, deploy=False, data_cache=False)
        artifact = Registry(ws).download(Registry(ws).resolve(summary.name, summary.version))
        splits = {"test split": prepare_data(spec).test_rows}
        if args.rows:
            frame = splits["test split"].to_pandas()
            copies = -(-args.rows // len(frame))
            splits[f"{args.rows:,} rows"] = ray.data.from_pandas(
                [frame] * copies).limit(args.rows).materialize()
        print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; digits v{summary.version}")
        print(f"{'split':<16}{'rows':>8}{'tasks, first':>14}{'tasks, median':>15}{'here, median':>14}{'ratio':>8}")
        for label, rows in splits.items():
            first, by_tasks = _timed(lambda: evaluate_rows(artifact, rows, in_process=False))
            here = evaluate_rows(artifact, rows, in_process=True)
            assert here.keys() == by_tasks.keys() and all(abs(here[k] - by_tasks[k]) < 1e-9 for k in here), (here, by_tasks)
            tasks_s, here_s = [], []
            for _ in range(args.repeats):  # alternating: a load change hits both
                tasks_s.append(_timed(lambda: evaluate_rows(artifact, rows, in_process=False))[0])
                here_s.append(_timed(lambda: evaluate_rows(artifact, rows, in_process=True))[0])
            t, h = statistics.median(tasks_s), statistics.median(here_s)
            print(f"{label:<16}{rows.count():>8,}{first:>13.2f}s{t:>14.2f}s{h:>13.2f}s{first / h:>7.1f}x")
        print("ratio: the first tasks call (what a run pays) over this process's median")
    finally:
        if conn is not None:
            conn.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
