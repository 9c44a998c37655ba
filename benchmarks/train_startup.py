"""What one Ray Train run costs before any work: a trivial 1-worker run (one report), Ray's default
trainer against the same trainer as rayline builds it when every split goes as arrays (no
DatasetsCallback, rayline.train.splits.without_dataset_manager), alternated in one embedded Ray.

    python benchmarks/train_startup.py            # 8 runs, ~2 min on 2 cores

Prints each side's median wall seconds and the machine's busy CPU-seconds per run (from
/proc/stat through psutil: it counts the run's short-lived actor processes too), and the ratios.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "platform"))


def main(runs: int = 8) -> None:
    import psutil
    import ray
    import ray.train
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    from rayline.cluster.env import train_env
    from rayline.train.splits import without_dataset_manager

    import os

    os.environ.update(train_env(single_machine=True))  # as rayline's embedded Ray has it
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)

    def loop(config):
        ray.train.report({"x": 1})

    def busy() -> float:
        c = psutil.cpu_times()
        return c.user + c.system + c.nice + c.irq + c.softirq

    figures: dict[str, list[tuple[float, float]]] = {"ray default": [], "rayline": []}
    for i in range(runs):
        side = "ray default" if i % 2 == 0 else "rayline"
        trainer = DataParallelTrainer(loop, scaling_config=ray.train.ScalingConfig(num_workers=1),
                                      run_config=ray.train.RunConfig(storage_path=tempfile.mkdtemp(), name=f"r{i}"))
        if side == "rayline":
            trainer = without_dataset_manager(trainer)
        time.sleep(3)  # the previous run's processes gone
        cpu, started = busy(), time.monotonic()
        trainer.fit()
        figures[side].append((time.monotonic() - started, busy() - cpu))
    ray.shutdown()
    base, ours = figures["ray default"], figures["rayline"]
    wall = (median(w for w, _ in base), median(w for w, _ in ours))
    cpu = (median(c for _, c in base), median(c for _, c in ours))
    print(f"{'':24}{'ray default':>12}{'rayline':>10}{'ratio':>8}")
    print(f"{'wall s per run':24}{wall[0]:12.1f}{wall[1]:10.1f}{wall[1] / wall[0]:8.2f}")
    print(f"{'busy CPU-s per run':24}{cpu[0]:12.1f}{cpu[1]:10.1f}{cpu[1] / cpu[0]:8.2f}")
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 8)
