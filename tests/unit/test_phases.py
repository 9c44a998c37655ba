"""A run's phases (rayline/pipeline/phases.py): the train stage split by its worker's timeline."""

from __future__ import annotations

import pytest

from rayline.pipeline.phases import PHASES, format_phases, train_phases


def test_the_train_stage_splits_into_start_up_setup_epochs_checkpoints_and_shutdown():
    # The stage began at 100; the worker's loop at 112 (Train's start-up), its first epoch at 115
    # (setup), epochs of 2 s each reported at 118 and 121.5, the stage ended at 124.
    timeline = {"started_at": 112.0, "loop_at": 115.0, "first_step_s": 0.25,
                "reports": [{"epoch": 0, "at": 118.0, "train_s": 2.0}, {"epoch": 1, "at": 121.5, "train_s": 2.0}]}
    phases = train_phases(100.0, 124.0, timeline)
    assert phases == pytest.approx({"train_startup": 12.0, "train_worker_setup": 3.0, "train_first_step": 0.25,
                                    "train_epochs": 3.75, "train_between_epochs": 2.5, "train_shutdown": 2.5})
    assert sum(phases.values()) == pytest.approx(124.0 - 100.0)


@pytest.mark.parametrize("timeline", [{}, None, {"started_at": 1.0, "loop_at": 2.0, "reports": []},
                                      {"started_at": 1.0, "reports": [{"epoch": 0, "at": 3.0, "train_s": 1.0}]}])
def test_a_checkpoint_without_a_timeline_gives_no_split(timeline):
    assert train_phases(0.0, 10.0, timeline) == {}


def test_phases_print_in_run_order_with_trains_parts_under_it():
    rows = format_phases({"ray_stop": 3.0, "train_epochs": 1.0, "data": 2.04, "train": 5.0, "total": 11.0, "trials": 1})
    assert rows == [("data", "2.0"), ("train", "5.0"), ("  epochs", "1.0"), ("ray stop", "3.0"), ("total", "11.0")]
    assert PHASES.index("train") < PHASES.index("train_startup") < PHASES.index("register")
