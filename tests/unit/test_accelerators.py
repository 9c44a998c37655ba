"""Accelerators and elastic workers: the spec keys, the plan, and the ScalingConfig Ray Train gets.

No Ray cluster: "hardware" is Ray's logical resources in the `available` mapping the
planner reads (GPU, accelerator_type:A100, memory, custom names), and the ScalingConfig
is the real Ray Train V2 class, built by the same function `train()` uses.
"""

import copy
from pathlib import Path

import pytest
import yaml

from rayline.errors import ResourceError, SpecError
from rayline.train.resources import plan_resources
from rayline.spec import parse_spec
from rayline.spec.pipeline_spec import TrainSpec, ray_accelerator_types
from tests.cli import rayline as rayline_in_process

ROOT = Path(__file__).resolve().parents[2]
BASE = yaml.safe_load((ROOT / "pipelines" / "digits-torch.yaml").read_text())


def _raw(train: dict | None = None, *, framework: str | None = None, tune: dict | None = None) -> dict:
    raw = copy.deepcopy(BASE)
    raw.pop("tune", None)
    raw["train"].update(train or {})
    if framework == "xgboost":
        raw["model"] = {"framework": "xgboost", "kind": "gbdt", "params": {"max_depth": 3}}
    elif framework == "tensorflow":
        raw["model"] = {"framework": "tensorflow", "kind": "mlp"}
    if tune is not None:
        raw["tune"] = tune
    return raw


def _problems(raw: dict) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_spec(raw)
    return info.value.problems


# ---------------------------------------------------------------- spec: train.workers


def test_elastic_workers_parse_and_report_their_bounds():
    spec = parse_spec(_raw({"workers": {"min": 2, "max": 8}}))
    assert spec.train.elastic and (spec.train.min_workers, spec.train.max_workers) == (2, 8)
    assert str(spec.train.workers) == "2-8"  # as progress lines show it
    fixed = parse_spec(_raw({"workers": 3})).train
    assert not fixed.elastic and (fixed.min_workers, fixed.max_workers) == (3, 3)


@pytest.mark.parametrize("workers, expected", [
    ({"min": 3, "max": 2}, "train.workers.max: must be >= min (got max=2, min=3; allowed: max >= 3)"),
    ({"min": 0, "max": 2}, "train.workers.min: Input should be greater than or equal to 1 (got 0)"),
    ({"min": 1}, "train.workers.max: required field is missing"),
    ({"min": 1, "max": 2, "step": 1}, "train.workers.step: unknown key (got 'step'; allowed: min, max)"),
    ({"min": 1, "max": 2000}, "train.workers.max: Input should be less than or equal to 1024 (got 2000)"),
    (0, "train.workers: Input should be greater than or equal to 1 (got 0)"),
    ("two", "train.workers: Input should be a valid integer, unable to parse string as an integer (got 'two')"),
])
def test_bad_workers_name_the_field(workers, expected):
    assert _problems(_raw({"workers": workers})) == [expected]


def test_elastic_workers_are_not_tuned_in_a_sweep():
    tune = {"num_samples": 2, "space": {"train.workers": {"choice": [1, 2]}}}
    assert _problems(_raw({"workers": {"min": 1, "max": 2}}, tune=tune)) == [
        "tune.space.train.workers: not tunable with elastic train.workers: {min, max} (Ray Train picks the count) "
        "(got {'choice': [1, 2]}; allowed: a whole number train.workers, or no train.workers in tune.space)"]
    # A sweep over something else keeps the elastic workers.
    spec = parse_spec(_raw({"workers": {"min": 1, "max": 2}}, tune={"num_samples": 2, "space": {"train.epochs": {"choice": [1, 2]}}}))
    assert spec.train.elastic


def test_a_sweep_draws_whole_worker_counts_not_ranges():
    tune = {"num_samples": 2, "space": {"train.workers": {"choice": [2, {"min": 1, "max": 4}]}}}
    (msg,) = _problems(_raw(tune=tune))
    assert msg.startswith("tune.space.train.workers: choice draws {'min': 1, 'max': 4}; a sweep draws whole worker counts")


def test_sweep_resources_are_planned_for_the_elastic_max():
    from rayline.tune.clock import max_workers

    spec = parse_spec(_raw({"workers": {"min": 1, "max": 6}}, tune={"num_samples": 2, "space": {"train.epochs": {"choice": [1, 2]}}}))
    assert max_workers(spec) == 6


