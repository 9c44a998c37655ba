"""Spec validation: good specs load; each bad spec names the path, the bad value and what is allowed."""

import copy
from pathlib import Path

import pytest
import yaml

from rayline.errors import SpecError
from rayline.spec import apply_overrides, load_spec, parse_spec, spec_json_schema
from tests.cli import rayline as rayline_in_process

ROOT = Path(__file__).resolve().parents[2]
PIPELINES = sorted((ROOT / "pipelines").glob("*.yaml"))
BASE = yaml.safe_load((ROOT / "pipelines" / "digits-torch.yaml").read_text())


@pytest.mark.parametrize("path", PIPELINES, ids=lambda p: p.name)
def test_reference_pipelines_validate(path):
    spec = load_spec(path)
    assert spec.name == yaml.safe_load(path.read_text())["name"]


def _mutated(change):
    raw = copy.deepcopy(BASE)
    change(raw)
    return raw


BAD_SPECS = {
    "unknown top-level key": (lambda d: d.update(nmae="x"), ["nmae: unknown key (got 'nmae'; allowed: name, data,", "did you mean 'name'?"]),
    "misspelt train key": (lambda d: d["train"].update(epocs=3), ["train.epocs: unknown key", "did you mean 'epochs'?"]),
    "unknown framework": (lambda d: d["model"].update(framework="jax"), ["model.framework:", "(got 'jax')", "'torch', 'tensorflow' or 'xgboost'"]),
    "retired framework": (lambda d: d["model"].update(framework="mxnet"),
                          ["model.framework: Apache MXNet was retired to the Apache Attic in 2023", "port the model to torch",
                           "(got 'mxnet'; allowed: torch, tensorflow, xgboost)"]),
    "unmaintained framework": (lambda d: d["model"].update(framework="CNTK"),
                               ["model.framework: Microsoft CNTK has not been developed since 2019", "(got 'CNTK';"]),
    "horovod as a framework": (lambda d: d["model"].update(framework="horovod"),
                               ["model.framework: Horovod is a way to distribute training, not a framework",
                                "ring all-reduce already: torch DDP", "(got 'horovod'; allowed: torch, tensorflow, xgboost)"]),
    "parameter servers": (lambda d: d["train"].update(strategy="parameter_server"),
                          ["train.strategy: a parameter server: rayline trains with ring all-reduce already",
                           "no parameter servers (got 'parameter_server'; allowed: ddp, fsdp)"]),
    "zero workers": (lambda d: d["train"].update(workers=0), ["train.workers:", "greater than or equal to 1", "(got 0)"]),
    "negative lr": (lambda d: d["train"]["optimizer"].update(lr=-1), ["train.optimizer.lr:", "greater than 0", "(got -1)"]),
    "bad name": (lambda d: d.update(name="Digits_1"), ["name: lowercase letters", "(got 'Digits_1'"]),
    "unknown sklearn set": (lambda d: d["data"]["source"].update(name="mnist"), ["data.source.name: unknown sklearn dataset (got 'mnist'; allowed: iris, digits"]),
    "space path typo": (lambda d: d["tune"]["space"].update({"train.optimizer.lrr": {"uniform": [0.1, 0.2]}}),
                        ["tune.space.train.optimizer.lrr: no field 'lrr' in train.optimizer", "did you mean 'train.optimizer.lr'?"]),
    "space unknown model param": (lambda d: d["tune"]["space"].update({"model.params.depth": {"choice": [1, 2]}}),
                                  ["tune.space.model.params.depth: no such parameter for torch mlp (got 'depth'; allowed: model.params.dropout, model.params.hidden_sizes)"]),
    "unknown distribution": (lambda d: d["tune"]["space"].update({"train.epochs": {"normal": [1, 2]}}),
                             ["tune.space.train.epochs: a distribution is one of", "(got {'normal': [1, 2]}; allowed: loguniform, uniform, randint, choice, grid)"]),
    "loguniform from zero": (lambda d: d["tune"]["space"].update({"train.optimizer.lr": {"loguniform": [0, 1]}}),
                             ["tune.space.train.optimizer.lr.loguniform: needs [low, high] with low < high and low > 0 (got [0, 1])"]),
    "route without slash": (lambda d: d["serve"].update(route="digits"), ["serve.route: must start with '/'", "(got 'digits'"]),
    "replicas min > max": (lambda d: d["serve"]["replicas"].update(min=3, max=2), ["serve.replicas.max: must be >= min (got max=2, min=3)"]),
    "unknown preprocessing step": (lambda d: d["data"]["preprocess"].append({"normalize": {"columns": "numeric"}}),
                                   ["data.preprocess[1]: unknown preprocessing step (got 'normalize'; allowed: impute, one_hot, standard_scale, min_max_scale, image, text)"]),
    "bad impute strategy": (lambda d: d["data"]["preprocess"].append({"impute": {"columns": ["a"], "strategy": "avg"}}),
                            ["data.preprocess[1].impute.strategy:", "(got 'avg')", "'mean', 'median', 'most_frequent' or 'constant'"]),
    "misspelt one_hot key": (lambda d: d["data"]["preprocess"].append({"one_hot": {"columns": ["a"], "unknown": "x"}}),
                             ["data.preprocess[1].one_hot.unknown: unknown key (got 'unknown'; allowed: columns, handle_unknown)"]),
    "regression metric on classification": (lambda d: d["train"].update(metric="rmse"),
                                            ["train.metric: unknown metric for classification (got 'rmse'; allowed: loss, accuracy"]),
    "split leaves nothing": (lambda d: d["data"]["split"].update(valid=0.6, test=0.4), ["data.split: valid + test: leaves too little to train on"]),
    "unknown model kind": (lambda d: d["model"].update(kind="resnet"), ["model.kind: unknown model kind for torch (got 'resnet'; allowed: cnn, mlp, text_cnn, transformer)"]),
    "unknown model param": (lambda d: d["model"]["params"].update(hidden=[3]), ["model.params.hidden: unknown parameter for torch mlp (got 'hidden'; allowed: dropout, hidden_sizes)"]),
    "tensorflow on tpu": (lambda d: (d["model"].update(framework="tensorflow"), d["train"].update(use_tpu=True)),
                          ["train.use_tpu: framework tensorflow cannot train on TPU with Ray Train", "supported: cpu, gpu"]),
    "wrong type": (lambda d: d["train"].update(epochs="ten"), ["train.epochs:", "valid integer", "(got 'ten')"]),
    "space names a section": (lambda d: d["tune"]["space"].update({"train.optimizer": {"choice": [1]}}), ["tune.space.train.optimizer: names a section, not a value"]),
    "missing label": (lambda d: d["data"].pop("label"), ["data.label: required field is missing"]),
    "xgboost external_memory value": (lambda d: d["model"].update({"framework": "xgboost", "kind": "gbdt",
                                                                    "params": {"external_memory": "yes"}}),
                                      ["model.params.external_memory: not a value xgboost gbdt takes (got 'yes'; "
                                       "allowed: auto, always, never)"]),
    "xgboost with import": (lambda d: d["model"].update({"framework": "xgboost", "kind": None, "import": "x:y"}) or d["model"].pop("kind") or d["model"].pop("params"),
                            ["model.import: not supported for framework xgboost"]),
}


