"""Sweep runtime decisions without Ray: ASHA's clock in training units, the largest draw of a space."""

import pytest

from rayline.spec import parse_spec
from rayline.tune import TIME_ATTR, asha_settings, largest_draw, max_workers, total_units


def _spec(framework="torch", params=None, epochs=8, space=None, scheduler="asha"):
    raw = {
        "name": "t",
        "data": {"source": {"format": "sklearn", "name": "iris"}, "label": "target"},
        "model": {"framework": framework, "kind": "gbdt" if framework == "xgboost" else "mlp", "params": params or {}},
        "train": {"workers": 1, "epochs": epochs},
        "tune": {"num_samples": 2, "scheduler": scheduler, "space": space or {"train.batch_size": {"choice": [16, 32]}}},
    }
    return parse_spec(raw)


def test_torch_asha_counts_epochs():
    settings = asha_settings(_spec(epochs=8))
    assert settings == {"time_attr": TIME_ATTR, "max_t": 8, "grace_period": 1, "reduction_factor": 2}


def test_xgboost_asha_counts_boosting_rounds_not_reports():
    # 500 rounds reported every 5: the clock must reach 500, not stop at report 50 (round 250) or epochs.
    spec = _spec("xgboost", params={"num_boost_round": 500, "checkpoint_every": 5}, epochs=50)
    settings = asha_settings(spec)
    assert settings["time_attr"] == TIME_ATTR and settings["max_t"] == 500
    assert settings["grace_period"] == 31  # a sixteenth of the run: rungs at 31, 62, 124, 248 rounds


def test_xgboost_without_num_boost_round_trains_epochs_rounds():
    assert total_units(_spec("xgboost", epochs=30)) == 30


def test_max_t_is_the_largest_draw_of_the_space():
    spec = _spec("xgboost", params={"num_boost_round": 100},
                 space={"model.params.num_boost_round": {"choice": [40, 300]}})
    assert total_units(spec) == 300
    spec = _spec(epochs=4, space={"train.epochs": {"randint": [2, 12]}})
    assert total_units(spec) == 12  # randint's high bound is inclusive in rayline


@pytest.mark.parametrize("dist, top", [
    ({"choice": [2, 64]}, 64), ({"grid": [3, 1]}, 3), ({"randint": [1, 4]}, 4),
    ({"uniform": [0.1, 0.5]}, 0.5), ({"choice": ["adam", "sgd"]}, None), ({"choice": [[64], [128, 64]]}, None),
])
def test_largest_draw(dist, top):
    assert largest_draw(dist) == top


def test_max_workers_follows_the_space():
    assert max_workers(_spec(space={"train.workers": {"choice": [2, 64]}})) == 64
    assert max_workers(_spec(space={"train.workers": {"randint": [1, 3]}})) == 3
    assert max_workers(_spec()) == 1  # not in the space: train.workers itself
