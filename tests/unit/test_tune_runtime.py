"""Sweep runtime decisions without Ray: ASHA's clock in training units, the largest draw of a space."""

import pytest

from rayline.spec import parse_spec
from rayline.tune.clock import TIME_ATTR, largest_draw, max_workers, total_units
from rayline.tune.schedulers import asha_defaults


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
    settings = asha_defaults(total_units(_spec(epochs=8)))
    assert settings == {"time_attr": TIME_ATTR, "max_t": 8, "grace_period": 1, "reduction_factor": 2}


def test_xgboost_asha_counts_boosting_rounds_not_reports():
    # 500 rounds reported every 5: the clock must reach 500, not stop at report 50 (round 250) or epochs.
    spec = _spec("xgboost", params={"num_boost_round": 500, "checkpoint_every": 5}, epochs=50)
    settings = asha_defaults(total_units(spec))
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


# ---- randint's bounds are inclusive: drawn from the real Tune domains, not rayline's arithmetic

def _drawn(domains: dict, n: int = 400) -> dict[str, set]:
    return {path: {domain.sample() for _ in range(n)} for path, domain in domains.items()}


_RANDINT_SPACE = {"train.batch_size": {"randint": [2, 4]}, "train.epochs": {"randint": [5, 6]}}
_RANDINT_DRAWS = {"train.batch_size": {2, 3, 4}, "train.epochs": {5, 6}}


def test_randint_draws_both_bounds_and_nothing_outside():
    """`randint: [2, 4]` draws 2, 3 and 4 from the Tune domain `search_space` builds (random search)."""
    from rayline.tune.sweep import search_space

    space = search_space(_spec(space=_RANDINT_SPACE))
    assert _drawn({p: space[p] for p in _RANDINT_DRAWS}) == _RANDINT_DRAWS


def test_randint_bounds_inclusive_through_optuna():
    """Optuna's TPE (rayline's searcher, fed search_space as Tune feeds it) suggests both bounds, nothing outside."""
    from rayline.tune.searchers import SEARCHERS
    from rayline.tune.sweep import search_space

    spec = _spec(space=_RANDINT_SPACE)
    searcher = SEARCHERS["optuna"].build(spec, metric="loss", mode="min", concurrency=1)
    assert searcher.set_search_properties("loss", "min", search_space(spec))
    drawn = {p: set() for p in _RANDINT_DRAWS}
    for i in range(120):  # one live trial at a time (the limiter), each completed before the next
        config = searcher.suggest(f"t{i}")
        for p in drawn:
            drawn[p].add(config[p])
        searcher.on_trial_complete(f"t{i}", result={"loss": float(i % 7), "training_iteration": 1})
    assert drawn == _RANDINT_DRAWS


def test_randint_bounds_inclusive_in_pbt_mutations():
    """PBT resamples a randint path from the domain `Pbt.mutations` builds: both bounds, nothing outside."""
    from rayline.tune.schedulers import SCHEDULERS

    spec = _spec(space={"train.batch_size": {"randint": [2, 4]}}, scheduler="pbt")
    assert _drawn(SCHEDULERS["pbt"].mutations(spec)) == {"train.batch_size": {2, 3, 4}}


def test_randint_inside_a_model_family_draws_both_bounds():
    """A family's own randint (`model: {choice: [...]}`, flattened to model[i].params.<p>) is drawn inclusively too."""
    from rayline.tune.sweep import search_space

    xgb = {"framework": "xgboost", "kind": "gbdt", "params": {"max_depth": {"randint": [2, 5]}, "num_boost_round": 20}}
    torch = {"framework": "torch", "kind": "mlp", "params": {}}
    spec = parse_spec({"name": "t", "data": {"source": {"format": "sklearn", "name": "iris"}, "label": "target"},
                       "train": {"epochs": 2}, "tune": {"num_samples": 2, "space": {"model": {"choice": [torch, xgb]}}}})
    space = search_space(spec)
    assert _drawn({"model[1].params.max_depth": space["model[1].params.max_depth"]}) == {"model[1].params.max_depth": {2, 3, 4, 5}}
