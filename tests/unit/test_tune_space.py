"""tune.space: only tunable paths, and every value a trial can draw is valid for the field it sets — decided at validate."""

import copy
from pathlib import Path

import pytest
import yaml
from annotated_types import Ge, Gt, Le, Lt

from rayline.errors import SpecError
from rayline.spec import TUNABLE, TrainSpec, largest_value, parse_spec
from rayline.spec.space import NOT_TUNABLE
from rayline.frameworks import BACKENDS
from tests.cli import rayline as rayline_in_process

ROOT = Path(__file__).resolve().parents[2]
TORCH = yaml.safe_load((ROOT / "pipelines" / "digits-torch.yaml").read_text())
XGB = yaml.safe_load((ROOT / "pipelines" / "breast-cancer-xgboost.yaml").read_text())
CUSTOM = {**TORCH, "model": {"framework": "torch", "import": "pipelines.custom_net:build"}}


def _spec(space, base=TORCH, **tune):
    raw = copy.deepcopy(base)
    raw["tune"] = {**raw.get("tune", {}), **tune, "space": space}
    return raw


def _problems(space, base=TORCH, **tune):
    with pytest.raises(SpecError) as info:
        parse_spec(_spec(space, base, **tune))
    return info.value.problems


def test_every_tunable_path_is_accepted():
    space = {
        "train.epochs": {"randint": [1, 5]},
        "train.batch_size": {"choice": [32, 64]},
        "train.workers": {"choice": [1, 2]},
        "train.optimizer.name": {"choice": ["adam", "sgd"]},
        "train.optimizer.lr": {"loguniform": [1e-4, 1e-1]},
        "train.optimizer.momentum": {"uniform": [0.0, 0.9]},
        "train.optimizer.weight_decay": {"uniform": [0, 0.1]},
        "train.precision": {"choice": ["fp32", "bf16"]},
        "train.grad_accumulation": {"choice": [1, 4]},
        "train.grad_compression": {"choice": ["none", "fp16", {"powersgd": {"rank": 2}}]},
        "model.params.hidden_sizes": {"choice": [[8], [16, 8]]},
        "model.params.dropout": {"uniform": [0, 0.5]},
    }
    assert set(space) - {"model.params.hidden_sizes", "model.params.dropout"} == set(TUNABLE)
    assert parse_spec(_spec(space)).tune.space == space


def test_model_params_of_each_built_in_kind_and_any_for_import():
    for param in sorted(BACKENDS["xgboost"].kinds["gbdt"]):
        parse_spec(_spec({f"model.params.{param}": {"choice": [1]}}, XGB))
    parse_spec(_spec({"model.params.anything_the_callable_takes": {"choice": [1, 2]}}, CUSTOM))


ALLOWED_TORCH = ("model.params.dropout, model.params.hidden_sizes, train.epochs, train.batch_size, train.workers, "
                 "train.optimizer.name, train.optimizer.lr, train.optimizer.momentum, train.optimizer.weight_decay, "
                 "train.precision, train.grad_accumulation, train.grad_compression, data.preprocess[i]..., model (a choice of model families)")


@pytest.mark.parametrize("path, reason", [
    ("train.cpus_per_worker", "resources are planned once for the whole sweep; set it outside tune.space"),
    ("train.use_gpu", "resources are planned once for the whole sweep"),
    ("train.use_tpu", "resources are planned once for the whole sweep"),
    ("model.framework", "a sweep chooses model families with tune.space.model: {choice: ["),
    ("model.kind", "a sweep chooses model families with tune.space.model: {choice: ["),
    ("model.import", "a sweep chooses model families with tune.space.model: {choice: ["),
    ("train.metric", "every trial is ranked by the same metric"),
    ("train.max_failures", "fault tolerance is set once for the whole sweep"),
    ("data.split.valid", "the data is read and split once for the whole sweep, so that trials compare on the same rows "
                         "(only data.preprocess is tunable)"),
    ("data.source.name", "the data is read and split once for the whole sweep"),
    ("serve.replicas.max", "serving settings do not change the trained model"),
    ("tune.num_samples", "the sweep's own settings are not tunable"),
    ("name", "one sweep registers one model name"),
    ("task", "one sweep solves one task"),
])
def test_other_paths_are_rejected_with_the_reason_and_what_is_tunable(path, reason):
    (problem,) = _problems({path: {"choice": [1, 2]}})
    assert problem.startswith(f"tune.space.{path}: not tunable: {reason}"), problem
    assert problem.endswith(f"(got {path!r}; allowed: {ALLOWED_TORCH})"), problem


