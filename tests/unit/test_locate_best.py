"""Finding the best checkpoint of a Ray Train run from its storage directory."""

import json

import pytest

from rayline.errors import TrainingError
from rayline.train.run import locate_best


def _checkpoint(run_dir, name, epoch, accuracy, history_len=None, resumed_from=()):
    folder = run_dir / name
    folder.mkdir(parents=True)
    history = [{"epoch": e, "accuracy": accuracy} for e in range(history_len if history_len is not None else epoch + 1)]
    state = {"epoch": epoch, "metrics": {"epoch": epoch, "accuracy": accuracy}, "history": history,
             "resumed_from": list(resumed_from)}
    (folder / "rayline_state.json").write_text(json.dumps(state))


def _snapshot(run_dir, names):
    results = [{"checkpoint_dir_name": n, "metrics": {}} for n in names]
    (run_dir / "checkpoint_manager_snapshot.json").write_text(json.dumps({"checkpoint_results": results}))


def test_best_by_metric_history_from_latest(tmp_path):
    _checkpoint(tmp_path, "checkpoint_a", epoch=3, accuracy=0.9)
    _checkpoint(tmp_path, "checkpoint_b", epoch=5, accuracy=0.8, resumed_from=[2])
    best = locate_best(str(tmp_path), "accuracy", "max")
    assert best.checkpoint_dir.endswith("checkpoint_a") and best.metrics["accuracy"] == 0.9
    assert len(best.history) == 6 and best.resumed_from == [2]  # from the latest checkpoint
    assert locate_best(str(tmp_path), "accuracy", "min").checkpoint_dir.endswith("checkpoint_b")


def test_orphan_checkpoint_of_a_dead_attempt_is_ignored(tmp_path):
    # Attempt 1 wrote checkpoint_orphan and died before Ray Train registered it; attempt 2
    # started over. The orphan scores best but was never part of the run.
    _checkpoint(tmp_path, "checkpoint_orphan", epoch=0, accuracy=0.99)
    _checkpoint(tmp_path, "checkpoint_kept", epoch=9, accuracy=0.7)
    _snapshot(tmp_path, ["checkpoint_kept"])
    best = locate_best(str(tmp_path), "accuracy", "max")
    assert best.checkpoint_dir.endswith("checkpoint_kept")


def test_no_checkpoint_is_a_training_error(tmp_path):
    with pytest.raises(TrainingError, match="no checkpoint with metric 'accuracy'"):
        locate_best(str(tmp_path), "accuracy", "max")


def test_an_unreadable_snapshot_is_set_aside_and_the_run_goes_on_from_its_newest_checkpoint(tmp_path):
    """Ray Train writes its snapshot in place: a run interrupted mid-write left it empty, and its
    resume failed inside Train's controller. It is renamed aside; the newest checkpoint whose
    state reads is where the run goes on (one being written, with no state file, is not)."""
    from rayline.train.run import set_aside_unreadable_snapshot

    assert set_aside_unreadable_snapshot(str(tmp_path / "fresh-run")) is None  # no run yet
    _checkpoint(tmp_path, "checkpoint_a", epoch=3, accuracy=0.9)
    _checkpoint(tmp_path, "checkpoint_b", epoch=5, accuracy=0.8)
    (tmp_path / "checkpoint_c").mkdir()  # being written when the run stopped: no state file
    _snapshot(tmp_path, ["checkpoint_a", "checkpoint_b"])
    assert set_aside_unreadable_snapshot(str(tmp_path)) is None  # a snapshot that reads is Train's to restore
    assert (tmp_path / "checkpoint_manager_snapshot.json").is_file()

    (tmp_path / "checkpoint_manager_snapshot.json").write_text("")  # what the interrupted write left
    newest = set_aside_unreadable_snapshot(str(tmp_path))
    assert newest == str(tmp_path / "checkpoint_b")
    assert not (tmp_path / "checkpoint_manager_snapshot.json").exists()
    assert (tmp_path / "checkpoint_manager_snapshot.json.unreadable").read_text() == ""
