"""Resource planning: decide what each trial asks Ray for, or fail fast naming what is missing.

Training data is materialized before training starts, so Ray Data needs no CPUs while
workers run (its split coordinator is a zero-CPU actor); Train V2's controller is a
zero-CPU actor too. What must fit is `concurrent trials x workers x resources per worker`
(CPUs, GPUs, TPUs, memory, custom resources, and a node of `train.accelerator_type`),
within what the cluster has available now.

Elastic training (`train.workers: {min, max}`) is planned for the most workers in
[min, max] that fit now; only `min` must fit, and the plan says how many it starts with.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from rayline.errors import ResourceError

__all__ = ["ResourcePlan", "plan_resources", "ACCELERATOR_RESOURCE_PREFIX", "threads_for"]

log = logging.getLogger(__name__)

_MIN_CPUS_PER_WORKER = 0.1  # below this a worker would be starved of CPU time
# Ray labels each node with its accelerator as a resource `accelerator_type:<name>` (1 per
# node); Ray Train asks 0.001 of it per worker (ray/air/config.py, RESOURCE_CONSTRAINT_PREFIX).
ACCELERATOR_RESOURCE_PREFIX = "accelerator_type:"
_ACCELERATOR_PER_WORKER = 0.001
# Elastic training sizes its worker group with float arithmetic over node resources
# (ElasticScalingPolicy._count_possible_workers: reserved // per_worker, where reserved is a
# float sum of per-worker bundles): 3 x 0.33 = 0.99 and 0.99 // 0.33 == 2.0, so a plan of
# 0.33 CPU per worker started 2 of 3 workers. Multiples of 1/16 add up exactly in binary
# floating point and in Ray's 1e-4 resource units, so elastic plans use them.
_ELASTIC_CPU_GRID = 16


@dataclass(frozen=True)
class ResourcePlan:
    cpus_per_worker: float
    gpus_per_worker: float
    concurrent_trials: int
    threads_per_worker: int  # intra-op threads each worker uses (matches its CPU share)
    extra_per_worker: tuple[tuple[str, float], ...] = ()  # TPU, memory, custom resources (sorted)
    accelerator_type: str | None = None  # train.accelerator_type, for ScalingConfig
    min_workers: int = 0  # elastic: fewest workers; fixed: the planned count (min = max = start)
    max_workers: int = 0
    start_workers: int = 0  # workers that fit now: what training starts with

    @property
    def elastic(self) -> bool:
        return self.min_workers < self.max_workers

    def workers_text(self) -> str:
        """How many workers, as the progress line says it: '2 workers', or for elastic training
        '1-4 workers (starting with 2)'."""
        if self.elastic:
            return f"{self.min_workers}-{self.max_workers} workers (starting with {self.start_workers})"
        return f"{self.start_workers or self.min_workers} workers"

    def worker_resources(self) -> dict:
        """One worker's Ray resources, as ScalingConfig.resources_per_worker takes them."""
        res = {"CPU": self.cpus_per_worker}
        if self.gpus_per_worker:
            res["GPU"] = self.gpus_per_worker
        res.update(self.extra_per_worker)
        return res


def threads_for(cpus: float) -> int:
    """Intra-op threads for a worker of `cpus` CPUs: its whole CPUs, at least one (0.98 CPU: one thread)."""
    return max(1, int(cpus + 1e-9))


def plan_resources(train, available: dict, wanted_concurrency: int = 1, *, max_workers: int | None = None) -> ResourcePlan:
    """Plan for `train` (a TrainSpec) given Ray's available resources.

    `max_workers`: the most workers any trial of a sweep can draw (`tune.space` sets
    train.workers). The plan is sized for it, so that every draw fits: a smaller draw asks
    for fewer workers of the same size. Without this, `train.workers: {choice: [2, 64]}` on
    2 CPUs planned for 2 workers and the 64-worker trial waited forever to be placed.

    Elastic `train.workers: {min, max}`: sized for the most workers in [min, max] that fit
    now (each the same size, so Ray Train can grow to `max` as nodes join); fails, naming
    train.workers.min, when not even `min` fits.
    """
    elastic = bool(getattr(train, "elastic", False))
    low, high = _bounds(train)
    field = "train.workers"
    if not elastic and max_workers is not None and max_workers > high:
        low = high = int(max_workers)
        field = "tune.space.train.workers"  # the largest draw decides; name where it comes from
    _check_accelerator_type(train, available)
    for workers in range(high, low - 1, -1):
        try:
            plan = _plan_for(train, available, wanted_concurrency, workers,
                             field="train.workers.min" if elastic else field, elastic=elastic)
        except ResourceError:
            if workers == low:
                raise
            continue
        start = _start_workers(plan, available, high) if elastic else workers
        plan = ResourcePlan(**{**plan.__dict__, "min_workers": low, "max_workers": high, "start_workers": start})
        if plan.concurrent_trials < wanted_concurrency:
            log.warning("tune.max_concurrent: running %d trials at once instead of %d (cluster has %g CPUs, %g GPUs)",
                        plan.concurrent_trials, wanted_concurrency, float(available.get("CPU", 0.0)),
                        float(available.get("GPU", 0.0)))
        if elastic:
            log.info("train.workers: elastic %d-%d, starting with %d (%s each)", low, high, start,
                     ", ".join(f"{v:g} {k}" for k, v in plan.worker_resources().items()))
        return plan
    raise AssertionError("unreachable: the loop returns or raises at its last count")


def _bounds(train) -> tuple[int, int]:
    workers = train.workers
    if isinstance(workers, int):
        return workers, workers
    return int(workers.min), int(workers.max)


