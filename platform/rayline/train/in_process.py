"""A one-worker training run in this process: no Train controller, no worker actor.

A Ray Train V2 run starts a controller actor and a worker actor, each a new Python process that
imports Ray Train and the framework before the first step: measured on the 2-core machine, 13.7 s
of a small run's 39.7 s (`benchmarks/overhead.py --only job`); with `--workers 1` that benchmark
runs the same job both ways (in a worker group 35.3 s, train stage 15.6 s; here 22.1 s and 4.7 s).
A run of one CPU worker on a Ray of one node gains nothing from those processes but the survival
of a worker process's death, so `train.in_process: auto` (the default) runs it here: in the driver of
`rayline run`, or in the trial's actor in a sweep.

Ray's local mode keeps checkpoints in memory, restores none and runs no callbacks, so this module
gives the loop what Ray Train's worker group would: `ray.train.report` persists the checkpoint to
the run's storage and registers it with Ray Train's own CheckpointManager (the same snapshot file,
the same keep-best-and-latest rule: a run can be resumed by the worker-group path and the other
way round), `ray.train.get_checkpoint` is the run's latest registered checkpoint (resume), the run's
callbacks see every report (the sweep's reports to Tune), and a failure of the loop is retried from
the latest checkpoint up to `train.max_failures` times. What it cannot survive is the death of the
process itself (the OOM killer, a crash in native code): that ends the run, as the driver's death
ends any embedded run; `rayline run --resume` continues it from its latest checkpoint. A spec that
needs the worker's own process says `train.in_process: never`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import shutil
import threading
from typing import Callable

from rayline.errors import TrainingError

__all__ = ["runs_in_process", "fit_in_process", "InProcessAborted", "one_process_reason", "as_one_process",
           "ONE_PROCESS_MAX_WORK", "space_keeps_process"]

log = logging.getLogger(__name__)


class InProcessAborted(BaseException):
    """Raised inside the loop at its next report once the run was asked to stop (Ctrl-C)."""


def runs_in_process(spec, plan) -> bool:
    """Whether `spec`'s training runs in this process (see the module doc): `train.in_process: auto`,
    one worker of a framework that can (rayline.frameworks: not TensorFlow), no GPU, TPU, accelerator
    type or other per-worker resource to place it by, and a Ray of one node that is this process's
    node (never a remote cluster's driver or a job on a head)."""
    from rayline.frameworks import BACKENDS

    train = spec.train
    if train.in_process != "auto" or train.elastic or train.workers != 1:
        return False
    if not BACKENDS[spec.model.framework].trains_in_process:
        return False
    if train.use_gpu or train.use_tpu or train.accelerator_type or plan.gpus_per_worker or plan.extra_per_worker:
        return False
    return _ray_internals_here() and _one_node_here()


# Work (train rows x epochs) up to which N CPU workers on a one-node Ray train as one process with N
# threads, unless the framework says otherwise (BackendInfo.one_process_max_work: xgboost's rounds are
# cheaper). Ray Train's controller and N worker processes cost 10-14 s a run, and a sweep
# pays them per trial (2-core box: benchmarks/overhead.py --only sweep, 22 s a 2-worker trial); a
# million rows-epochs of a small model trains in about that time. Same global batch, same optimizer
# steps: DDP averages the workers' gradients of their halves of a batch, one process computes the
# gradient of the whole batch.
ONE_PROCESS_MAX_WORK = 1_000_000

# Spec paths of a sweep's space that decide where a trial trains; a space over one of them keeps the
# spec's worker groups (a trial's draw could need one).
_PROCESS_PATHS = ("train.workers", "train.in_process", "train.use_gpu", "train.use_tpu", "train.accelerator_type",
                  "train.resources_per_worker", "train.grad_compression")


def space_keeps_process(spec) -> bool:
    """Whether every trial `spec`'s sweep can draw trains where the spec itself does: no path of the space
    that decides it, every model family of a framework that trains in process."""
    from rayline.frameworks import BACKENDS
    from rayline.spec.pipeline_space import PipelineSpace

    if not spec.tune:
        return True
    space = PipelineSpace(spec)
    if any(path == prefix or path.startswith(prefix + ".") for path in space.plain for prefix in _PROCESS_PATHS):
        return False
    frameworks = [family.model.get("framework", spec.model.framework) for family in space.families or []]
    return all(framework in BACKENDS and BACKENDS[framework].trains_in_process for framework in frameworks)


def one_process_reason(spec, plan, train_rows: int) -> str | None:
    """Why `spec`'s N CPU workers train as one process with N threads here, as the start line says it;
    None when they train as the spec says. Only `train.in_process: auto`, a fixed N > 1, plain DDP (no
    FSDP, no gradient compression: they exist for a process group), a framework that trains in process,
    CPU only, a Ray of one node that is this process's, and work (train rows x units) of at most the
    framework's one_process_max_work (ONE_PROCESS_MAX_WORK by default)."""
    from rayline.frameworks import BACKENDS
    from rayline.tune.clock import total_units

    train = spec.train
    workers = train.workers
    if train.in_process != "auto" or train.elastic or not isinstance(workers, int) or workers < 2:
        return None
    if not BACKENDS[spec.model.framework].trains_in_process or train.strategy != "ddp" \
            or train.grad_compression.name != "none":
        return None
    if train.use_gpu or train.use_tpu or train.accelerator_type or plan.gpus_per_worker or plan.extra_per_worker:
        return None
    units = total_units(spec)
    limit = BACKENDS[spec.model.framework].one_process_max_work or ONE_PROCESS_MAX_WORK
    if train_rows * units > limit or not space_keeps_process(spec):
        return None
    if not (_ray_internals_here() and _one_node_here()):
        return None
    unit_name = BACKENDS[spec.model.framework].units
    from rayline.train.resources import threads_for

    threads = threads_for(plan.cpus_per_worker * workers)
    return (f"train.workers {workers}: {train_rows:,} rows x {units} {unit_name} fit one process, trained with "
            f"{threads} thread{'s' if threads != 1 else ''}; train.in_process: never keeps {workers} workers")


def as_one_process(spec, plan):
    """(`spec`, `plan`) with the spec's N workers as one worker of N workers' CPUs and threads."""
    import dataclasses

    from rayline.spec.overrides import apply_overrides
    from rayline.train.resources import threads_for

    workers = spec.train.workers
    cpus = plan.cpus_per_worker * workers
    one = dataclasses.replace(plan, cpus_per_worker=cpus, threads_per_worker=threads_for(cpus),
                              min_workers=1, max_workers=1, start_workers=1)
    return apply_overrides(spec, {"train.workers": 1}), one


# What this module builds on inside Ray Train (ray==2.60): a Ray that moved them trains in a worker group.
_RAY_INTERNALS = (("ray.train.v2._internal.execution.checkpoint.checkpoint_manager", "CheckpointManager"),
                  ("ray.train.v2._internal.execution.train_fn_utils", "LocalTrainFnUtils"),
                  ("ray.train.v2._internal.execution.train_fn_utils", "set_train_fn_utils"),
                  ("ray.train.v2._internal.execution.context", "StorageContext"),
                  ("ray.train.v2._internal.execution.training_report", "_TrainingReport"),
                  ("ray.tune.trainable.trainable_fn_utils", "_in_tune_session"))


def _ray_internals_here() -> bool:
    import importlib

    try:
        return all(hasattr(importlib.import_module(module), name) for module, name in _RAY_INTERNALS)
    except ImportError:
        return False


def _one_node_here() -> bool:
    import ray

    try:
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        return len(nodes) == 1 and nodes[0]["NodeID"] == ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001 - not connected, or a client: the worker group decides
        return False


def fit_in_process(train_loop: Callable[[dict], None], config: dict, *, datasets: dict, storage_path: str,
                   run_name: str, checkpoint_config, callbacks=(), max_failures: int = 0,
                   stop: threading.Event | None = None) -> None:
    """Run `train_loop(config)` here as one Ray Train worker of run `run_name` under `storage_path`,
    retrying a failed attempt from the latest checkpoint up to `max_failures` times. Raises
    TrainingError when the last attempt fails, InProcessAborted once `stop` is set."""
    from ray.train.v2._internal.execution.context import StorageContext

    storage = StorageContext(storage_path=storage_path, experiment_dir_name=run_name)
    for attempt in range(max_failures + 1):
        sink = _sink_class()(storage, checkpoint_config, datasets=datasets, callbacks=callbacks, stop=stop,
                             experiment_name=run_name)
        try:
            sink.run(train_loop, config)
            return
        except (InProcessAborted, KeyboardInterrupt, SystemExit):
            raise
        except Exception as exc:  # noqa: BLE001 - the loop's failure: retried as Train retries a worker group
            if attempt == max_failures:
                raise TrainingError(f"training failed after {max_failures} retries (train.max_failures): "
                                    f"{type(exc).__name__}: {str(exc).strip()[:500]}") from exc
            log.warning("training attempt %d of %d failed (%s: %s); restarting from the latest checkpoint",
                        attempt + 1, max_failures + 1, type(exc).__name__, exc)
        finally:
            sink.close()


@functools.lru_cache(maxsize=None)  # one class per process (it subclasses a Ray class imported lazily)
def _sink_class():
    from ray.train.v2._internal.execution.train_fn_utils import LocalTrainFnUtils

    class Sink(LocalTrainFnUtils):
        """Ray Train's per-process functions (`ray.train.report`, `get_checkpoint`, ...) for one attempt."""

        def __init__(self, storage, checkpoint_config, *, datasets: dict, callbacks, stop, experiment_name: str):
            from ray.train.v2._internal.execution.checkpoint.checkpoint_manager import CheckpointManager

            super().__init__(experiment_name=experiment_name,
                             dataset_shards={name: ds.iterator() for name, ds in datasets.items()})
            self._storage = storage
            self._callbacks = list(callbacks)
            self._stop = stop
            # The CheckpointManager notifies waiters on an asyncio condition: one loop of its own, run per call.
            self._loop = asyncio.new_event_loop()
            try:
                self._manager = self._loop.run_until_complete(_construct(CheckpointManager, checkpoint_config, storage))
            except Exception as exc:  # noqa: BLE001 - a snapshot naming checkpoints that are gone
                self._loop.close()
                raise TrainingError(f"cannot resume run {storage.experiment_fs_path}: {exc}") from exc
            latest = self._manager.latest_checkpoint_result
            self._last_checkpoint = latest.checkpoint if latest else None

        def report(self, metrics, checkpoint=None, checkpoint_dir_name=None, checkpoint_upload_mode=None,
                   delete_local_checkpoint_after_upload=None, checkpoint_upload_fn=None, validation=False) -> None:
            from ray.train.v2._internal.execution.training_report import _TrainingReport

            if self._stop is not None and self._stop.is_set():
                raise InProcessAborted("training stopped")
            persisted = None
            if checkpoint is not None:
                name = checkpoint_dir_name or self._storage.make_default_checkpoint_dir_name()
                persisted = self._storage.persist_current_checkpoint(checkpoint, name)
                if delete_local_checkpoint_after_upload:
                    shutil.rmtree(checkpoint.path, ignore_errors=True)
                report = _TrainingReport(checkpoint=persisted, metrics=metrics, validation=False)
                self._loop.run_until_complete(_call(self._manager.register_checkpoint, report))
                self._last_checkpoint = persisted
            self._last_metrics = metrics
            for callback in self._callbacks:
                callback.after_report(run_context=None, metrics=[metrics], checkpoint=persisted)

        def run(self, train_loop, config: dict) -> None:
            from ray.train.v2._internal.execution.train_fn_utils import set_train_fn_utils

            _exempt_from_tune_session()
            # Ray Train's per-process functions are one global: one attempt at a time in a process. A
            # trial of a sweep whose process was handed on (Tune's reuse_actors) while the stopped
            # trial's training thread was still mid-epoch waits here until that thread's next report
            # ends it (rayline/tune/relay.py), so no report of one trial reaches another's run.
            with _ONE_ATTEMPT_AT_A_TIME:
                set_train_fn_utils(self)
                _training_thread.active = True
                try:
                    train_loop(config)
                finally:
                    _training_thread.active = False
                    set_train_fn_utils(None)

        def close(self) -> None:
            self._loop.close()

    return Sink


_ONE_ATTEMPT_AT_A_TIME = threading.Lock()

# The thread training in process, inside a Tune trial's actor: Ray Train's functions refuse to run in a
# Tune session (`requires_train_worker(raise_in_tune_session=True)`, ray/train/v2/_internal/util.py),
# which a trial's whole process is; on this thread they are the Train worker's, as in a worker actor.
_training_thread = threading.local()


def _exempt_from_tune_session() -> None:
    """Ray's Tune-session test answers False on the training thread (once per process; ray==2.60
    reads it from its module at each call)."""
    from ray.tune.trainable import trainable_fn_utils

    if getattr(trainable_fn_utils._in_tune_session, "rayline_exempts_training", False):
        return
    original = trainable_fn_utils._in_tune_session

    def _in_tune_session() -> bool:
        return False if getattr(_training_thread, "active", False) else original()

    _in_tune_session.rayline_exempts_training = True
    trainable_fn_utils._in_tune_session = _in_tune_session


async def _construct(cls, *args):
    return cls(*args)


async def _call(fn, *args):
    result = fn(*args)
    # What the call scheduled (the manager's notification of waiters) runs before the loop stops.
    pending = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    if pending:
        await asyncio.gather(*pending)
    return result
