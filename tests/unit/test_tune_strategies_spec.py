"""tune.search, tune.scheduler, tune.seed and tune.time_budget_s without Ray's cluster: the spec's
checks (exact messages), the schedulers' defaults, Optuna's draws and the PBT handoff's run names."""

from __future__ import annotations

import pytest

from rayline.errors import SpecError
from rayline.spec import parse_spec


def _raw(framework="torch", space=None, epochs=8, **tune):
    return {
        "name": "t",
        "data": {"source": {"format": "sklearn", "name": "iris"}, "label": "target", "split": {"seed": 5}},
        "model": {"framework": framework, "kind": "gbdt" if framework == "xgboost" else "mlp"},
        "train": {"workers": 1, "epochs": epochs},
        "tune": {"num_samples": 2, "space": space or {"train.optimizer.lr": {"loguniform": [1e-3, 1e-1]}}, **tune},
    }


def _error(raw) -> str:
    with pytest.raises(SpecError) as info:
        parse_spec(raw)
    return str(info.value)


# ---------------------------------------------------------------- the spec


def test_bare_scheduler_names_stay_valid_and_dump_as_written():
    for name in ("asha", "fifo", "median", "pbt"):
        spec = parse_spec(_raw(scheduler=name))
        assert spec.tune.scheduler == name and spec.tune.scheduler.name == name
        assert spec.model_dump(by_alias=True, exclude_none=True)["tune"]["scheduler"] == name
    assert parse_spec(_raw()).tune.scheduler == "asha"  # the default


def test_scheduler_parameters_as_a_mapping_with_one_key():
    spec = parse_spec(_raw(scheduler={"pbt": {"perturbation_interval": 2, "quantile_fraction": 0.25}}))
    params = spec.tune.scheduler.params
    assert spec.tune.scheduler == "pbt" and params.perturbation_interval == 2 and params.quantile_fraction == 0.25
    dumped = spec.model_dump(by_alias=True, exclude_none=True)
    assert dumped["tune"]["scheduler"]["pbt"]["perturbation_interval"] == 2
    assert parse_spec(dumped).tune.scheduler.params == params  # a trial's spec round-trips
    assert parse_spec(_raw(scheduler={"median": {"grace_period": 2, "min_samples_required": 3}})).tune.scheduler == "median"
    assert parse_spec(_raw(scheduler={"asha": None})).tune.scheduler == "asha"