def test_every_spec_field_is_either_tunable_or_has_a_reason():
    # A new field under model or train must be decided on: added to TUNABLE or given a
    # reason in NOT_TUNABLE (data, serve and tune are decided as whole sections).
    from rayline.spec import ModelSpec, OptimizerSpec

    fields = [f"model.{f.alias or n}" for n, f in ModelSpec.model_fields.items() if n != "params"]
    fields += [f"train.{n}" for n in TrainSpec.model_fields if n != "optimizer"]
    fields += [f"train.optimizer.{n}" for n in OptimizerSpec.model_fields]
    undecided = [p for p in fields if p not in TUNABLE and p not in NOT_TUNABLE]
    assert undecided == []
    from rayline.spec import PipelineSpec

    assert {n for n in PipelineSpec.model_fields if n not in ("model", "train")} <= set(NOT_TUNABLE)


@pytest.mark.parametrize("space, expected", [
    ({"train.optimizer.lr": {"uniform": [0, float("inf")]}},
     "tune.space.train.optimizer.lr.uniform: bounds must be finite numbers (got [0, inf]; allowed: finite [low, high] with low < high)"),
    ({"train.optimizer.lr": {"loguniform": [1e-4, float("inf")]}},
     "tune.space.train.optimizer.lr.loguniform: bounds must be finite numbers (got [0.0001, inf];"),
    ({"train.optimizer.lr": {"uniform": [float("nan"), 1]}}, "tune.space.train.optimizer.lr.uniform: bounds must be finite numbers (got [nan, 1];"),
    ({"train.optimizer.weight_decay": {"choice": [0.1, float("nan")]}},
     "tune.space.train.optimizer.weight_decay.choice: values must be finite numbers (got [0.1, nan]; allowed: no inf or nan)"),
    ({"model.params.hidden_sizes": {"choice": [[8], [float("inf")]]}}, "tune.space.model.params.hidden_sizes.choice: values must be finite numbers"),
    ({"train.epochs": {"uniform": [1, 5]}},
     "tune.space.train.epochs: uniform draws fractional numbers, and train.epochs takes whole numbers "
     "(got {'uniform': [1, 5]}; allowed: randint or choice)"),
    ({"train.batch_size": {"loguniform": [16, 256]}}, "tune.space.train.batch_size: loguniform draws fractional numbers"),
    ({"train.optimizer.lr": {"uniform": [0, 1]}},
     "tune.space.train.optimizer.lr: uniform can draw 0, which train.optimizer.lr does not take: Input should be greater than 0 "
     "(got {'uniform': [0, 1]})"),
    ({"train.optimizer.lr": {"loguniform": [1e-3, 100]}}, "loguniform can draw 100, which train.optimizer.lr does not take: Input should be less than or equal to 10"),
    ({"train.workers": {"choice": [2, 0]}},
     "tune.space.train.workers: choice can draw 0, which train.workers does not take: Input should be greater than or equal to 1 (got {'choice': [2, 0]})"),
    ({"train.workers": {"randint": [1, 1025]}}, "randint can draw 1025, which train.workers does not take: Input should be less than or equal to 1024"),
    ({"train.optimizer.momentum": {"uniform": [0, 1]}}, "uniform can draw 1, which train.optimizer.momentum does not take: Input should be less than 1"),
    ({"train.optimizer.name": {"choice": ["adam", "rmsprop"]}},
     "choice can draw 'rmsprop', which train.optimizer.name does not take: Input should be 'adam', 'adamw' or 'sgd'"),
    ({"train.batch_size": {"grid": [32, 64.5]}}, "grid can draw 64.5, which train.batch_size does not take: Input should be a valid integer"),
    ({"train.epochs.max": {"choice": [1]}}, "tune.space.train.epochs.max: train.epochs is a value, not a section (got 'train.epochs.max'; allowed: train.epochs)"),
    ({"model.params": {"choice": [{}]}}, "tune.space.model.params: names a section, not a value (got 'model.params'; allowed: model.params.<param>)"),
    ({"model.params.hidden_sizes.0": {"choice": [8]}},
     "tune.space.model.params.hidden_sizes.0: a parameter is tuned whole, not a part of it (got 'model.params.hidden_sizes.0'; allowed: model.params.hidden_sizes)"),
])
def test_values_are_checked_against_the_field_they_set(space, expected):
    (problem,) = _problems(space)
    assert problem.startswith("tune.space.") and expected in problem, problem


