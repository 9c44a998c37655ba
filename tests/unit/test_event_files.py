"""TensorBoard event files from trials' histories (rayline/train/event_files.py), read back with
TensorBoard's own reader."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from rayline.train.event_files import mean_throughput, tensorboard_command, write_event_files


def _trial(trial_id, rows):
    return SimpleNamespace(trial_id=trial_id, result=SimpleNamespace(history=rows) if rows is not None else None)


def _rows(n, accuracy0=0.5):
    return [{"epoch": e, "accuracy": accuracy0 + e / 10, "log_loss": 1.0 / (e + 1), "samples_per_s": 1000.0 + e,
             "samples_per_s_per_worker": 500.0 + e / 2, "lr": 0.01, "resumed": 0} for e in range(n)]


def test_each_trial_gets_its_scalars_per_epoch(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = write_event_files(str(tmp_path / "tb"), [_trial("a", _rows(3)), _trial("b", _rows(2, 0.6)), _trial("c", None)])
    assert out == str(tmp_path / "tb")
    assert sorted(os.listdir(out)) == ["a", "b"]  # a trial without results has nothing to show
    events = EventAccumulator(os.path.join(out, "a"))
    events.Reload()
    assert set(events.Tags()["scalars"]) == {"valid/accuracy", "valid/log_loss", "train/samples_per_s",
                                             "train/samples_per_s_per_worker", "train/lr"}
    assert [(e.step, round(e.value, 6)) for e in events.Scalars("valid/accuracy")] == [(0, 0.5), (1, 0.6), (2, 0.7)]
    assert [e.value for e in events.Scalars("train/samples_per_s")] == [1000.0, 1001.0, 1002.0]


def test_nothing_reported_writes_nothing(tmp_path):
    assert write_event_files(str(tmp_path / "tb"), [_trial("a", None), _trial("b", [])]) is None
    assert not (tmp_path / "tb").exists()


def test_mean_throughput_and_the_command():
    assert mean_throughput(_rows(3)) == pytest.approx((1001.0, 500.5))
    assert mean_throughput([{"epoch": 0, "accuracy": 1.0}]) is None
    assert tensorboard_command("/runs/x/tensorboard").startswith("tensorboard --logdir /runs/x/tensorboard")


def test_an_xgboost_runs_event_files_do_not_import_torch(tmp_path):
    """tensorboardX imports torch when it is installed (1.3-2.3 s); a process that has not loaded
    torch (an xgboost or tensorflow run) writes its event files without it, and can import it after."""
    import subprocess
    import sys

    code = f"""
import sys
from types import SimpleNamespace
from rayline.train.event_files import write_event_files
rows = [{{"epoch": 0, "accuracy": 0.5}}, {{"epoch": 1, "accuracy": 0.7}}]
write_event_files({str(tmp_path / "tb")!r}, [SimpleNamespace(trial_id="a", result=SimpleNamespace(history=rows))])
assert "torch" not in sys.modules, "torch was imported"
import torch
print(torch.tensor([2.0]).item())
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "2.0", done.stderr
    assert os.listdir(tmp_path / "tb" / "a")  # its event file
