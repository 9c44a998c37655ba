"""rayline.train.in_process: a one-worker run's checkpoints, resume and retries without a worker group.

The loops here are plain functions calling Ray Train's own API (`ray.train.report`, `get_checkpoint`,
`get_context`), as rayline's backends do; Ray Train's CheckpointManager keeps the run's record, so the
run directory is the one a worker group would have written (checked with rayline's locate_best and
with Ray's own snapshot reader)."""

import json
import os
import tempfile
import threading

import pytest

from rayline.errors import TrainingError
from rayline.train.in_process import (ONE_PROCESS_MAX_WORK, InProcessAborted, as_one_process, fit_in_process,
                                      one_process_reason, runs_in_process)


def _checkpoint_config(keep=2):
    import ray.train

    return ray.train.CheckpointConfig(num_to_keep=keep, checkpoint_score_attribute="score", checkpoint_score_order="max")


def _loop(epochs: int, scores: dict, fail_at: dict | None = None, seen: list | None = None):
    """Report `epochs` epochs, each with a checkpoint holding its epoch; start after the restored one.
    `fail_at`: {"epoch": n, "times": k} raises at epoch n, k times in all."""
    def loop(config):
        import ray.train

        context = ray.train.get_context()
        assert (context.get_world_size(), context.get_world_rank()) == (1, 0)
        restored = ray.train.get_checkpoint()
        start = 0
        if restored is not None:
            with restored.as_directory() as d:
                start = json.load(open(os.path.join(d, "state.json")))["epoch"] + 1
        if seen is not None:
            seen.append(start)
        for epoch in range(start, epochs):
            if fail_at and epoch == fail_at["epoch"] and fail_at["times"] > 0:
                fail_at["times"] -= 1
                raise RuntimeError(f"injected failure at epoch {epoch}")
            d = tempfile.mkdtemp()
            json.dump({"epoch": epoch}, open(os.path.join(d, "state.json"), "w"))
            ray.train.report({"epoch": epoch, "score": scores.get(epoch, 0.0)},
                             checkpoint=ray.train.Checkpoint.from_directory(d), delete_local_checkpoint_after_upload=True)
            assert not os.path.exists(d)  # deleted once persisted, as Ray does
    return loop


def _registered(run_dir: str) -> list[int]:
    snapshot = json.load(open(os.path.join(run_dir, "checkpoint_manager_snapshot.json")))
    return sorted(r["metrics"]["epoch"] for r in snapshot["checkpoint_results"])


def test_checkpoints_keep_the_best_and_the_latest_and_a_second_fit_resumes(tmp_path):
    scores = {0: 0.1, 1: 0.9, 2: 0.3, 3: 0.2}
    fit_in_process(_loop(4, scores), {}, datasets={}, storage_path=str(tmp_path), run_name="r",
                   checkpoint_config=_checkpoint_config())
    run_dir = tmp_path / "r"
    # Ray Train's rule: the 2 best by score (epochs 1 and 2) and the latest (3); the rest deleted from storage.
    assert _registered(str(run_dir)) == [1, 2, 3]
    assert len([p for p in run_dir.glob("checkpoint_*") if p.is_dir()]) == 3
    # Ray's own reader of the record (what a worker-group run of this name restores from) accepts it.
    from ray.train.v2._internal.execution.checkpoint.checkpoint_manager import CheckpointManager
    from ray.train.v2._internal.execution.context import StorageContext
    import asyncio

    async def load():
        return CheckpointManager(_checkpoint_config(), StorageContext(storage_path=str(tmp_path), experiment_dir_name="r"))

    manager = asyncio.new_event_loop().run_until_complete(load())
    assert manager.latest_checkpoint_result.metrics["epoch"] == 3
    # A later fit of the same run starts after its latest checkpoint, as `--resume` does.
    seen: list = []
    fit_in_process(_loop(6, scores, seen=seen), {}, datasets={}, storage_path=str(tmp_path), run_name="r",
                   checkpoint_config=_checkpoint_config())
    assert seen == [4]
    assert _registered(str(run_dir)) == [1, 2, 5]


def test_a_failed_attempt_is_retried_from_the_latest_checkpoint_up_to_max_failures(tmp_path):
    seen: list = []
    fit_in_process(_loop(5, {}, fail_at={"epoch": 3, "times": 2}, seen=seen), {}, datasets={}, storage_path=str(tmp_path),
                   run_name="r", checkpoint_config=_checkpoint_config(keep=None), max_failures=2)
    assert seen == [0, 3, 3]  # each retry from the latest checkpoint (epoch 2), not from scratch
    assert _registered(str(tmp_path / "r")) == [0, 1, 2, 3, 4]

    with pytest.raises(TrainingError, match=r"training failed after 1 retries \(train.max_failures\): "
                                            r"RuntimeError: injected failure at epoch 1"):
        fit_in_process(_loop(5, {}, fail_at={"epoch": 1, "times": 5}), {}, datasets={}, storage_path=str(tmp_path),
                       run_name="other", checkpoint_config=_checkpoint_config(), max_failures=1)


