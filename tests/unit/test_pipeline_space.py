"""Whole-pipeline search spaces: preprocessing paths and model families, checked at validate."""


import pytest

from rayline.errors import SpecError
from rayline.spec import apply_overrides, parse_set_options, parse_spec
from rayline.spec.pipeline_space import MAX_DATA_VARIANTS, PipelineSpace
from tests.cli import rayline as rayline_in_process

TORCH = {"framework": "torch", "kind": "mlp", "params": {"hidden_sizes": {"choice": [[16], [32, 16]]}}}
XGB = {"framework": "xgboost", "kind": "gbdt", "params": {"max_depth": {"randint": [2, 5]}, "num_boost_round": 20}}


def _raw(space, search="random", model=True, **tune):
    return {
        "name": "bc",
        **({"model": {"framework": "torch", "kind": "mlp"}} if model else {}),
        "data": {"source": {"format": "sklearn", "name": "breast_cancer"}, "label": "target",
                 "preprocess": [{"impute": {"columns": "numeric", "strategy": "mean"}},
                                {"standard_scale": {"columns": "numeric"}}]},
        "train": {"epochs": 2},
        "tune": {"search": search, "space": space, **tune},
    }


def _problems(space, **kw):
    with pytest.raises(SpecError) as info:
        parse_spec(_raw(space, **kw))
    return info.value.problems


def test_model_may_be_left_out_when_the_space_chooses_families():
    spec = parse_spec(_raw({"model": {"choice": [XGB, TORCH]}}, model=False))
    assert (spec.model.framework, spec.model.kind, spec.model.params) == ("xgboost", "gbdt", {"num_boost_round": 20})
    spec = parse_spec(_raw({"model": {"choice": [TORCH, XGB]}}, model=False))
    assert (spec.model.framework, spec.model.kind, spec.model.params) == ("torch", "mlp", {})


def test_random_search_draws_a_family_and_only_its_own_sub_space_applies():
    spec = parse_spec(_raw({"model": {"choice": [TORCH, XGB]}, "train.optimizer.lr": {"loguniform": [1e-3, 1e-1]}}))
    space = PipelineSpace(spec)
    assert space.flat() == {
        "train.optimizer.lr": {"loguniform": [1e-3, 1e-1]},
        "model": {"choice": [0, 1]},
        "model[0].params.hidden_sizes": {"choice": [[16], [32, 16]]},
        "model[1].params.max_depth": {"randint": [2, 5]},
    }
    config = {"model": 1, "model[0].params.hidden_sizes": [16], "model[1].params.max_depth": 4, "train.optimizer.lr": 0.01}
    overrides = space.overrides(config)
    assert overrides == {"model": {"framework": "xgboost", "kind": "gbdt", "params": {"num_boost_round": 20}},
                         "model.params.max_depth": 4, "train.optimizer.lr": 0.01}
    trial = apply_overrides(spec, overrides)
    assert trial.model.framework == "xgboost" and trial.model.params == {"num_boost_round": 20, "max_depth": 4}


def test_grid_search_lists_each_family_with_its_own_grid_and_no_repeats():
    torch = {**TORCH, "params": {"hidden_sizes": {"grid": [[16], [32]]}}}
    xgb = {"framework": "xgboost", "kind": "gbdt", "params": {"max_depth": {"grid": [2, 3, 4]}}}
    spec = parse_spec(_raw({"model": {"grid": [torch, xgb]}}, search="grid"))
    space = PipelineSpace(spec)
    assert space.flat() == {"model": {"grid": list(range(5))}}  # 2 torch + 3 xgboost, not 2 x 3 x 2
    drawn = [apply_overrides(spec, space.overrides({"model": i})).model for i in range(5)]
    assert [(m.framework, m.params) for m in drawn] == [
        ("torch", {"hidden_sizes": [16]}), ("torch", {"hidden_sizes": [32]}),
        ("xgboost", {"max_depth": 2}), ("xgboost", {"max_depth": 3}), ("xgboost", {"max_depth": 4})]


def test_preprocessing_paths_become_variants_each_a_valid_spec():
    spec = parse_spec(_raw({
        "data.preprocess[0].impute.strategy": {"grid": ["mean", "median"]},
        "data.preprocess[1]": {"choice": [{"standard_scale": {"columns": "numeric"}}, {"min_max_scale": {"columns": "numeric"}}]},
    }))
    space = PipelineSpace(spec)
    variants = space.variants()
    assert len(variants) == 4 and space.flat() == {"data": {"choice": [0, 1, 2, 3]}}
    steps = [apply_overrides(spec, v).data.preprocess for v in variants]
    kinds = {(s[0].impute.strategy, type(s[1]).__name__) for s in steps}
    assert len(kinds) == 4, kinds
    assert space.overrides({"data": 3}) == variants[3]