def _fixed_per_worker(train) -> tuple[dict[str, float], dict[str, str]]:
    """Per-worker amounts the spec fixes (all but planned CPUs), and the spec path naming each."""
    given = dict(getattr(train, "resources_per_worker", None) or {})
    amounts: dict[str, float] = {}
    where: dict[str, str] = {}
    for key, value in given.items():
        amounts[key] = float(value)
        where[key] = f"train.resources_per_worker.{key}"
    if train.use_gpu and "GPU" not in amounts:
        amounts["GPU"], where["GPU"] = 1.0, "train.use_gpu"
    if train.use_tpu and "TPU" not in amounts:
        amounts["TPU"], where["TPU"] = 1.0, "train.use_tpu"
    if train.cpus_per_worker is not None:
        amounts["CPU"], where["CPU"] = float(train.cpus_per_worker), "train.cpus_per_worker"
    return amounts, where


def _check_accelerator_type(train, available: dict) -> None:
    kind = getattr(train, "accelerator_type", None)
    if not kind:
        return
    key = ACCELERATOR_RESOURCE_PREFIX + kind
    if float(available.get(key, 0.0)) >= _ACCELERATOR_PER_WORKER:
        return
    present = sorted(k[len(ACCELERATOR_RESOURCE_PREFIX):] for k, v in available.items()
                     if k.startswith(ACCELERATOR_RESOURCE_PREFIX) and v > 0)
    raise ResourceError(
        f"train.accelerator_type: no node of the cluster with accelerator type {kind} has room (Ray resource "
        f"'{key}': {float(available.get(key, 0.0)):g} available; accelerator types available: {', '.join(present) or 'none'}) "
        f"(allowed: one of those, no accelerator_type, or add {kind} nodes)"
    )


def _plan_for(train, available: dict, wanted_concurrency: int, workers: int, *, field: str, elastic: bool) -> ResourcePlan:
    """The plan for exactly `workers` workers, or ResourceError naming what does not fit."""
    fixed, where = _fixed_per_worker(train)
    cpus = float(available.get("CPU", 0.0))
    concurrency = max(1, wanted_concurrency)
    for key, per in fixed.items():
        if key == "CPU" or per <= 0:
            continue
        have = float(available.get(key, 0.0))
        need = workers * per
        if need > have + 1e-9:
            raise ResourceError(_shortage(key, where[key], workers, per, have, field))
        concurrency = max(1, min(concurrency, int(math.floor(have / need + 1e-9))))
    if "CPU" in fixed:
        per_worker = fixed["CPU"]
        need = workers * per_worker
        if need > cpus + 1e-9:
            raise ResourceError(
                f"{where['CPU']}: {workers} workers x {per_worker:g} CPUs need {need:g} CPUs; "
                f"the cluster has {cpus:g} available (allowed: lower {field} or {where['CPU']})"
            )
        if need > 0:
            concurrency = max(1, min(concurrency, int(math.floor(cpus / need + 1e-9))))
    else:
        # Share what is available; never more than one CPU per worker, never starve one.
        per_worker = min(1.0, cpus / (workers * concurrency)) if cpus else 0.0
        while per_worker < _MIN_CPUS_PER_WORKER and concurrency > 1:
            concurrency -= 1
            per_worker = min(1.0, cpus / (workers * concurrency))
        grid = _ELASTIC_CPU_GRID if elastic else 100
        per_worker = math.floor(per_worker * grid + 1e-9) / grid
        if per_worker < _MIN_CPUS_PER_WORKER:
            least = workers * (math.ceil(_MIN_CPUS_PER_WORKER * grid) / grid if elastic else _MIN_CPUS_PER_WORKER)
            raise ResourceError(
                f"{field}: {workers} workers need at least {least:g} CPUs; "
                f"the cluster has {cpus:g} available (allowed: fewer workers, or free CPUs, e.g. by deleting Serve apps)"
            )
    extra = tuple(sorted((k, v) for k, v in fixed.items() if k not in ("CPU", "GPU") and v > 0))
    return ResourcePlan(
        cpus_per_worker=per_worker,
        gpus_per_worker=fixed.get("GPU", 0.0),
        concurrent_trials=concurrency,
        threads_per_worker=threads_for(per_worker),
        extra_per_worker=extra,
        accelerator_type=getattr(train, "accelerator_type", None),
        min_workers=workers,
        max_workers=workers,
        start_workers=workers,
    )


def _shortage(key: str, where: str, workers: int, per: float, have: float, field: str) -> str:
    if where == "train.use_gpu":
        return (f"train.use_gpu: {workers} workers need {workers * per:g} GPUs; the cluster has {have:g} available "
                f"(allowed: lower {field}, set use_gpu: false, or add GPU nodes)")
    if where == "train.use_tpu":
        return (f"train.use_tpu: {workers} workers need {workers * per:g} TPUs; the cluster has {have:g} available "
                f"(allowed: lower {field}, or add TPU nodes)")
    return (f"{where}: {workers} workers x {per:g} {key} need {workers * per:g} {key}; the cluster has {have:g} "
            f"available (allowed: lower {field} or {where}, or add nodes with {key})")


def _start_workers(plan: ResourcePlan, available: dict, high: int) -> int:
    """How many of `high` workers of the plan's size fit in `available` for each concurrent trial."""
    fits = high
    for key, per in plan.worker_resources().items():
        if per > 0:
            fits = min(fits, int(math.floor(float(available.get(key, 0.0)) / (per * plan.concurrent_trials) + 1e-9)))
    return max(plan.min_workers, fits)
