"""The pipeline spec's pydantic models: the public contract users write in YAML.

Every model forbids unknown keys. Validators raise `SpecProblem` with the parts of the
message (path relative to the model, what, got, allowed); problems.py renders them.

One module per section (`data_spec`, `train_spec`, `tune_spec`, `serve_spec`; what they share in
`common`); `PipelineSpec`, the whole spec, is here, with every section's public names.
"""

from __future__ import annotations

import re
from typing import Literal, Optional

from pydantic import Field, field_validator, model_validator

from rayline.frameworks import BACKENDS
from rayline.spec.common import CLASSIFICATION_METRICS, REGRESSION_METRICS, SKLEARN_DATASETS, Strict, metric_mode
from rayline.spec.data_spec import DataSpec, PREPROCESS_KINDS, PreprocessStep, SourceSpec, SplitSpec
from rayline.spec.problems import SpecProblem, problem
from rayline.spec.retrain_spec import RetrainCanarySpec, RetrainCompareSpec, RetrainSpec
from rayline.spec.serve_spec import AuthSpec, BatchingSpec, MonitoringSpec, ReplicasSpec, ResourcesSpec, ServeSpec
from rayline.spec.space import check_space
from rayline.spec.train_spec import ModelSpec, OptimizerSpec, TrainSpec, WorkersRange, ray_accelerator_types
from rayline.spec.tune_spec import TuneSpec
from rayline.tune.schedulers import check_scheduler

__all__ = [
    "PipelineSpec",
    "DataSpec",
    "SourceSpec",
    "SplitSpec",
    "ModelSpec",
    "OptimizerSpec",
    "TrainSpec",
    "WorkersRange",
    "ray_accelerator_types",
    "TuneSpec",
    "ServeSpec",
    "ReplicasSpec",
    "ResourcesSpec",
    "BatchingSpec",
    "MonitoringSpec",
    "AuthSpec",
    "RetrainSpec",
    "RetrainCompareSpec",
    "RetrainCanarySpec",
    "PreprocessStep",
    "PREPROCESS_KINDS",
    "SKLEARN_DATASETS",
    "CLASSIFICATION_METRICS",
    "REGRESSION_METRICS",
    "metric_mode",
    "spec_json_schema",
]

_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")


