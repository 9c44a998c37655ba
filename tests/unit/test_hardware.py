"""What a run says it trains on (rayline/train/hardware.py): the plan line, built from the planner's
real ResourcePlan over Ray's logical resources (GPUs mocked as resources, as in test_accelerators),
and the summary's line, built from the workers' start records.

The same lines ran on a lent H200 (benchmarks/README.md): the plan line read '1 workers x 1 CPU + 1 GPU
(H200), 8 epochs, one process, bf16' and the summary 'trained on: 1 worker x NVIDIA H200 (cuda), one
process, bf16'.
"""

import copy
from pathlib import Path

import pytest
import yaml

from rayline.pipeline.training import technique_text
from rayline.train.resources import plan_resources
from rayline.spec import parse_spec
from rayline.train.hardware import (cluster_accelerators, plan_text, spec_strategy_text, strategy_text, trained_on,
                                    worker_device)

ROOT = Path(__file__).resolve().parents[2]
BASE = yaml.safe_load((ROOT / "pipelines" / "digits-torch.yaml").read_text())


def _spec(train: dict | None = None, model: dict | None = None):
    raw = copy.deepcopy(BASE)
    raw.pop("tune", None)
    raw["train"].update(train or {})
    if model is not None:
        raw["model"] = model
    return parse_spec(raw)


GPU_NODE = {"CPU": 16.0, "GPU": 2.0, "memory": 64e9, "accelerator_type:H100": 1.0}


def test_the_plan_line_names_the_gpu_and_the_cluster_accelerator_type():
    spec = _spec({"workers": 2, "use_gpu": True})
    plan = plan_resources(spec.train, GPU_NODE)
    assert plan_text(plan, cluster_accelerators(GPU_NODE)) == "2 workers x 1 CPU + 1 GPU (H100)"
    # Mixed GPU nodes: both named; a CPU-only plan names none, even on a GPU cluster.
    assert plan_text(plan, ("A100", "H100")) == "2 workers x 1 CPU + 1 GPU (A100 or H100)"
    cpu = plan_resources(_spec({"workers": 2}).train, GPU_NODE)
    assert plan_text(cpu, cluster_accelerators(GPU_NODE)).startswith("2 workers x ")
    assert "GPU" not in plan_text(cpu, cluster_accelerators(GPU_NODE)) and "H100" not in plan_text(cpu, ("H100",))


def test_train_accelerator_type_wins_over_what_the_cluster_has():
    spec = _spec({"workers": 1, "use_gpu": True, "accelerator_type": "A100"})
    plan = plan_resources(spec.train, {"CPU": 8.0, "GPU": 1.0, "accelerator_type:A100": 1.0})
    assert plan_text(plan, ("A100", "L4")) == "1 workers x 1 CPU + 1 GPU (A100)"


@pytest.mark.parametrize("framework, workers, kwargs, expected", [
    ("torch", 2, {}, "DDP, fp32"),
    ("torch", 2, {"strategy": "fsdp", "precision": "bf16"}, "FSDP (sharded), bf16"),
    ("torch", 1, {"strategy": "fsdp"}, "one process, fp32"),  # one worker has nothing to shard
    ("tensorflow", 3, {"precision": "fp16"}, "MultiWorkerMirroredStrategy, fp16"),
    ("tensorflow", 1, {"gpus_per_worker": 4}, "MirroredStrategy, fp32"),
    ("tensorflow", 1, {}, "one replica, fp32"),
    ("xgboost", 2, {"gpus_per_worker": 1}, "xgboost collective, device cuda"),
    ("xgboost", 1, {}, "one booster, device cpu"),
])
def test_strategy_text_names_how_workers_train_together(framework, workers, kwargs, expected):
    assert strategy_text(framework, workers, **kwargs) == expected


def test_the_start_line_always_names_strategy_and_precision():
    spec = _spec({"workers": 2, "use_gpu": True, "precision": "bf16", "grad_accumulation": 2})
    plan = plan_resources(spec.train, GPU_NODE)
    assert technique_text(spec, plan) == (", DDP, bf16, effective batch "
                                          f"{spec.train.effective_batch_size} ({spec.train.batch_size} x 2 micro-batches)")
    xgb = _spec({"workers": 2, "use_gpu": True}, {"framework": "xgboost", "kind": "gbdt", "params": {"max_depth": 3}})
    assert spec_strategy_text(xgb, 2) == "xgboost collective, device cuda"


def test_trained_on_reads_the_latest_start_record():
    starts = [
        {"epoch": -1, "workers": 2, "device": {"type": "cpu", "name": "cpu", "count": 1, "threads": 1},
         "strategy": "DDP, fp32"},
        {"epoch": 3, "workers": 1, "device": {"type": "cuda", "name": "NVIDIA H200", "count": 1},
         "strategy": "one process, bf16"},
    ]
    assert trained_on(starts) == "1 worker x NVIDIA H200 (cuda), one process, bf16"
    assert trained_on(starts[:1]) == "2 workers x cpu (1 thread), DDP, fp32"
    four = {"workers": 1, "device": {"type": "cuda", "name": "NVIDIA A100", "count": 4}, "strategy": "MirroredStrategy, fp32"}
    assert trained_on([four]) == "1 worker x 4 x NVIDIA A100 (cuda), MirroredStrategy, fp32"
    assert trained_on([{"epoch": -1, "source": None}]) is None  # a run recorded before workers said
    assert trained_on([]) is None


def test_a_torch_worker_on_the_cpu_says_its_threads():
    import torch

    assert worker_device(torch.device("cpu")) == {"type": "cpu", "name": "cpu", "count": 1,
                                                  "threads": torch.get_num_threads()}


@pytest.mark.parametrize("use_gpu, device", [(True, "cuda"), (False, "cpu")])
def test_xgboost_boosts_on_the_gpu_it_reserved(use_gpu, device):
    """train.use_gpu reserved a GPU per worker; xgboost must also be told to use it (device=cuda)."""
    from rayline.train.xgboost_backend import _settings

    config = {"arch": {"model": {"params": {"max_depth": 3}}, "num_outputs": 2}, "epochs": 5,
              "task": "classification", "threads": 2, "seed": 0, "use_gpu": use_gpu}
    params = _settings(config)[0]
    assert params["device"] == device
