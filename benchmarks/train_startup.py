"""What one Ray Train run costs before any work: a trivial 1-worker run (one report), Ray's default
trainer against the same trainer as rayline builds it when every split goes as arrays (no
DatasetsCallback, rayline.train.splits.without_dataset_manager), alternated in one embedded Ray.

    python benchmarks/train_startup.py            # 8 runs, ~2 min on 2 cores
    python benchmarks/train_startup.py --torch    # 2-worker torch runs: Ray's TorchConfig against
                                                  # rayline's TorchClusterConfig (rayline/train/torch_cluster.py)

`--torch`: each run's two workers join one gloo process group and all-reduce a tensor; Ray's
TorchConfig makes Train's controller import torch, rayline's does not. Also prints the controller
processes' own CPU-seconds, read from /proc while they run.

Prints each side's median wall seconds and the machine's busy CPU-seconds per run (from
/proc/stat through psutil: it counts the run's short-lived actor processes too), and the ratios.
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "platform"))


def main(runs: int = 8, torch_sides: bool = False) -> None:
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

    def torch_loop(config):
        import torch
        import torch.distributed as dist

        total = torch.ones(1)
        dist.all_reduce(total)
        assert float(total) == dist.get_world_size() == 2, float(total)  # both workers in one process group
        ray.train.report({"x": float(total)})

    controller_cpu: dict[str, list[float]] = {"ray default": [], "rayline": []}
    controller_torch: dict[str, list[bool]] = {"ray default": [], "rayline": []}

    def controllers() -> list:
        return [p for p in psutil.process_iter(["cmdline"]) if "TrainController" in " ".join(p.info["cmdline"] or [])]

    def watch_controller(side: str, stop, earlier: set) -> None:
        """This run's TrainController: its CPU-seconds, last read before the run ended, and whether
        it loaded libtorch (an earlier run's controller may still be exiting: not counted)."""
        seen, torch_in = {}, {}
        while not stop.is_set():
            for proc in controllers():
                if proc.pid not in earlier:
                    try:
                        times = proc.cpu_times()
                        seen[proc.pid] = times.user + times.system
                        torch_in[proc.pid] = "libtorch" in open(f"/proc/{proc.pid}/maps").read()
                    except (psutil.Error, OSError):  # it exited between the listing and the read
                        pass
            stop.wait(0.2)
        controller_cpu[side].append(sum(seen.values()))
        controller_torch[side].append(any(torch_in.values()))

    def busy() -> float:
        c = psutil.cpu_times()
        return c.user + c.system + c.nice + c.irq + c.softirq

    figures: dict[str, list[tuple[float, float]]] = {"ray default": [], "rayline": []}
    for i in range(runs):
        side = "ray default" if i % 2 == 0 else "rayline"
        run_config = ray.train.RunConfig(storage_path=tempfile.mkdtemp(), name=f"r{i}")
        if torch_sides:
            from ray.train.torch import TorchConfig, TorchTrainer

            from rayline.train.torch_cluster import TorchClusterConfig

            config = TorchClusterConfig() if side == "rayline" else TorchConfig()
            trainer = TorchTrainer(torch_loop, torch_config=config, scaling_config=ray.train.ScalingConfig(num_workers=2),
                                   run_config=run_config)
        else:
            trainer = DataParallelTrainer(loop, scaling_config=ray.train.ScalingConfig(num_workers=1), run_config=run_config)
        trainer = without_dataset_manager(trainer) if side == "rayline" or torch_sides else trainer
        time.sleep(3)  # the previous run's processes gone
        stop = threading.Event()
        watcher = threading.Thread(target=watch_controller, args=(side, stop, {p.pid for p in controllers()}), daemon=True)
        watcher.start()
        cpu, started = busy(), time.monotonic()
        trainer.fit()
        figures[side].append((time.monotonic() - started, busy() - cpu))
        stop.set()
        watcher.join()
    ray.shutdown()
    base, ours = figures["ray default"], figures["rayline"]
    wall = (median(w for w, _ in base), median(w for w, _ in ours))
    cpu = (median(c for _, c in base), median(c for _, c in ours))
    print(f"{'':24}{'ray default':>12}{'rayline':>10}{'ratio':>8}")
    print(f"{'wall s per run':24}{wall[0]:12.1f}{wall[1]:10.1f}{wall[1] / wall[0]:8.2f}")
    print(f"{'busy CPU-s per run':24}{cpu[0]:12.1f}{cpu[1]:10.1f}{cpu[1] / cpu[0]:8.2f}")
    ctl = (median(controller_cpu["ray default"]), median(controller_cpu["rayline"]))
    print(f"{'controller CPU-s':24}{ctl[0]:12.1f}{ctl[1]:10.1f}{ctl[1] / max(ctl[0], 1e-9):8.2f}")
    print(f"{'controller loaded torch':24}{sum(controller_torch['ray default']):9d}/{runs // 2}"
          f"{sum(controller_torch['rayline']):7d}/{runs // 2}")
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--torch"]
    main(int(args[0]) if args else 8, torch_sides="--torch" in sys.argv[1:])