@pytest.mark.parametrize("case", sorted(BAD_SPECS))
def test_bad_spec_error_names_path_value_and_allowed(case):
    change, expected = BAD_SPECS[case]
    with pytest.raises(SpecError) as info:
        parse_spec(_mutated(change))
    text = "\n".join(info.value.problems)
    for fragment in expected:
        assert fragment in text, f"{fragment!r} not in {text!r}"
    assert len(info.value.problems) == 1, info.value.problems  # one problem, one message: no union noise


def test_several_problems_reported_together():
    raw = _mutated(lambda d: (d["train"].update(workers=0, epocs=1), d["serve"].update(route="x")))
    with pytest.raises(SpecError) as info:
        parse_spec(raw)
    paths = sorted(p.split(":")[0] for p in info.value.problems)
    assert paths == ["serve.route", "train.epocs", "train.workers"]


def _csv_spec(tmp_path, **changes):
    (tmp_path / "data.csv").write_text("age,plan,churn\n30,basic,no\n41,pro,yes\n,basic,no\n")
    raw = {"name": "churn", "data": {"source": {"format": "csv", "path": "data.csv"}, "label": "churn",
                                      "preprocess": [{"one_hot": {"columns": ["plan"]}}, {"impute": {"columns": ["age"]}}]},
           "model": {"framework": "torch", "kind": "mlp"}}
    for key, value in changes.items():
        node = raw
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_relative_data_path_resolves_against_spec_folder(tmp_path, monkeypatch):
    monkeypatch.chdir("/")
    spec = load_spec(_csv_spec(tmp_path))
    assert spec.data.source.path == str(tmp_path / "data.csv")