class PipelineSpec(Strict):
    name: str = Field(description="Lowercase letters, digits and '-'; names the model and the default route.")
    data: DataSpec
    task: Optional[Literal["classification", "regression"]] = Field(
        None, description="Inferred from the label when omitted."
    )
    model: ModelSpec
    train: TrainSpec = Field(default_factory=TrainSpec)
    tune: Optional[TuneSpec] = None
    serve: Optional[ServeSpec] = None
    retrain: Optional[RetrainSpec] = Field(None, description="Keep the served model current: retrain on drift, "
                                           "changed data or a schedule, judge, roll out as a gated canary.")

    @model_validator(mode="before")
    @classmethod
    def _model_from_families(cls, raw):
        # A sweep over model families (`tune.space.model: {choice: [...]}`) need not repeat one
        # of them as `model:`: the first family, with its fixed params, stands in until a trial
        # picks its own.
        if isinstance(raw, dict) and "model" not in raw:
            space = (raw.get("tune") or {}).get("space") if isinstance(raw.get("tune"), dict) else None
            if isinstance(space, dict):
                from rayline.spec.pipeline_space import model_families

                families = model_families(space)
                if families:
                    raw = {**raw, "model": families[0].model}
        return raw

    @field_validator("name")
    @classmethod
    def _name(cls, v):
        if not _NAME_RE.match(v) or len(v) > 63:
            raise problem("", "lowercase letters, digits and '-', at most 63", got=repr(v), allowed="e.g. digits-mlp")
        return v

    @model_validator(mode="after")
    def _cross_checks(self):
        info = BACKENDS[self.model.framework]
        want = "tpu" if self.train.use_tpu else "gpu" if self.train.use_gpu else "cpu"
        if want not in info.accelerators:
            # Ray Train 2.60 trains on TPUs with JaxTrainer and with TorchTrainer(use_tpu=True)
            # through torch_xla's "tpu_dist" process group (ray/train/v2/jax/jax_trainer.py,
            # ray/train/torch/config.py); TensorflowTrainer and XGBoostTrainer have no TPU path,
            # and rayline's torch loop is not written for XLA devices.
            why = {"tpu": "; Ray Train 2.60 trains on TPUs only with JaxTrainer and TorchTrainer on torch_xla, "
                          "which rayline's backends do not use"}.get(want, "")
            raise problem(("train", f"use_{want}"),
                          f"framework {self.model.framework} cannot train on {want.upper()} with Ray Train{why}",
                          got=f"use_{want}: true", allowed=", ".join(sorted(info.accelerators)), allowed_label="supported")
        technique = self._technique_problem(info)
        if technique is not None:
            raise technique
        tpu = self.train.tpu_problem()
        if tpu is not None:
            raise SpecProblem(*(p.under(("train",)) for p in tpu.problems))
        if self.train.metric is not None:
            allowed = {
                "classification": CLASSIFICATION_METRICS,
                "regression": REGRESSION_METRICS,
                None: tuple(dict.fromkeys(CLASSIFICATION_METRICS + REGRESSION_METRICS)),
            }[self.task]
            if self.train.metric not in allowed:
                raise problem(("train", "metric"), f"unknown metric{' for ' + self.task if self.task else ''}",
                              got=repr(self.train.metric), allowed=", ".join(allowed))
        if self.tune is not None:
            problems = check_space(self) + check_scheduler(self)
            if problems:
                raise SpecProblem(*problems)
        if self.retrain is not None:
            retrain = self._retrain_problem()
            if retrain is not None:
                raise retrain
        return self

    def _retrain_problem(self) -> Optional[SpecProblem]:
        """retrain against the sections it builds on: an endpoint to roll out on, drift counted there,
        a source that can change, a metric of the task."""
        retrain = self.retrain
        if self.serve is None:
            return problem("retrain", "the loop rolls each challenger out on the model's endpoint: add a serve "
                           "section", got="retrain without serve", allowed="serve: {} (the defaults) or more")
        if "drift" in retrain.on and not self.serve.monitoring.enabled:
            return problem(("retrain", "on"), "drift is what the endpoint's monitoring counts, and it is off",
                           got="drift with serve.monitoring.enabled: false",
                           allowed="serve.monitoring.enabled: true, or on: [data_change] / [schedule]")
        if "data_change" in retrain.on and self.data.source.format == "sklearn":
            return problem(("retrain", "on"), f"a bundled dataset ({self.data.source.name}) never changes",
                           got="data_change with data.source.format: sklearn",
                           allowed="a file, folder, glob or bucket source, or on: [drift] / [schedule]")
        metric = retrain.compare.metric
        if metric is not None:
            allowed = {"classification": CLASSIFICATION_METRICS, "regression": REGRESSION_METRICS,
                       None: tuple(dict.fromkeys(CLASSIFICATION_METRICS + REGRESSION_METRICS))}[self.task]
            if metric not in allowed:
                return problem(("retrain", "compare", "metric"), f"unknown metric{' for ' + self.task if self.task else ''}",
                               got=repr(metric), allowed=", ".join(allowed))
        return None

    def _technique_problem(self, info) -> Optional[SpecProblem]:
        """train.precision and train.grad_accumulation against what the framework and the workers can do."""
        train, framework = self.train, self.model.framework
        if train.precision not in info.precisions:
            return problem(("train", "precision"), f"framework {framework} trains in fp32 only (its histograms and "
                           "trees have no mixed-precision mode)", got=train.precision,
                           allowed=", ".join(sorted(info.precisions)), allowed_label="supported")
        if train.precision == "fp16" and not train.use_gpu:  # (resources_per_worker.GPU needs use_gpu too)
            return problem(("train", "precision"), "fp16 needs GPU workers (train.use_gpu: true): fp16 mixed "
                           "precision and its loss scaling are a CUDA feature, CPUs have no fast fp16 arithmetic",
                           got="fp16 on CPU workers", allowed="bf16 (CPU and GPU), fp32, or fp16 with use_gpu: true")
        gpus = (train.resources_per_worker or {}).get("GPU", 0)
        if gpus > 1 and not info.multi_gpu_workers:
            return problem(("train", "resources_per_worker", "GPU"), f"framework {framework} trains on one GPU per "
                           "worker (one replica per worker's device: the others would sit idle)", got=f"{gpus:g}",
                           allowed="1 or less, with more train.workers (tensorflow mirrors over a worker's GPUs)")
        if train.strategy not in info.strategies:
            return problem(("train", "strategy"), f"framework {framework} has no {train.strategy} training"
                           + (" (sharding is torch's FSDP)" if train.strategy == "fsdp" else ""),
                           got=train.strategy, allowed=", ".join(sorted(info.strategies)), allowed_label="supported")
        if train.strategy == "fsdp" and train.max_workers < 2:
            return problem(("train", "strategy"), "fsdp shards across workers and needs 2 or more (train.workers)",
                           got=f"fsdp with {train.max_workers} worker", allowed="ddp, or fsdp with workers >= 2")
        compression = train.grad_compression.name
        if compression != "none" and train.strategy == "fsdp":
            return problem(("train", "grad_compression"), "gradient compression is a DDP communication hook; "
                           "fsdp reduce-scatters its gradient shards itself", got=f"{compression} with strategy fsdp",
                           allowed="none with fsdp, or strategy: ddp")
        if compression != "none" and compression not in info.grad_compressions:
            return problem(("train", "grad_compression"), f"framework {framework} has no gradient compression "
                           "(DDP communication hooks are torch's)", got=compression, allowed="none")
        if compression == "bf16" and not train.use_gpu:
            return problem(("train", "grad_compression"), "bf16 compression needs GPU workers (train.use_gpu: true): "
                           "torch's bf16 hook all-reduces over NCCL, not gloo", got="bf16 on CPU workers",
                           allowed="fp16 or powersgd (CPU and GPU), none, or bf16 with use_gpu: true")
        if compression != "none" and train.max_workers < 2:
            return problem(("train", "grad_compression"), "needs 2 or more workers (train.workers): one worker "
                           "all-reduces nothing", got=f"{compression} with {train.max_workers} worker", allowed="none")
        if train.grad_accumulation > 1 and not info.grad_accumulation:
            return problem(("train", "grad_accumulation"), f"framework {framework} has no mini-batches to accumulate "
                           "(each boosting round uses every row)", got=str(train.grad_accumulation), allowed="1")
        if train.in_memory != "auto" and not info.grad_accumulation:  # no mini-batches: nothing to slice in memory
            return problem(("train", "in_memory"), f"framework {framework} holds its train shard as its own matrix "
                           "(model.params.external_memory: auto | always | never)", got=train.in_memory,
                           allowed="auto (torch and tensorflow take always or never)")
        return None

    @property
    def route(self) -> str:
        return (self.serve.route if self.serve and self.serve.route else f"/{self.name}")

    def resolved_metric(self, task: str) -> str:
        return self.train.metric or ("accuracy" if task == "classification" else "rmse")


def spec_json_schema() -> dict:
    """The pipeline spec's JSON Schema (draft 2020-12), for editor completion."""
    schema = PipelineSpec.model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "rayline pipeline spec"
    return schema