@pytest.mark.parametrize("path", ["train.resources_per_worker", "train.accelerator_type", "train.tpu_topology",
                                  "train.resources_per_worker.CPU"])
def test_resource_keys_are_not_tunable(path):
    (msg,) = _problems(_raw(tune={"num_samples": 2, "space": {path: {"choice": [1, 2]}}}))
    assert msg.startswith(f"tune.space.{path}: not tunable: resources are planned once for the whole sweep")


# ---------------------------------------------------------------- spec: resources_per_worker


def test_resources_per_worker_takes_ray_resources_and_custom_ones():
    spec = parse_spec(_raw({"resources_per_worker": {"CPU": 2, "memory": 8e9, "my_custom": 1}}))
    assert spec.train.resources_per_worker == {"CPU": 2.0, "memory": 8e9, "my_custom": 1.0}


def test_every_bad_resource_is_reported_at_once():
    problems = _problems(_raw({"resources_per_worker": {
        "cpu": 1, "GPU": True, "x": -1, "y": float("inf"), "z": "2", "accelerator_type:A100": 1, "node:10.0.0.1": 1}}))
    assert problems == [
        "train.resources_per_worker.cpu: Ray resource names are case-sensitive (got 'cpu'; allowed: CPU, GPU, TPU, "
        "memory or a custom resource name); did you mean 'CPU'?",
        "train.resources_per_worker.GPU: must be a non-negative finite number (got true; allowed: e.g. 1, 0.5, 8e9 (memory in bytes))",
        "train.resources_per_worker.x: must be a non-negative finite number (got -1; allowed: e.g. 1, 0.5, 8e9 (memory in bytes))",
        "train.resources_per_worker.y: must be a non-negative finite number (got Infinity; allowed: e.g. 1, 0.5, 8e9 (memory in bytes))",
        "train.resources_per_worker.z: must be a non-negative finite number (got '2'; allowed: e.g. 1, 0.5, 8e9 (memory in bytes))",
        "train.resources_per_worker.accelerator_type:A100: set the accelerator with train.accelerator_type "
        "(got 'accelerator_type:A100'; allowed: accelerator_type: A100)",
        "train.resources_per_worker.node:10.0.0.1: not a resource a training worker can reserve (got 'node:10.0.0.1'; "
        "allowed: CPU, GPU, TPU, memory or a custom resource name)",
    ]


def test_cpus_are_given_once():
    assert _problems(_raw({"cpus_per_worker": 1, "resources_per_worker": {"CPU": 2}})) == [
        "train.cpus_per_worker: give CPUs once: cpus_per_worker or resources_per_worker.CPU "
        "(got cpus_per_worker: 1 and resources_per_worker.CPU: 2; allowed: one of them)"]
    # Without CPU in resources_per_worker, cpus_per_worker still sets it.
    plan = plan_resources(parse_spec(_raw({"cpus_per_worker": 0.5, "resources_per_worker": {"memory": 1e9}})).train,
                          {"CPU": 2.0, "memory": 8e9})
    assert plan.worker_resources() == {"CPU": 0.5, "memory": 1e9}


@pytest.mark.parametrize("train, expected", [
    ({"resources_per_worker": {"GPU": 1}},
     "train.resources_per_worker.GPU: GPUs per worker need use_gpu: true (got GPU: 1 with use_gpu: false; "
     "allowed: set use_gpu: true, or drop GPU)"),
    ({"use_gpu": True, "resources_per_worker": {"GPU": 0}},
     "train.resources_per_worker.GPU: use_gpu: true needs GPUs per worker (got GPU: 0; allowed: GPU > 0 (default 1), "
     "or use_gpu: false)"),
    ({"resources_per_worker": {"CPU": 0}},
     "train.resources_per_worker: a worker must reserve something (got {\"CPU\": 0.0}; allowed: some resource > 0, e.g. CPU: 1)"),
])
def test_gpu_resources_agree_with_use_gpu(train, expected):
    # Ray's own ScalingConfig raises these (ray/air/config.py); the spec says them first, with the path.
    assert _problems(_raw(train)) == [expected]


# ---------------------------------------------------------------- spec: accelerator_type, TPU


def test_accelerator_types_are_rays_own_list():
    from ray.util import accelerators

    known = ray_accelerator_types()
    assert {"A100", "H100", "L4", "TPU-V6E", "A100-80G"} <= set(known)
    assert accelerators.NVIDIA_H100 in known and accelerators.GOOGLE_TPU_V6E in known
    assert parse_spec(_raw({"use_gpu": True, "accelerator_type": "H100"})).train.accelerator_type == "H100"