@pytest.mark.parametrize("changes, expected", [
    ({"data.source": {"format": "csv", "path": "nope.csv"}}, "data.source.path: no such file or directory (got '"),
    ({"data.label": "churned"}, "data.label: no such column in the data (got 'churned'; allowed: age, plan, churn)"),
    ({"data.features": ["age", "plann"]}, "data.features[1]: no such column in the data (got 'plann'; allowed: age, plan, churn)"),
    ({"data.preprocess": []}, "data.features: string columns ['plan'] need encoding"),
    ({"data.preprocess": [{"one_hot": {"columns": ["plan"]}}, {"standard_scale": {"columns": ["age", "plan"]}}]},
     "data.preprocess[1].standard_scale.columns[1]: column 'plan' was one-hot encoded by data.preprocess[0], so no later step can use it"),
    ({"data.preprocess": [{"standard_scale": {"columns": ["plan"]}}, {"one_hot": {"columns": ["plan"]}}]},
     "data.preprocess[0].standard_scale.columns[0]: needs a numeric column, and 'plan' is one-hot encoded by data.preprocess[1]"),
])
def test_spec_checked_against_its_data(tmp_path, changes, expected):
    with pytest.raises(SpecError) as info:
        load_spec(_csv_spec(tmp_path, **changes))
    assert any(expected in p for p in info.value.problems), info.value.problems


def test_apply_overrides_sets_paths_and_revalidates():
    spec = parse_spec(copy.deepcopy(BASE))
    tuned = apply_overrides(spec, {"train.optimizer.lr": 0.05, "model.params.hidden_sizes": [8]})
    assert tuned.train.optimizer.lr == 0.05 and tuned.model.params["hidden_sizes"] == [8]
    assert spec.train.optimizer.lr == BASE["train"]["optimizer"]["lr"]  # the original is untouched
    with pytest.raises(SpecError, match="train.workers"):
        apply_overrides(spec, {"train.workers": 0})


def test_set_options_override_the_file_and_are_validated():
    from rayline.spec import parse_set_options

    path = ROOT / "pipelines" / "digits-torch.yaml"
    overrides = parse_set_options(["train.epochs=2", "model.params.hidden_sizes=[8, 4]", "tune.num_samples = 3"])
    assert overrides == {"train.epochs": 2, "model.params.hidden_sizes": [8, 4], "tune.num_samples": 3}
    spec = load_spec(path, check_data=False, overrides=overrides)
    assert spec.train.epochs == 2 and spec.model.params["hidden_sizes"] == [8, 4] and spec.tune.num_samples == 3
    with pytest.raises(SpecError, match=r"--set: expected PATH=VALUE"):
        parse_set_options(["train.epochs"])
    with pytest.raises(SpecError, match=r"train.epochs.*greater than or equal to 1"):
        load_spec(path, check_data=False, overrides={"train.epochs": 0})
    with pytest.raises(SpecError, match=r"train.epochs.max: train.epochs is not a mapping, so it has no key .max. \(got 8\)"):
        load_spec(path, check_data=False, overrides={"train.epochs.max": 3})
    with pytest.raises(SpecError, match=r"train.epocs: unknown key"):
        load_spec(path, check_data=False, overrides={"train.epocs": 3})


