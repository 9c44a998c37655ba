"""A resumed trial that had checkpointed its last epoch before the sweep was killed trains nothing on
resume; rayline/tune/sweep.py reports its newest complete checkpoint's metrics again, so Tune's record
of the trial holds the sweep's metric (without it the resumed sweep failed: "Trial returned a result
which did not include the specified metric(s)")."""

import json

from rayline.train.loop import STATE_FILE
from rayline.tune.schedulers import TIME_ATTR
from rayline.tune.sweep import _report_finished_checkpoint


def _checkpoint(run_dir, name, state):
    path = run_dir / name
    path.mkdir(parents=True)
    if state is not None:
        (path / STATE_FILE).write_text(json.dumps(state))
    return path


def test_the_newest_complete_checkpoint_is_reported_with_the_schedulers_clock(tmp_path):
    run_dir = tmp_path / "trial-abc_00002"
    _checkpoint(run_dir, "checkpoint_2026-11-29_15-26-40.000000", {"epoch": 8, "metrics": {"epoch": 8, "log_loss": 0.41}})
    newest = _checkpoint(run_dir, "checkpoint_2026-11-29_15-26-45.000000",
                         {"epoch": 9, "metrics": {"epoch": 9, "log_loss": 0.37, "accuracy": 0.9}})
    _checkpoint(run_dir, "checkpoint_2026-11-29_15-26-46.000000", None)  # being written when killed: no state
    seen = []
    _report_finished_checkpoint(str(run_dir), 1.0, lambda metrics, path: seen.append((metrics, path)))
    assert seen == [({"epoch": 9, "log_loss": 0.37, "accuracy": 0.9, TIME_ATTR: 10}, str(newest))]

    scaled = []
    _report_finished_checkpoint(str(run_dir), 0.5, lambda metrics, path: scaled.append(metrics[TIME_ATTR]))
    assert scaled == [5.0]


def test_a_run_without_a_complete_checkpoint_reports_nothing(tmp_path):
    run_dir = tmp_path / "trial-abc_00003"
    _checkpoint(run_dir, "checkpoint_2026-11-29_15-26-46.000000", None)
    seen = []
    _report_finished_checkpoint(str(run_dir), 1.0, lambda metrics, path: seen.append(metrics))
    _report_finished_checkpoint(str(tmp_path / "no-such-run"), 1.0, lambda metrics, path: seen.append(metrics))
    assert seen == []