def test_callbacks_see_every_report_and_a_stop_ends_the_loop_at_its_next_report(tmp_path):
    seen = []

    class Callback:
        def after_report(self, run_context, metrics, checkpoint):
            seen.append((metrics[0]["epoch"], os.path.basename(checkpoint.path)))
            if metrics[0]["epoch"] == 1:
                stop.set()

    stop = threading.Event()
    with pytest.raises(InProcessAborted):
        fit_in_process(_loop(5, {}), {}, datasets={}, storage_path=str(tmp_path), run_name="r",
                       checkpoint_config=_checkpoint_config(keep=None), callbacks=[Callback()], max_failures=3, stop=stop)
    assert [epoch for epoch, _ in seen] == [0, 1]  # no retry of a stopped run
    assert [name for _, name in seen] == sorted(p.name for p in (tmp_path / "r").glob("checkpoint_*") if p.is_dir())


def test_only_a_one_cpu_worker_run_on_this_machine_s_one_node_ray_runs_in_process():
    import ray

    from rayline.spec import parse_spec
    from rayline.train.resources import ResourcePlan

    def spec(**train):
        return parse_spec({"name": "x", "data": {"source": {"format": "sklearn", "name": "iris"}, "label": "target"},
                           "task": "classification", "model": {"framework": "torch", "kind": "mlp"},
                           "train": {"workers": 1, **train}})

    plan = ResourcePlan(cpus_per_worker=1, gpus_per_worker=0, concurrent_trials=1, threads_per_worker=1)
    assert not ray.is_initialized()
    assert not runs_in_process(spec(), plan)  # no Ray here: nothing says this machine is the cluster
    # address="local": a Ray of its own, never a head that another test started on this machine
    # (a bare ray.init() joins the cluster that `ray start` recorded in /tmp/ray/ray_current_cluster).
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        assert runs_in_process(spec(), plan)
        assert not runs_in_process(spec(in_process="never"), plan)
        assert not runs_in_process(spec(workers=2), plan)
        assert not runs_in_process(spec(workers={"min": 1, "max": 2}), plan)
        assert not runs_in_process(spec(use_gpu=True), plan)
        tensorflow = spec().model_copy(update={"model": spec().model.model_copy(update={"framework": "tensorflow"})})
        assert not runs_in_process(tensorflow, plan)  # its process-wide thread pools are set once
        assert not runs_in_process(spec(), ResourcePlan(cpus_per_worker=1, gpus_per_worker=0, concurrent_trials=1,
                                                        threads_per_worker=1, extra_per_worker=(("memory", 1e8),)))

        # N CPU workers of a small run: one process with the N workers' CPUs and threads, said in the start line.
        two = spec(workers=2, epochs=10)
        reason = one_process_reason(two, plan, train_rows=1_000)
        assert reason == ("train.workers 2: 1,000 rows x 10 epochs fit one process, trained with 2 threads; "
                          "train.in_process: never keeps 2 workers")
        merged, merged_plan = as_one_process(two, plan)
        assert merged.train.workers == 1 and runs_in_process(merged, merged_plan)
        assert (merged_plan.cpus_per_worker, merged_plan.threads_per_worker, merged_plan.start_workers) == (2, 2, 1)
        half = ResourcePlan(cpus_per_worker=0.49, gpus_per_worker=0, concurrent_trials=2, threads_per_worker=1)
        assert "trained with 1 thread;" in one_process_reason(two, half, train_rows=1_000)  # 0.98 CPU: one thread
        assert one_process_reason(two, plan, train_rows=ONE_PROCESS_MAX_WORK // 10 + 1) is None  # too much work
        # xgboost's rounds are cheaper than epochs: its own limit (BackendInfo.one_process_max_work), 40M
        # rows x rounds. benchmarks/overhead.py's 1M-row job (800,000 train rows x 10 rounds) trains in process.
        booster = parse_spec({"name": "x", "data": {"source": {"format": "sklearn", "name": "iris"}, "label": "target"},
                              "task": "classification", "train": {"workers": 2},
                              "model": {"framework": "xgboost", "kind": "gbdt", "params": {"num_boost_round": 10}}})
        assert one_process_reason(booster, plan, train_rows=800_000) == (
            "train.workers 2: 800,000 rows x 10 boosting rounds fit one process, trained with 2 threads; "
            "train.in_process: never keeps 2 workers")
        assert one_process_reason(booster, plan, train_rows=4_000_001) is None  # 40,000,010 rows x rounds
        assert one_process_reason(two, plan, train_rows=800_000) is None  # the same rows x 10 epochs of an MLP
        assert one_process_reason(spec(workers=2, in_process="never"), plan, 1_000) is None
        assert one_process_reason(spec(workers=2, strategy="fsdp"), plan, 1_000) is None  # FSDP needs its group
        assert one_process_reason(spec(workers=2, grad_compression="powersgd"), plan, 1_000) is None
        assert one_process_reason(spec(workers={"min": 1, "max": 2}), plan, 1_000) is None
        assert one_process_reason(spec(workers=2, use_gpu=True), plan, 1_000) is None
        assert one_process_reason(spec(), plan, 1_000) is None  # one worker: in process already, nothing to merge
        swept = two.model_copy(update={"tune": parse_spec({**two.model_dump(by_alias=True, exclude_none=True), "tune": {
            "space": {"train.grad_compression": {"choice": ["none", "powersgd"]}}}}).tune})
        assert one_process_reason(swept, plan, 1_000) is None  # a draw could need the group
    finally:
        ray.shutdown()
    assert one_process_reason(two, plan, 1_000) is None  # no Ray: nothing says this machine is the cluster