def test_json_schema_is_closed_and_documents_keys():
    schema = spec_json_schema()
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) == {"name", "data", "model"}
    train = schema["$defs"]["TrainSpec"]["properties"]
    # train.workers: a count, or an elastic {min, max} (its own closed object)
    count, elastic = train["workers"]["oneOf"]
    assert "description" in train["workers"] and count["minimum"] == 1 and count["type"] == "integer"
    assert elastic == {"$ref": "#/$defs/WorkersRange"} and schema["$defs"]["WorkersRange"]["additionalProperties"] is False


def _cli(*args, cwd=ROOT):
    return rayline_in_process(*args, cwd=cwd)


def test_cli_validate_bad_spec_exits_2_without_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(_mutated(lambda d: d["train"].update(epocs=3))))
    proc = _cli("validate", str(bad))
    assert proc.returncode == 2
    assert "train.epocs: unknown key" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def test_cli_validate_good_specs_and_malformed_yaml(tmp_path):
    ok = _cli("validate", *map(str, PIPELINES))
    assert ok.returncode == 0, ok.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: x\ndata: [\n")
    proc = _cli("validate", str(broken))
    assert proc.returncode == 2 and "(yaml): line" in proc.stderr and "Traceback" not in proc.stderr


def test_public_names_are_complete_and_importable():
    import types

    import rayline.spec as spec_pkg

    # Every name in __all__ exists, and everything public but the submodules is in __all__.
    exposed = {n for n in dir(spec_pkg) if not n.startswith("_") and not isinstance(getattr(spec_pkg, n), types.ModuleType)}
    assert exposed == set(spec_pkg.__all__), exposed ^ set(spec_pkg.__all__)


def test_problems_carry_their_parts():
    from rayline.spec import Problem

    with pytest.raises(SpecError) as info:
        parse_spec(_mutated(lambda d: (d["train"].update(epocs=3), d["serve"]["replicas"].update(min=3, max=2))))
    assert info.value.details == [
        Problem(("train", "epocs"), "unknown key", got="'epocs'",
                allowed="workers, use_gpu, use_tpu, cpus_per_worker, resources_per_worker, accelerator_type, tpu_topology, "
                        "epochs, batch_size, optimizer, metric, max_failures, in_process, precision, grad_accumulation, strategy, grad_compression, in_memory",
                hint="epochs"),
        Problem(("serve", "replicas", "max"), "must be >= min", got="max=2, min=3"),
    ]
    assert isinstance(info.value.__cause__, __import__("pydantic").ValidationError)  # the cause is kept
    assert SpecError(["a: plain text"], "x.yaml").problems == ["a: plain text"]  # strings still work


@pytest.mark.parametrize("step, expected", [
    ({"impute": {"columns": 5}}, "data.preprocess[1].impute.columns: Input should be a valid list or 'numeric' (got 5)"),
    ({"impute": {"columns": [5]}}, "data.preprocess[1].impute.columns[0]: Input should be a valid string (got 5)"),
    ({"impute": {"columns": ["a"], "strategy": "constant", "value": [1]}},
     "data.preprocess[1].impute.value: Input should be a valid boolean, a valid integer, a valid number or a valid string (got [1])"),
])
def test_a_union_field_gives_one_line(step, expected):
    with pytest.raises(SpecError) as info:
        parse_spec(_mutated(lambda d: d["data"]["preprocess"].append(step)))
    assert info.value.problems == [expected]


@pytest.mark.parametrize("key, shown", [("a: b", "['a: b']"), ("a\nb", "['a\\nb']"), ("", "['']"), (" x", "[' x']")])
def test_odd_keys_are_quoted_so_every_problem_is_one_line(key, shown):
    with pytest.raises(SpecError) as info:
        parse_spec(_mutated(lambda d: d["train"].update({key: 1})))
    assert info.value.problems == [f"train{shown}: unknown key (got {key!r}; allowed: workers, use_gpu, use_tpu, "
                                   f"cpus_per_worker, resources_per_worker, accelerator_type, tpu_topology, "
                                   f"epochs, batch_size, optimizer, metric, max_failures, in_process, precision, grad_accumulation, strategy, grad_compression, in_memory)"]