@pytest.mark.parametrize("tune, message", [
    ({"scheduler": "hyperband"},
     "tune.scheduler: unknown scheduler (got 'hyperband'; allowed: asha, fifo, median, pbt; "
     "with parameters {<name>: {<parameter>: <value>}})"),
    ({"scheduler": {"asha": {}, "pbt": {}}},
     "tune.scheduler: a scheduler name, or a mapping with one key: the scheduler and its parameters"),
    ({"scheduler": {"asha": {"grace_period": 0}}}, "tune.scheduler.asha.grace_period: Input should be greater than or equal to 1 (got 0)"),
    ({"scheduler": {"asha": {"reduction_factor": 1}}}, "tune.scheduler.asha.reduction_factor: Input should be greater than 1 (got 1)"),
    ({"scheduler": {"asha": {"grace_period": 3, "max_t": 2}}},
     "tune.scheduler.asha.grace_period: must be <= max_t (got grace_period=3, max_t=2)"),
    ({"scheduler": {"asha": {"gracep": 1}}}, "tune.scheduler.asha.gracep: unknown key (got 'gracep'; allowed: grace_period, "
                                              "reduction_factor, max_t, brackets); did you mean 'grace_period'?"),
    ({"scheduler": {"asha": {"grace_period": 9}}},
     "tune.scheduler.asha.grace_period: longer than any trial trains: no trial would ever be compared (got 9; allowed: 1..8"),
    ({"scheduler": {"median": {"grace_period": 20}}}, "tune.scheduler.median.grace_period: longer than any trial trains"),
    ({"scheduler": {"median": {"min_samples_required": 0}}},
     "tune.scheduler.median.min_samples_required: Input should be greater than or equal to 1 (got 0)"),
    ({"scheduler": {"pbt": {"quantile_fraction": 0.7}}},
     "tune.scheduler.pbt.quantile_fraction: Input should be less than or equal to 0.5 (got 0.7)"),
    ({"scheduler": {"pbt": {"perturbation_interval": 0}}},
     "tune.scheduler.pbt.perturbation_interval: Input should be greater than or equal to 1 (got 0)"),
    ({"scheduler": {"pbt": {"perturbation_interval": 12}}}, "tune.scheduler.pbt.perturbation_interval: longer than any trial trains"),
    ({"scheduler": {"pbt": {"perturbation_factors": [1.2, -1]}}},
     "tune.scheduler.pbt.perturbation_factors: two finite factors > 0 (got [1.2, -1.0]; allowed: e.g. [1.2, 0.8])"),
    ({"scheduler": {"pbt": {"resample_probability": 2}}},
     "tune.scheduler.pbt.resample_probability: Input should be less than or equal to 1 (got 2)"),
    ({"scheduler": "pbt", "search": "optuna"},
     "tune.search: pbt chooses the trials' parameters itself: it works with random or grid starting points only "
     "(got 'optuna'; allowed: random, grid)"),
    ({"search": "bayes"}, "tune.search: Input should be 'random', 'grid' or 'optuna' (got 'bayes')"),
    ({"seed": -1}, "tune.seed: Input should be greater than or equal to 0 (got -1)"),
    ({"seed": 2**32}, "tune.seed: Input should be less than or equal to 4294967295"),
    ({"time_budget_s": 0}, "tune.time_budget_s: Input should be greater than 0 (got 0)"),
    ({"time_budget_s": "soon"}, "tune.time_budget_s: Input should be a valid number"),
])
def test_bad_settings_name_the_field_and_what_is_allowed(tune, message):
    assert message in _error(_raw(**tune))


def test_pbt_rejects_paths_a_checkpoint_cannot_survive():
    space = {"train.optimizer.lr": {"loguniform": [1e-3, 1e-1]},
             "model.params.hidden_sizes": {"choice": [[32], [64, 32]]}, "train.epochs": {"choice": [4, 8]}}
    text = _error(_raw(space=space, scheduler="pbt"))
    allowed = "allowed: train.optimizer.lr, train.optimizer.momentum, train.optimizer.weight_decay, train.batch_size)"
    for path in ("model.params.hidden_sizes", "train.epochs"):
        assert (f"tune.space.{path}: pbt changes a trial's parameters mid-training, from a checkpoint of another trial: "
                f"a path that changes the model's shape, the training length or the optimizer's kind cannot change then "
                f"(got '{path}'; {allowed}") in text
    assert "train.optimizer.lr" not in text.split("tune.space.")[0]
    ok = {"train.optimizer.lr": {"loguniform": [1e-3, 1e-1]}, "train.batch_size": {"choice": [16, 32]},
          "train.optimizer.momentum": {"uniform": [0.5, 0.9]}, "train.optimizer.weight_decay": {"choice": [0, 0.01]}}
    assert parse_spec(_raw(space=ok, scheduler="pbt")).tune.scheduler == "pbt"


def test_pbt_rejects_xgboost_with_the_frameworks_it_supports():
    text = _error(_raw("xgboost", space={"model.params.eta": {"uniform": [0.1, 0.3]}}, scheduler="pbt"))
    assert ("tune.scheduler: pbt needs a model trained in epochs by an optimizer whose parameters can change "
            "mid-training; framework xgboost trains boosting rounds (got pbt with framework xgboost; "
            "allowed: asha, median or fifo; or pbt with torch, tensorflow)") in text


def test_json_schema_takes_the_bare_name_too():
    from rayline.spec import spec_json_schema

    prop = spec_json_schema()["$defs"]["TuneSpec"]["properties"]["scheduler"]
    assert {"type": "string", "enum": ["asha", "fifo", "median", "pbt"]} in prop["anyOf"]
    assert {"$ref": "#/$defs/PbtScheduler"} in prop["anyOf"]


# ---------------------------------------------------------------- defaults derived from the spec


