"""Resource planning: fits the cluster or fails fast naming the resource."""

import pytest

from rayline.errors import ResourceError
from rayline.train.resources import plan_resources
from rayline.spec import TrainSpec


def test_two_core_machine_shares_cpus_between_trials():
    plan = plan_resources(TrainSpec(workers=2), {"CPU": 2.0}, wanted_concurrency=2)
    assert plan.concurrent_trials == 2 and plan.cpus_per_worker == 0.5
    assert plan.concurrent_trials * 2 * plan.cpus_per_worker <= 2.0


def test_big_machine_caps_at_one_cpu_per_worker():
    assert plan_resources(TrainSpec(workers=4), {"CPU": 64.0}).cpus_per_worker == 1.0


def test_concurrency_lowered_rather_than_starving_workers():
    plan = plan_resources(TrainSpec(workers=8), {"CPU": 1.0}, wanted_concurrency=4)
    assert plan.concurrent_trials == 1 and plan.cpus_per_worker >= 0.1


def test_gpu_shortage_fails_fast_naming_gpus():
    with pytest.raises(ResourceError, match=r"train.use_gpu: 2 workers need 2 GPUs; the cluster has 0 available"):
        plan_resources(TrainSpec(workers=2, use_gpu=True), {"CPU": 8.0})


def test_explicit_cpus_that_cannot_fit_fail_fast():
    with pytest.raises(ResourceError, match=r"train.cpus_per_worker: 4 workers x 1 CPUs need 4 CPUs; the cluster has 2 available"):
        plan_resources(TrainSpec(workers=4, cpus_per_worker=1), {"CPU": 2.0})


def test_too_many_workers_for_the_cluster_fail_fast():
    with pytest.raises(ResourceError, match=r"train.workers: 64 workers need at least 6.4 CPUs"):
        plan_resources(TrainSpec(workers=64), {"CPU": 2.0})


def test_sweep_is_planned_for_its_largest_worker_draw():
    # train.workers: {choice: [2, 64]} on 2 CPUs: the 64-worker trial could never be placed.
    with pytest.raises(ResourceError, match=r"^tune.space.train.workers: 64 workers need at least 6.4 CPUs; "
                                            r"the cluster has 2 available"):
        plan_resources(TrainSpec(workers=2), {"CPU": 2.0}, wanted_concurrency=2, max_workers=64)


def test_every_smaller_draw_fits_the_plan_for_the_largest():
    plan = plan_resources(TrainSpec(workers=1), {"CPU": 2.0}, wanted_concurrency=2, max_workers=4)
    for workers in (1, 2, 3, 4):
        assert plan.concurrent_trials * workers * plan.cpus_per_worker <= 2.0 + 1e-9
    assert plan == plan_resources(TrainSpec(workers=4), {"CPU": 2.0}, wanted_concurrency=2)


def test_draws_below_train_workers_keep_the_spec_plan():
    assert plan_resources(TrainSpec(workers=2), {"CPU": 2.0}, max_workers=1) == plan_resources(TrainSpec(workers=2), {"CPU": 2.0})


def test_progress_line_names_the_workers_a_run_starts_with():
    assert plan_resources(TrainSpec(workers=2), {"CPU": 2.0}).workers_text() == "2 workers"
    # elastic {min: 1, max: 4} on 2 CPUs with a whole CPU per worker: 2 fit now
    elastic = plan_resources(TrainSpec(workers={"min": 1, "max": 4}, cpus_per_worker=1), {"CPU": 2.0})
    assert elastic.workers_text() == "1-4 workers (starting with 2)"