def test_unknown_accelerator_type_lists_what_is_allowed():
    (msg,) = _problems(_raw({"use_gpu": True, "accelerator_type": "a100"}))
    assert msg.startswith("train.accelerator_type: unknown accelerator type (got 'a100'; allowed (Ray's ray.util.accelerators): A100, ")
    assert "H100" in msg and "TPU-V6E" in msg and msg.endswith("; did you mean 'A100'?")


@pytest.mark.parametrize("framework", ["torch", "tensorflow", "xgboost"])
def test_tpu_says_what_ray_train_supports(framework):
    (msg,) = _problems(_raw({"use_tpu": True, "workers": 1}, framework=framework))
    assert msg == (f"train.use_tpu: framework {framework} cannot train on TPU with Ray Train; Ray Train 2.60 trains on "
                   "TPUs only with JaxTrainer and TorchTrainer on torch_xla, which rayline's backends do not use "
                   "(got use_tpu: true; supported: cpu, gpu)")


@pytest.mark.parametrize("train, expected", [
    ({"accelerator_type": "TPU-V6E"},
     "train.accelerator_type: a TPU accelerator type needs use_tpu: true (got 'TPU-V6E'; allowed: use_tpu: true, "
     "or a GPU type (A100, H100, L4, ...))"),
    ({"tpu_topology": "2x2"}, "train.tpu_topology: only for TPU training (got '2x2'; allowed: use_tpu: true)"),
    ({"tpu_topology": "2by2"}, "train.tpu_topology: a TPU topology is chips per dimension (got '2by2'; allowed: e.g. 2x2, 2x4, 2x2x1, 2x2x4)"),
    ({"use_tpu": True, "accelerator_type": "TPU-V6E", "tpu_topology": "2x2x4"},
     "train.tpu_topology: not a topology of TPU-V6E (got '2x2x4'; allowed: 1x1, 2x2, 2x4, 2x8, 4x4, 4x8, 8x8, 8x16, 16x16)"),
    ({"use_tpu": True, "accelerator_type": "A100"},
     "train.accelerator_type: use_tpu: true needs a TPU accelerator type (got 'A100'; allowed: TPU-V2, TPU-V3, TPU-V4, "
     "TPU-V5LITEPOD, TPU-V5P, TPU-V6E, TPU-V7X)"),
])
def test_tpu_keys_are_checked_before_the_framework(train, expected):
    assert _problems(_raw(train)) == [expected]


def test_multi_host_tpu_needs_type_and_topology():
    # Ray Train's rule (ray/train/v2/api/config.py), for when a backend can train on TPU.
    train = TrainSpec(use_tpu=True, workers=4)
    assert str(train.tpu_problem()) == ("accelerator_type: multi-host TPU training needs accelerator_type and "
                                        "tpu_topology (got 4 workers, accelerator_type not set; allowed: e.g. "
                                        "accelerator_type: TPU-V6E, tpu_topology: 4x4)")
    assert TrainSpec(use_tpu=True, workers=4, accelerator_type="TPU-V6E", tpu_topology="4x4").tpu_problem() is None


