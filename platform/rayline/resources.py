"""Resource planning: decide what each trial asks Ray for, or fail fast naming what is missing.

Training data is materialized before training starts, so Ray Data needs no CPUs while
workers run (its split coordinator is a zero-CPU actor); Train V2's controller is a
zero-CPU actor too. What must fit is `concurrent trials x workers x CPUs per worker`
(and GPUs), within what the cluster has available now.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from rayline.errors import ResourceError

__all__ = ["ResourcePlan", "plan_resources"]

log = logging.getLogger(__name__)

_MIN_CPUS_PER_WORKER = 0.1  # below this a worker would be starved of CPU time


@dataclass(frozen=True)
class ResourcePlan:
    cpus_per_worker: float
    gpus_per_worker: int
    concurrent_trials: int
    threads_per_worker: int  # intra-op threads each worker uses (matches its CPU share)

    def worker_resources(self) -> dict:
        res = {"CPU": self.cpus_per_worker}
        if self.gpus_per_worker:
            res["GPU"] = self.gpus_per_worker
        return res


def plan_resources(train, available: dict, wanted_concurrency: int = 1, *, max_workers: int | None = None) -> ResourcePlan:
    """Plan for `train` (a TrainSpec) given Ray's available resources.

    `max_workers`: the most workers any trial of a sweep can draw (`tune.space` sets
    train.workers). The plan is sized for it, so that every draw fits: a smaller draw asks
    for fewer workers of the same size. Without this, `train.workers: {choice: [2, 64]}` on
    2 CPUs planned for 2 workers and the 64-worker trial waited forever to be placed.
    """
    workers = train.workers
    field = "train.workers"
    if max_workers is not None and max_workers > workers:
        workers = int(max_workers)
        field = "tune.space.train.workers"  # the largest draw decides; name where it comes from
    cpus = float(available.get("CPU", 0.0))
    gpus = float(available.get("GPU", 0.0))
    if train.use_gpu and gpus < workers:
        raise ResourceError(
            f"train.use_gpu: {workers} workers need {workers} GPUs; the cluster has {gpus:g} available "
            f"(allowed: lower {field}, set use_gpu: false, or add GPU nodes)"
        )
    if train.use_tpu and available.get("TPU", 0) < workers:
        raise ResourceError(
            f"train.use_tpu: {workers} workers need {workers} TPUs; the cluster has {available.get('TPU', 0):g} available"
        )
    concurrency = max(1, wanted_concurrency)
    if train.use_gpu:
        concurrency = max(1, min(concurrency, int(gpus // workers)))
    if train.cpus_per_worker is not None:
        per_worker = train.cpus_per_worker
        need = workers * per_worker
        if need > cpus + 1e-9:
            raise ResourceError(
                f"train.cpus_per_worker: {workers} workers x {per_worker:g} CPUs need {need:g} CPUs; "
                f"the cluster has {cpus:g} available (allowed: lower {field} or train.cpus_per_worker)"
            )
        concurrency = max(1, min(concurrency, int(math.floor(cpus / need + 1e-9))))
    else:
        # Share what is available; never more than one CPU per worker, never starve one.
        per_worker = min(1.0, cpus / (workers * concurrency)) if cpus else 0.0
        while per_worker < _MIN_CPUS_PER_WORKER and concurrency > 1:
            concurrency -= 1
            per_worker = min(1.0, cpus / (workers * concurrency))
        if per_worker < _MIN_CPUS_PER_WORKER:
            raise ResourceError(
                f"{field}: {workers} workers need at least {workers * _MIN_CPUS_PER_WORKER:g} CPUs; "
                f"the cluster has {cpus:g} available (allowed: fewer workers, or free CPUs, e.g. by deleting Serve apps)"
            )
        per_worker = math.floor(per_worker * 100) / 100
    if concurrency < wanted_concurrency:
        log.warning("tune.max_concurrent: running %d trials at once instead of %d (cluster has %g CPUs, %g GPUs)",
                    concurrency, wanted_concurrency, cpus, gpus)
    return ResourcePlan(
        cpus_per_worker=per_worker,
        gpus_per_worker=1 if train.use_gpu else 0,
        concurrent_trials=concurrency,
        threads_per_worker=max(1, int(per_worker)),
    )