@pytest.mark.parametrize("space, expected", [
    ({"data.preprocess[0].impute.strategy": {"grid": ["mean", "bogus"]}},
     "tune.space.data.preprocess[0].impute.strategy: grid value 'bogus' makes an invalid spec: "
     "data.preprocess[0].impute.strategy: "),
    ({"data.preprocess[5].impute.strategy": {"choice": ["mean"]}},
     "tune.space.data.preprocess[5].impute.strategy: choice value 'mean' makes an invalid spec: "
     "data.preprocess[5].impute.strategy: data.preprocess has no item [5] (got 2 items; allowed: [0] to [1])"),
    ({"data.preprocess[0].impute.strategy": {"uniform": [0, 1]}},
     "tune.space.data.preprocess[0].impute.strategy: preprocessing takes discrete values: the data stage runs once "
     "per distinct preprocessing before the trials (got uniform; allowed: choice, grid)"),
    ({"data.preprocess[0].impute.stratgy": {"choice": ["mean"]}},
     "tune.space.data.preprocess[0].impute.stratgy: choice value 'mean' makes an invalid spec: "),
    ({"model": {"choice": [TORCH, {**XGB, "kind": "mlp"}]}},
     "tune.space.model.choice[1].kind: unknown model kind for xgboost (got 'mlp'; allowed: gbdt)"),
    ({"model": {"choice": [TORCH, {**XGB, "params": {"depth": 3}}]}},
     "tune.space.model.choice[1].params.depth: unknown parameter for xgboost gbdt (got 'depth'; allowed: "),
    ({"model": {"choice": [TORCH]}}, "tune.space.model.choice: needs at least two model families (got "),
    ({"model": {"choice": [TORCH, TORCH]}}, "tune.space.model.choice[1]: the same model family twice"),
    ({"model": {"uniform": [0, 1]}}, "tune.space.model: a choice of model families"),
    ({"model": {"choice": [TORCH, {**XGB, "params": {"max_depth": {"uniform": [5, 2]}}}]}},
     "tune.space.model.choice[1].params.max_depth.uniform: needs [low, high] with low < high (got [5, 2])"),
    ({"model": {"choice": [TORCH, XGB]}, "model.params.dropout": {"choice": [0.1]}},
     "tune.space.model.params.dropout: with a choice of model families, tune a family's parameters inside its own params"),
])
def test_bad_pipeline_spaces_name_the_path_the_value_and_what_is_allowed(space, expected):
    problems = _problems(space)
    assert any(p.startswith(expected) for p in problems), problems


def test_grid_search_needs_discrete_family_sub_spaces():
    problems = _problems({"model": {"grid": [TORCH, XGB]}}, search="grid")
    assert "tune.space.model.grid[1].params.max_depth: search grid needs discrete values (got randint; allowed: grid, choice)" in problems


def test_too_many_preprocessing_variants_are_refused():
    space = {"data.preprocess[0].impute.strategy": {"choice": ["mean", "median"]},
             "data.preprocess[1]": {"choice": [{"standard_scale": {"columns": "numeric"}}] * 9}}
    problems = _problems(space)
    assert problems == [f"tune.space: too many preprocessing configurations: each is a data stage run before the trials "
                        f"(got 18 combinations; allowed: at most {MAX_DATA_VARIANTS})"], problems


def test_set_reaches_list_items_as_messages_write_them():
    spec = parse_spec(_raw({"train.epochs": {"choice": [1, 2]}}))
    changed = apply_overrides(spec, parse_set_options(["data.preprocess[0].impute.strategy=median"]))
    assert changed.data.preprocess[0].impute.strategy == "median"
    with pytest.raises(SpecError) as info:
        apply_overrides(spec, {"data.preprocess[7].impute.strategy": "median"})
    assert "data.preprocess has no item [7]" in str(info.value)


def test_the_example_pipeline_search_validates_and_names_both_families():
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "pipelines" / "search" / "breast-cancer-pipeline-search.yaml"
    proc = rayline_in_process("validate", path)
    assert proc.returncode == 0, proc.stderr
    assert "breast-cancer-search (torch/mlp or xgboost/gbdt, tune 8 trials" in proc.stdout


def test_the_pbt_example_validates():
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "pipelines" / "search" / "digits-pbt.yaml"
    proc = rayline_in_process("validate", path)
    assert proc.returncode == 0, proc.stderr
    assert "digits-pbt (torch, tune 4 trials" in proc.stdout