def test_json_schema_documents_the_new_keys():
    from rayline.spec import spec_json_schema

    schema = spec_json_schema()
    train = schema["$defs"]["TrainSpec"]["properties"]
    for key in ("resources_per_worker", "accelerator_type", "tpu_topology"):
        assert train[key]["description"], key
    assert schema["$defs"]["WorkersRange"]["required"] == ["min", "max"]
    import jsonschema

    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(_raw({"workers": {"min": 1, "max": 2}, "resources_per_worker": {"CPU": 1, "my_custom": 1}}), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(_raw({"workers": {"min": 1, "max": 2, "x": 1}}), schema)


# ---------------------------------------------------------------- planner


def test_resources_per_worker_are_planned_and_checked():
    train = parse_spec(_raw({"use_gpu": True, "resources_per_worker": {"GPU": 0.5, "memory": 1e9, "my_custom": 1}})).train
    plan = plan_resources(train, {"CPU": 8.0, "GPU": 1.0, "memory": 8e9, "my_custom": 4.0}, wanted_concurrency=2)
    assert plan.worker_resources() == {"CPU": 1.0, "GPU": 0.5, "memory": 1e9, "my_custom": 1.0}
    assert plan.concurrent_trials == 1  # 2 workers x 0.5 GPU: one trial's worth of GPUs
    with pytest.raises(ResourceError, match=r"^train.resources_per_worker.my_custom: 2 workers x 1 my_custom need 2 "
                                            r"my_custom; the cluster has 1 available \(allowed: lower train.workers or "
                                            r"train.resources_per_worker.my_custom, or add nodes with my_custom\)$"):
        plan_resources(train, {"CPU": 8.0, "GPU": 1.0, "memory": 8e9, "my_custom": 1.0})
    with pytest.raises(ResourceError, match=r"^train.resources_per_worker.memory: 2 workers x 1e\+09 memory need 2e\+09 memory"):
        plan_resources(train, {"CPU": 8.0, "GPU": 1.0, "memory": 1e9, "my_custom": 4.0})


def test_fractional_gpus_per_worker():
    train = parse_spec(_raw({"use_gpu": True, "workers": 4, "resources_per_worker": {"GPU": 0.25}})).train
    assert plan_resources(train, {"CPU": 4.0, "GPU": 1.0}).gpus_per_worker == 0.25
    with pytest.raises(ResourceError, match=r"^train.resources_per_worker.GPU: 4 workers x 0.25 GPU need 1 GPU; the cluster has 0.5"):
        plan_resources(train, {"CPU": 4.0, "GPU": 0.5})


def test_explicit_cpus_in_resources_per_worker_are_named():
    train = parse_spec(_raw({"workers": 4, "resources_per_worker": {"CPU": 1}})).train
    with pytest.raises(ResourceError, match=r"^train.resources_per_worker.CPU: 4 workers x 1 CPUs need 4 CPUs; the cluster has 2"):
        plan_resources(train, {"CPU": 2.0})


def test_accelerator_type_missing_on_the_cluster_fails_naming_the_resource():
    train = parse_spec(_raw({"use_gpu": True, "accelerator_type": "A100"})).train
    with pytest.raises(ResourceError, match=r"^train.accelerator_type: no node of the cluster with accelerator type A100 "
                                            r"has room \(Ray resource 'accelerator_type:A100': 0 available; accelerator "
                                            r"types available: L4, T4\)"):
        plan_resources(train, {"CPU": 8.0, "GPU": 4.0, "accelerator_type:L4": 1.0, "accelerator_type:T4": 1.0})
    plan = plan_resources(train, {"CPU": 8.0, "GPU": 4.0, "accelerator_type:A100": 1.0})
    assert plan.accelerator_type == "A100" and plan.gpus_per_worker == 1


def test_elastic_plan_starts_with_the_most_workers_that_fit():
    # {min: 2, max: 8} with a whole CPU each on 4 CPUs: starts with 4, can grow to 8.
    train = parse_spec(_raw({"workers": {"min": 2, "max": 8}, "cpus_per_worker": 1})).train
    plan = plan_resources(train, {"CPU": 4.0})
    assert (plan.min_workers, plan.max_workers, plan.start_workers, plan.cpus_per_worker) == (2, 8, 4, 1.0)
    assert plan.elastic
    # All of max fits: sized for max.
    plan = plan_resources(parse_spec(_raw({"workers": {"min": 1, "max": 2}})).train, {"CPU": 2.0})
    assert (plan.start_workers, plan.cpus_per_worker) == (2, 1.0)


def test_elastic_min_that_does_not_fit_fails_naming_min():
    train = parse_spec(_raw({"workers": {"min": 3, "max": 8}, "cpus_per_worker": 1})).train
    with pytest.raises(ResourceError, match=r"^train.cpus_per_worker: 3 workers x 1 CPUs need 3 CPUs; the cluster has 2 "
                                            r"available \(allowed: lower train.workers.min or train.cpus_per_worker\)"):
        plan_resources(train, {"CPU": 2.0})
    gpus = parse_spec(_raw({"workers": {"min": 2, "max": 4}, "use_gpu": True})).train
    with pytest.raises(ResourceError, match=r"^train.use_gpu: 2 workers need 2 GPUs; the cluster has 1 available "
                                            r"\(allowed: lower train.workers.min"):
        plan_resources(gpus, {"CPU": 8.0, "GPU": 1.0})
    assert plan_resources(gpus, {"CPU": 8.0, "GPU": 3.0}).start_workers == 3


def test_elastic_cpu_shares_add_up_exactly():
    # Ray's elastic policy counts workers as (sum of per-worker bundles) // per-worker CPUs in
    # floating point: 3 x 0.66 = 1.98 and 1.98 // 0.66 == 2.0, one worker short of the plan.
    assert (0.66 + 0.66 + 0.66) // 0.66 == 2.0
    for high in range(1, 33):
        plan = plan_resources(TrainSpec(workers={"min": 1, "max": high}), {"CPU": 2.0})
        total = 0.0
        for _ in range(plan.start_workers):
            total += plan.cpus_per_worker
        assert total // plan.cpus_per_worker == plan.start_workers, (high, plan)
        assert plan.cpus_per_worker >= 0.1 and plan.start_workers * plan.cpus_per_worker <= 2.0


def test_fixed_plans_keep_their_shape():
    plan = plan_resources(TrainSpec(workers=2), {"CPU": 2.0}, wanted_concurrency=2)
    assert (plan.min_workers, plan.max_workers, plan.start_workers, plan.elastic) == (2, 2, 2, False)
    assert plan.worker_resources() == {"CPU": 0.5}


# ---------------------------------------------------------------- the ScalingConfig train() builds


def _scaling(train: dict, available: dict):
    from rayline.train.run import scaling_config

    spec = parse_spec(_raw(train))
    return scaling_config(spec, plan_resources(spec.train, available))


def test_scaling_config_for_elastic_workers_and_accelerators():
    from ray.train.v2.api.config import ScalingConfig

    sc = _scaling({"workers": {"min": 1, "max": 3}, "use_gpu": True, "accelerator_type": "A100",
                   "resources_per_worker": {"memory": 1e9, "my_custom": 1}},
                  {"CPU": 4.0, "GPU": 4.0, "memory": 8e9, "my_custom": 2.0, "accelerator_type:A100": 1.0})
    assert isinstance(sc, ScalingConfig)
    assert sc.num_workers == (1, 3) and sc.elasticity_enabled and (sc.min_workers, sc.max_workers) == (1, 3)
    assert sc.use_gpu and sc.accelerator_type == "A100" and not sc.use_tpu
    assert sc.resources_per_worker == {"CPU": 1.0, "GPU": 1.0, "memory": 1e9, "my_custom": 1.0}
    # What each worker's placement bundle asks Ray for: the accelerator's node resource too.
    assert sc._resources_per_worker_not_none["accelerator_type:A100"] == 0.001
    assert sc.total_resources["GPU"] == 3.0  # Ray's upper bound uses max_workers


def test_scaling_config_for_fixed_cpu_workers():
    sc = _scaling({"workers": 2}, {"CPU": 2.0})
    assert sc.num_workers == 2 and not sc.elasticity_enabled
    assert sc.resources_per_worker == {"CPU": 1.0} and sc.accelerator_type is None and not sc.use_gpu


# ---------------------------------------------------------------- the CLI


def test_cli_validate_reports_accelerator_problems_on_one_line_each(tmp_path):
    bad = tmp_path / "bad.yaml"
    raw = _raw({"workers": {"min": 4, "max": 2}, "resources_per_worker": {"gpu": 1}, "accelerator_type": "B9000"})
    raw["data"]["source"] = {"format": "sklearn", "name": "digits"}
    bad.write_text(yaml.safe_dump(raw))
    proc = rayline_in_process("validate", bad, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    text = proc.stdout + proc.stderr
    assert "train.workers.max: must be >= min (got max=2, min=4; allowed: max >= 4)" in text
    assert "train.resources_per_worker.gpu: Ray resource names are case-sensitive" in text
    assert "train.accelerator_type: unknown accelerator type (got 'B9000'; allowed (Ray's ray.util.accelerators): A100" in text


def test_placement_message_for_elastic_workers_names_what_they_wait_for(monkeypatch):
    # Without a running Ray the message leaves out what is available; the asked-for part is whole.
    from rayline.train.run import START_TIMEOUT_ENV, _placement_message

    monkeypatch.delenv(START_TIMEOUT_ENV, raising=False)

    spec = parse_spec(_raw({"workers": {"min": 1, "max": 4}, "use_gpu": True, "accelerator_type": "L4"}))
    plan = plan_resources(spec.train, {"CPU": 4.0, "GPU": 2.0, "accelerator_type:L4": 1.0})
    assert plan.start_workers == 2
    msg = _placement_message(spec.train.workers, plan)
    assert msg.startswith("train.workers: the 2 training workers (1 CPU + 1 GPU + 0.001 accelerator_type:L4 each) "
                          "could not be placed: waited 2 x 60 s for 2 CPU, 2 GPU, 0.002 accelerator_type:L4;"), msg