def test_randint_bounds_are_inclusive():
    parse_spec(_spec({"train.workers": {"randint": [1, 1024]}}))  # 1024 is the field's own maximum


def test_bounds_follow_the_field_constraints():
    # The space reuses the fields' own constraints: one past each bound is rejected, the bound accepted.
    for path in TUNABLE:
        parent, _, name = path.rpartition(".")
        model = TrainSpec if parent == "train" else TrainSpec.model_fields["optimizer"].annotation
        for meta in model.model_fields[name].metadata:
            for kind, bad, good in ((Ge, meta.ge - 1, meta.ge) if isinstance(meta, Ge) else (None, None, None),
                                    (Le, meta.le + 1, meta.le) if isinstance(meta, Le) else (None, None, None),
                                    (Gt, meta.gt, meta.gt + 0.5) if isinstance(meta, Gt) else (None, None, None),
                                    (Lt, meta.lt, meta.lt - 0.5) if isinstance(meta, Lt) else (None, None, None)):
                if kind is None:
                    continue
                assert _problems({path: {"choice": [good, bad]}})[0].startswith(f"tune.space.{path}: choice can draw {bad!r}")
                parse_spec(_spec({path: {"choice": [good]}}))


def test_every_problem_of_the_space_is_reported_together():
    problems = _problems({"train.workers": {"choice": [0]}, "train.cpus_per_worker": {"choice": [1]},
                          "model.params.depth": {"choice": [1]}, "train.optimizer.lr": {"loguniform": [1e-3, 1e-2]}})
    assert [p.split(":")[0] for p in problems] == ["tune.space.train.workers", "tune.space.train.cpus_per_worker",
                                                   "tune.space.model.params.depth"]


def test_grid_search_still_needs_discrete_values():
    assert _problems({"train.optimizer.lr": {"uniform": [0.1, 0.2]}}, search="grid") == [
        "tune.space.train.optimizer.lr: search grid needs discrete values (got uniform; allowed: grid, choice)"]


@pytest.mark.parametrize("dist, largest", [
    ({"choice": [2, 8, 4]}, 8),
    ({"grid": [1]}, 1),
    ({"randint": [1, 6]}, 6),  # inclusive, as rayline reads randint
    ({"uniform": [0.1, 0.5]}, 0.5),
    ({"loguniform": [1e-4, 1e-1]}, 1e-1),
])
def test_largest_value(dist, largest):
    assert largest_value(dist) == largest


def test_cli_validate_rejects_an_untunable_space(tmp_path):
    raw = _spec({"train.cpus_per_worker": {"choice": [1, 2]}, "train.workers": {"choice": [2, 0]}})
    raw["data"]["source"] = {"format": "sklearn", "name": "digits"}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(raw))
    proc = rayline_in_process("validate", path, cwd=ROOT, extra_env={"COLUMNS": "400"})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert "tune.space.train.cpus_per_worker: not tunable: resources are planned once for the whole sweep" in proc.stderr
    assert "tune.space.train.workers: choice can draw 0" in proc.stderr