def test_scheduler_defaults_follow_the_units_clock():
    from rayline.tune.schedulers import SCHEDULERS
    from rayline.tune.clock import TIME_ATTR, total_units

    spec = parse_spec(_raw(epochs=16, scheduler="median"))
    median = SCHEDULERS["median"].settings(spec, spec.tune.scheduler.params, total_units(spec))
    assert median == {"time_attr": TIME_ATTR, "grace_period": 1, "min_samples_required": 3, "min_time_slice": 0,
                      "hard_stop": True}
    spec = parse_spec(_raw(epochs=16, scheduler="pbt"))
    pbt = SCHEDULERS["pbt"].settings(spec, spec.tune.scheduler.params, total_units(spec))
    assert pbt["time_attr"] == TIME_ATTR and pbt["perturbation_interval"] == 4 and pbt["quantile_fraction"] == 0.25
    spec = parse_spec(_raw(epochs=16, scheduler={"asha": {"grace_period": 2, "reduction_factor": 3}}))
    asha = SCHEDULERS["asha"].settings(spec, spec.tune.scheduler.params, total_units(spec))
    assert asha == {"time_attr": TIME_ATTR, "max_t": 16, "grace_period": 2, "reduction_factor": 3, "brackets": 1}


def test_pbt_mutations_come_from_the_space():
    from ray.tune.search.sample import Float, Integer

    from rayline.tune.schedulers import SCHEDULERS

    spec = parse_spec(_raw(scheduler="pbt", space={"train.optimizer.lr": {"loguniform": [1e-3, 1e-1]},
                                                  "train.batch_size": {"randint": [16, 64]},
                                                  "train.optimizer.weight_decay": {"choice": [0, 0.01, 0.1]}}))
    mutations = SCHEDULERS["pbt"].mutations(spec)
    assert isinstance(mutations["train.optimizer.lr"], Float)
    assert isinstance(mutations["train.batch_size"], Integer) and mutations["train.batch_size"].upper == 65  # inclusive
    assert mutations["train.optimizer.weight_decay"] == [0, 0.01, 0.1]


@pytest.mark.parametrize("kwargs, reason", [
    (dict(error=True, done=False, units_reported=3, stopped_by_scheduler=False, budget_hit=False), "error"),
    (dict(error=False, done=True, units_reported=3, stopped_by_scheduler=False, budget_hit=True), "completed"),
    # ASHA stops a trial that reached max_t: that trial trained every unit.
    (dict(error=False, done=False, units_reported=8, stopped_by_scheduler=True, budget_hit=False), "completed"),
    (dict(error=False, done=False, units_reported=2, stopped_by_scheduler=True, budget_hit=True), "early_stopped"),
    # Tune marks the result a scheduler stopped a trial at as done.
    (dict(error=False, done=True, units_reported=1, stopped_by_scheduler=True, budget_hit=False), "early_stopped"),
    (dict(error=False, done=False, units_reported=5, stopped_by_scheduler=False, budget_hit=True), "time_budget"),
    (dict(error=False, done=False, units_reported=None, stopped_by_scheduler=False, budget_hit=True), "time_budget"),
])
def test_stop_reason(kwargs, reason):
    from rayline.tune.decisions import stop_reason

    assert stop_reason(max_units=8, **kwargs) == reason


# ---------------------------------------------------------------- search


def _optuna_draws(seed: int, n: int = 4):
    from rayline.tune.searchers import SEARCHERS
    from rayline.tune.sweep import search_space

    space = {"train.optimizer.lr": {"loguniform": [1e-4, 1e-1]}, "train.batch_size": {"randint": [8, 64]},
             "model.params.hidden_sizes": {"choice": [[32], [64, 32], [128, 64]]},
             "train.optimizer.name": {"grid": ["adam", "sgd"]}}
    spec = parse_spec(_raw(space=space, search="optuna", seed=seed))
    searcher = SEARCHERS["optuna"].build(spec, metric="accuracy", mode="max", concurrency=n)
    assert searcher.set_search_properties("accuracy", "max", search_space(spec))
    return [searcher.suggest(f"t{i}") for i in range(n)]


def test_optuna_draws_are_reproducible_from_the_seed_and_map_lists_back():
    first, again, other = _optuna_draws(3), _optuna_draws(3), _optuna_draws(4)
    assert first == again and first != other
    for config in first:
        assert config["model.params.hidden_sizes"] in ([32], [64, 32], [128, 64])  # values, not Optuna's indices
        assert config["train.optimizer.name"] in ("adam", "sgd") and 8 <= config["train.batch_size"] <= 64
        assert 1e-4 <= config["train.optimizer.lr"] <= 1e-1
    assert len({str(c["model.params.hidden_sizes"]) for c in first + other}) > 1


def test_any_non_primitive_choice_is_drawn_by_index():
    from ray import tune

    from rayline.tune.searchers import decode, encode_space

    families = [{"framework": "torch", "kind": "mlp"}, {"framework": "xgboost", "kind": "gbdt"}]
    encoded, table = encode_space({"model": tune.choice(families), "x": tune.choice([1, "a", None]),
                                   "g": {"grid_search": [[1], [2]]}, "lr": tune.uniform(0, 1)})
    assert set(table) == {"model", "g"} and encoded["x"].categories == [1, "a", None]
    assert encoded["model"].categories == [0, 1] and encoded["lr"] is not None
    assert decode({"model": 1, "x": "a", "g": 0, "lr": 0.5}, table) == {"model": families[1], "x": "a", "g": [1], "lr": 0.5}
    assert decode(None, table) is None


def test_seed_defaults_to_the_split_seed():
    from rayline.tune.searchers import search_seed

    assert search_seed(parse_spec(_raw())) == 5
    assert search_seed(parse_spec(_raw(seed=11))) == 11


# ---------------------------------------------------------------- PBT's handoff


def test_a_restarted_trial_runs_under_a_new_train_run_only_when_it_took_another_trials_checkpoint():
    from rayline.tune.handoff import run_for

    assert run_for("a_00001", None) == ("trial-a_00001", None)
    own = {"trial_id": "a_00001", "run_name": "trial-a_00001-from-a_00000-u2", "train_checkpoint": "/r/x/checkpoint_1",
           "epoch": 3}
    assert run_for("a_00001", own) == ("trial-a_00001-from-a_00000-u2", None)  # paused: Train restores its own run
    donor = {"trial_id": "a_00000", "run_name": "trial-a_00000", "train_checkpoint": "/r/y/checkpoint_3", "epoch": 3}
    assert run_for("a_00001", donor) == ("trial-a_00001-from-a_00000-u4", "/r/y/checkpoint_3")


def test_trial_runs_and_exploits_from_run_names(tmp_path):
    from rayline.tune.handoff import exploits_from_runs, trial_runs

    for name in ("trial-a_00001", "trial-a_00001-from-a_00000-u4", "trial-a_00001-from-a_00002-u2", "trial-a_000011",
                 "trial-a_00000"):
        (tmp_path / name).mkdir()
    runs = [(r.rsplit("/", 1)[-1], start) for r, start in trial_runs(str(tmp_path), "a_00001")]
    assert runs == [("trial-a_00001", 0), ("trial-a_00001-from-a_00002-u2", 2), ("trial-a_00001-from-a_00000-u4", 4)]
    assert [(e["unit"], e["from_trial"]) for e in exploits_from_runs(str(tmp_path), "a_00001")] == [(2, "a_00002"), (4, "a_00000")]


def test_torch_restore_keeps_the_new_configs_hyperparameters():
    import torch

    from rayline.train.torch_backend import restore_hyperparameters

    params = [torch.nn.Parameter(torch.zeros(2))]
    old = torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=0.01)
    params[0].grad = torch.ones(2)
    old.step()
    new = torch.optim.SGD(params, lr=0.02, momentum=0.5, weight_decay=0.0)
    new.load_state_dict(old.state_dict())
    assert new.param_groups[0]["lr"] == 0.1  # what load_state_dict alone does
    restore_hyperparameters(new)
    group = new.param_groups[0]
    assert (group["lr"], group["momentum"], group["weight_decay"]) == (0.02, 0.5, 0.0)
    assert torch.equal(new.state[params[0]]["momentum_buffer"], old.state[params[0]]["momentum_buffer"])  # state kept
