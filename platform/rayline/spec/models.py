"""The pipeline spec's pydantic models: the public contract users write in YAML.

Every model forbids unknown keys. Validators raise `SpecProblem` with the parts of the
message (path relative to the model, what, got, allowed); problems.py renders them.
"""

from __future__ import annotations

import difflib
import math
import re
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator

from rayline.data.steps import STEP_SPEC_MODELS, STEPS
from rayline.spec.problems import Problem, SpecProblem, problem, short
from rayline.tune.schedulers import (SCHEDULER_SPEC_MODELS, SchedulerField, check_scheduler, parse_scheduler,
                                scheduler_json_schema)
from rayline.tune.searchers import SEARCH_NAMES
from rayline.spec.distributions import check_distributions
from rayline.spec.space import check_grid, check_space
from rayline.frameworks import BACKENDS

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
    "AuthSpec",
    "PreprocessStep",
    "PREPROCESS_KINDS",
    "SKLEARN_DATASETS",
    "CLASSIFICATION_METRICS",
    "REGRESSION_METRICS",
    "metric_mode",
    "spec_json_schema",
]

SKLEARN_DATASETS = ("iris", "digits", "wine", "breast_cancer", "diabetes")
CLASSIFICATION_METRICS = ("loss", "accuracy", "f1", "precision", "recall", "roc_auc", "log_loss")
REGRESSION_METRICS = ("loss", "rmse", "mae", "r2")
_MAX_METRICS = {"accuracy", "f1", "precision", "recall", "roc_auc", "r2"}
_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")


def metric_mode(metric: str) -> str:
    """'max' for scores, 'min' for losses and errors."""
    return "max" if metric in _MAX_METRICS else "min"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


# ---------------------------------------------------------------- data


class SourceSpec(_Strict):
    format: Literal["sklearn", "csv", "parquet", "json"] = Field(
        description="Where the rows come from. json: a JSON array of row objects, or JSON Lines (.json, .jsonl, .ndjson).")
    name: Optional[str] = Field(None, description="sklearn dataset name (format: sklearn).")
    path: Optional[str] = Field(
        None, description="File, directory, glob or URI (s3://, gs://); relative to the spec file."
    )
    fingerprint: Literal["stat", "content"] = Field(
        "stat", description="How rayline tells whether the data changed (resume refuses changed data): stat, each "
                            "file's path, size and modification time (cheap at any size); content, a SHA-256 of "
                            "every byte of local files (reads them all once per run).")

    @model_validator(mode="after")
    def _source_fields(self):
        if self.format == "sklearn":
            if self.name not in SKLEARN_DATASETS:
                raise problem("name", "unknown sklearn dataset", got=repr(self.name), allowed=", ".join(SKLEARN_DATASETS))
            if self.path is not None:
                raise problem("path", "not used with format sklearn", got=repr(self.path), allowed="name")
        else:
            if not self.path:
                raise problem("path", f"required for format {self.format}", got="None",
                              allowed="a file, directory, glob or URI")
            if self.name is not None:
                raise problem("name", "only for format sklearn", got=repr(self.name), allowed="path")
        return self


class SplitSpec(_Strict):
    valid: float = Field(0.2, gt=0, lt=1, description="Fraction of rows for validation (metric, early stopping).")
    test: float = Field(0.1, ge=0, lt=1, description="Fraction of rows held out for final test metrics.")
    seed: int = Field(0, description="Seed of the deterministic split.")
    key: Optional[str] = Field(
        None, description="A column that identifies each row (an id): the split hashes it with the seed. "
                          "Default: the row's values (every column the spec reads), so duplicate rows share a split.")

    @model_validator(mode="after")
    def _fractions(self):
        if self.valid + self.test >= 0.9:
            raise problem("", "valid + test: leaves too little to train on", got=f"{self.valid + self.test:g}",
                          allowed="< 0.9")
        return self


# Each preprocessing step's spec model comes from its class in data/steps.py (the registry).
PREPROCESS_KINDS = tuple(STEPS)
_STEP_MODELS = STEP_SPEC_MODELS
_STEP_TAGS = {kind: model.__name__ for kind, model in _STEP_MODELS.items()}


def _step_tag(value: Any) -> str | None:
    if isinstance(value, dict) and len(value) == 1:
        return _STEP_TAGS.get(next(iter(value)))
    return type(value).__name__ if isinstance(value, tuple(_STEP_MODELS.values())) else None


# Tagged by the step's one key, so a bad step reports only its own problems; the tags are
# known (paths.walk drops exactly them from error locations).
PreprocessStep = Annotated[
    Union[tuple(Annotated[m, Tag(m.__name__)] for m in _STEP_MODELS.values())],
    Discriminator(_step_tag),
]


class DataSpec(_Strict):
    source: SourceSpec
    label: str = Field(description="The column to predict.")
    features: Optional[list[str]] = Field(None, description="Default: every column except the label.")
    split: SplitSpec = Field(default_factory=SplitSpec)
    preprocess: list[PreprocessStep] = Field(default_factory=list, description="Fitted on the train split only.")

    @field_validator("preprocess", mode="before")
    @classmethod
    def _step_kinds(cls, steps):
        # Report a bad step kind by name instead of pydantic's four-way union noise.
        if isinstance(steps, list):
            for i, step in enumerate(steps):
                if not isinstance(step, dict) or len(step) != 1:
                    raise problem((i,), "each step is a mapping with one key", got=repr(step),
                                  allowed=", ".join(PREPROCESS_KINDS))
                (kind,) = step
                if kind not in PREPROCESS_KINDS:
                    raise problem((i,), "unknown preprocessing step", got=repr(kind), allowed=", ".join(PREPROCESS_KINDS))
        return steps

    @field_validator("features")
    @classmethod
    def _features_unique(cls, v):
        if v is not None:
            if not v:
                raise problem("", "must name at least one column", got="[]", allowed="omit it for every column")
            dupes = sorted({c for c in v if v.count(c) > 1})
            if dupes:
                raise problem("", "duplicate columns", got=str(dupes), allowed="each column once")
        return v

    @model_validator(mode="after")
    def _label_not_feature(self):
        if self.features and self.label in self.features:
            raise problem("features", "the label is not a feature", got=repr(self.label), allowed="other columns")
        return self


# ---------------------------------------------------------------- model and training

_IMPORT_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class ModelSpec(_Strict):
    framework: Literal["torch", "tensorflow", "xgboost"] = Field(description="Which training backend.")
    kind: Optional[str] = Field(None, description="A built-in model: mlp (torch, tensorflow), gbdt (xgboost).")
    import_: Optional[str] = Field(
        None,
        alias="import",
        description="'module:callable' -> callable(num_features, num_outputs, **params) returning the model.",
    )
    params: dict[str, Any] = Field(default_factory=dict, description="Passed to the model builder.")

    @model_validator(mode="after")
    def _kind_or_import(self):
        info = BACKENDS[self.framework]
        kinds = ", ".join(sorted(info.kinds))
        no_import = problem("import", f"not supported for framework {self.framework}", got=repr(self.import_),
                            allowed=f"kind: {kinds}")
        if (self.kind is None) == (self.import_ is None):
            if not info.import_returns and self.import_ is not None:
                raise no_import
            raise problem("kind", "give exactly one of kind or import",
                          got=f"kind={self.kind!r}, import={self.import_!r}", allowed=kinds,
                          allowed_label=f"allowed kinds for {self.framework}")
        if self.import_ is not None:
            if not info.import_returns:
                raise no_import
            if not _IMPORT_RE.match(self.import_):
                raise problem("import", "must be 'module.path:callable'", got=repr(self.import_))
            return self
        if self.kind not in info.kinds:
            raise problem("kind", f"unknown model kind for {self.framework}", got=repr(self.kind), allowed=kinds)
        allowed = info.kinds[self.kind]
        for key in self.params:
            if key not in allowed:
                raise problem(("params", key), f"unknown parameter for {self.framework} {self.kind}",
                              got=repr(key), allowed=", ".join(sorted(allowed)))
            choices = info.param_choices.get(key)
            value = self.params[key]
            # A search-space dict ({choice: [...]}) is checked where the space is (spec/space.py).
            if choices and not isinstance(value, dict) and value not in choices:
                raise problem(("params", key), f"not a value {self.framework} {self.kind} takes", got=repr(value),
                              allowed=", ".join(choices))
        return self


class OptimizerSpec(_Strict):
    name: Literal["adam", "adamw", "sgd"] = "adam"
    lr: float = Field(1e-3, gt=0, le=10, description="Learning rate.")
    momentum: float = Field(0.0, ge=0, lt=1, description="sgd only.")
    weight_decay: float = Field(0.0, ge=0)


class WorkersRange(_Strict):
    """Elastic training: Ray Train V2 starts with as many workers as fit (at least `min`) and
    grows towards `max` as nodes join; after a node is lost it restarts with the workers
    that still fit, from the latest checkpoint."""

    min: int = Field(ge=1, le=1024, description="Fewest workers training runs with; it waits for resources below this.")
    max: int = Field(ge=1, le=1024, description="Most workers; the worker group grows to this as the cluster does.")

    @model_validator(mode="after")
    def _bounds(self):
        if self.max < self.min:
            raise problem("max", "must be >= min", got=f"max={self.max}, min={self.min}",
                          allowed=f"max >= {self.min}")
        return self

    def __str__(self) -> str:  # "2-8 workers" in progress lines
        return f"{self.min}-{self.max}"


GRAD_COMPRESSIONS = ("none", "fp16", "bf16", "powersgd")


class GradCompression(_Strict):
    """train.grad_compression: what DDP sends in its gradient all-reduce (torch communication hooks).
    Written as a name, or `{powersgd: {rank: 2, start_iter: 10}}`."""

    name: Literal["none", "fp16", "bf16", "powersgd"] = Field("none", description="none | fp16 | bf16 | powersgd.")
    rank: int = Field(1, ge=1, le=256, description="PowerSGD: rank of the low-rank gradient approximation.")
    # torch requires > 1: error feedback and warm start need a first plain step.
    start_iter: int = Field(10, ge=2, description="PowerSGD: plain all-reduce steps before compressing (its warm-up).")

    @model_validator(mode="before")
    @classmethod
    def _short_forms(cls, raw):
        if isinstance(raw, str):
            raw = {raw: None}
        if isinstance(raw, dict) and len(raw) == 1 and next(iter(raw)) not in cls.model_fields:
            ((name, params),) = raw.items()
            if name not in GRAD_COMPRESSIONS:
                raise problem("", "unknown gradient compression", got=repr(name), allowed=", ".join(GRAD_COMPRESSIONS),
                              hint=(difflib.get_close_matches(str(name), GRAD_COMPRESSIONS, n=1) or [None])[0])
            params = {} if params is None else params
            if not isinstance(params, dict):
                raise problem(name, "parameters must be a mapping", got=short(params), allowed="e.g. {rank: 2, start_iter: 10}")
            if name != "powersgd" and params:
                raise problem(name, f"{name} takes no parameters", got=short(params), allowed=f"{name}, or powersgd: {{rank, start_iter}}")
            return {"name": name, **params}
        return raw

    def __str__(self) -> str:
        return f"powersgd rank {self.rank}" if self.name == "powersgd" else self.name


def _workers_tag(value: Any) -> str:
    return "range" if isinstance(value, (dict, WorkersRange)) else "count"


# Resource names Ray Train reads case-sensitively; a near miss ("cpu", "gpus") would ask for
# a custom resource no node has and wait forever to be placed.
_RAY_RESOURCES = ("CPU", "GPU", "TPU", "memory")
_RESOURCE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-/]*$")
_TOPOLOGY_RE = re.compile(r"^[1-9][0-9]*(x[1-9][0-9]*){1,2}$")


def ray_accelerator_types() -> tuple[str, ...]:
    """Ray's own accelerator type names (ray.util.accelerators), the values of its
    `accelerator_type:<name>` node resources. Imported only when a spec sets one."""
    from ray.util.accelerators import accelerators

    return tuple(sorted({v for k, v in vars(accelerators).items() if k.isupper() and isinstance(v, str)}))


class TrainSpec(_Strict):
    workers: Annotated[
        Union[Annotated[Annotated[int, Field(ge=1, le=1024)], Tag("count")], Annotated[WorkersRange, Tag("range")]],
        Discriminator(_workers_tag),
    ] = Field(2, description="Ray Train workers (DDP ranks, TF replicas, xgboost workers); "
                             "{min, max} for elastic training (Ray Train V2 resizes between them).")
    use_gpu: bool = Field(False, description="One GPU per worker (resources_per_worker.GPU for another amount).")
    use_tpu: bool = Field(False, description="TPU workers (only where the framework supports it).")
    cpus_per_worker: Optional[float] = Field(
        None, gt=0, description="Logical CPUs per worker; default: planned from the cluster so nothing stalls."
    )
    resources_per_worker: Optional[dict[str, float]] = Field(
        None, description="Ray resources each worker reserves: CPU, GPU, TPU, memory (bytes) or a custom "
                          "resource of your nodes. CPU here replaces cpus_per_worker (give one of them).")
    accelerator_type: Optional[str] = Field(
        None, description="Only nodes with this accelerator (Ray's names: A100, H100, L4, TPU-V6E, ...).")
    tpu_topology: Optional[str] = Field(
        None, description="TPU slice topology, e.g. 2x2x4 (Ray ScalingConfig.topology; with use_tpu).")
    epochs: int = Field(10, ge=1, le=100_000, description="Epochs (torch, tensorflow); boosting rounds default for xgboost.")
    batch_size: int = Field(64, ge=1, description="Global batch size, split across workers.")
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec)
    metric: Optional[str] = Field(None, description="Validation metric choosing the best checkpoint and trial.")
    max_failures: int = Field(2, ge=0, description="Worker-group restarts from the latest checkpoint.")
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        "fp32", description="Training arithmetic: bf16 (CPU and GPU) or fp16 (GPU, with loss scaling) mixed precision; "
                            "weights and checkpoints stay fp32. torch and tensorflow.")
    grad_accumulation: int = Field(
        1, ge=1, le=4096, description="Micro-batches (of batch_size) per optimizer step; gradients are all-reduced "
                                      "once per step. Effective batch: batch_size x grad_accumulation. torch and tensorflow.")

    strategy: Literal["ddp", "fsdp"] = Field(
        "ddp", description="Data parallelism: ddp (torch DDP; tensorflow MultiWorkerMirroredStrategy) or fsdp "
                           "(torch: parameters, gradients and optimizer state sharded across the workers).")
    grad_compression: GradCompression = Field(
        default_factory=GradCompression, description="DDP gradient compression: none | fp16 | bf16 | powersgd, or "
                                                     "{powersgd: {rank, start_iter}}. torch, 2 or more workers.")

    @property
    def effective_batch_size(self) -> int:
        return self.batch_size * self.grad_accumulation

    @property
    def elastic(self) -> bool:
        return isinstance(self.workers, WorkersRange)

    @property
    def min_workers(self) -> int:
        return self.workers.min if isinstance(self.workers, WorkersRange) else self.workers

    @property
    def max_workers(self) -> int:
        return self.workers.max if isinstance(self.workers, WorkersRange) else self.workers

    @field_validator("resources_per_worker", mode="before")
    @classmethod
    def _resource_values(cls, v):
        # Checked before pydantic coerces: a bool or a string is not a quantity, and every
        # problem is named with its key.
        if not isinstance(v, dict):
            return v
        problems = []
        for key, value in v.items():
            key_text = str(key)
            if isinstance(key, str) and key.startswith("accelerator_type:"):
                problems.append(Problem((key,), "set the accelerator with train.accelerator_type", got=repr(key),
                                        allowed=f"accelerator_type: {key.partition(':')[2] or 'A100'}"))
                continue
            if isinstance(key, str) and (key in ("object_store_memory", "node") or key.startswith("node:")):
                problems.append(Problem((key,), "not a resource a training worker can reserve", got=repr(key),
                                        allowed=", ".join(_RAY_RESOURCES) + " or a custom resource name"))
                continue
            if not isinstance(key, str) or not _RESOURCE_RE.match(key):
                problems.append(Problem((key_text,), "not a Ray resource name", got=repr(key),
                                        allowed=f"{', '.join(_RAY_RESOURCES)} or a custom resource name"))
                continue
            near = next((r for r in _RAY_RESOURCES if key != r and key.lower().rstrip("s") == r.lower()), None)
            if near:
                problems.append(Problem((key,), "Ray resource names are case-sensitive", got=repr(key),
                                        allowed=", ".join(_RAY_RESOURCES) + " or a custom resource name", hint=near))
                continue
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not number or not math.isfinite(value) or value < 0:
                problems.append(Problem((key,), "must be a non-negative finite number", got=short(value),
                                        allowed="e.g. 1, 0.5, 8e9 (memory in bytes)"))
        if problems:
            raise SpecProblem(*problems)
        return v

    @field_validator("accelerator_type")
    @classmethod
    def _accelerator_type(cls, v):
        if v is not None:
            known = ray_accelerator_types()
            if v not in known:
                hint = [k for k in known if k.lower() == v.lower()][:1] or difflib.get_close_matches(v, known, n=1)
                raise problem("", "unknown accelerator type", got=repr(v), allowed=", ".join(known),
                              allowed_label="allowed (Ray's ray.util.accelerators)", hint=hint[0] if hint else None)
        return v

    @field_validator("tpu_topology")
    @classmethod
    def _topology(cls, v):
        if v is not None and not _TOPOLOGY_RE.match(v):
            raise problem("", "a TPU topology is chips per dimension", got=repr(v), allowed="e.g. 2x2, 2x4, 2x2x1, 2x2x4")
        return v

    @model_validator(mode="after")
    def _accelerator(self):
        if self.use_gpu and self.use_tpu:
            raise problem("use_tpu", "choose one accelerator", got="use_gpu: true and use_tpu: true",
                          allowed="one of them")
        res = self.resources_per_worker or {}
        if "CPU" in res and self.cpus_per_worker is not None:
            raise problem("cpus_per_worker", "give CPUs once: cpus_per_worker or resources_per_worker.CPU",
                          got=f"cpus_per_worker: {self.cpus_per_worker:g} and resources_per_worker.CPU: {res['CPU']:g}",
                          allowed="one of them")
        # Ray's own ScalingConfig rules (ray/air/config.py, ray/train/v2/api/config.py), said here.
        for key, flag in (("GPU", "use_gpu"), ("TPU", "use_tpu")):
            if key in res and res[key] > 0 and not getattr(self, flag):
                raise problem(("resources_per_worker", key), f"{key}s per worker need {flag}: true",
                              got=f"{key}: {res[key]:g} with {flag}: false", allowed=f"set {flag}: true, or drop {key}")
            if key in res and res[key] == 0 and getattr(self, flag):
                raise problem(("resources_per_worker", key), f"{flag}: true needs {key}s per worker",
                              got=f"{key}: 0", allowed=f"{key} > 0 (default 1), or {flag}: false")
        if res and not any(v > 0 for v in res.values()) and self.cpus_per_worker is None and "CPU" in res:
            raise problem("resources_per_worker", "a worker must reserve something", got=short(res),
                          allowed="some resource > 0, e.g. CPU: 1")
        tpu_type = (self.accelerator_type or "").startswith("TPU-")
        if tpu_type and not self.use_tpu:
            raise problem("accelerator_type", "a TPU accelerator type needs use_tpu: true",
                          got=repr(self.accelerator_type), allowed="use_tpu: true, or a GPU type (A100, H100, L4, ...)")
        if self.use_tpu and self.accelerator_type is not None and not tpu_type:
            raise problem("accelerator_type", "use_tpu: true needs a TPU accelerator type",
                          got=repr(self.accelerator_type), allowed=", ".join(t for t in ray_accelerator_types() if t.startswith("TPU-")))
        if self.tpu_topology is not None:
            if not self.use_tpu:
                raise problem("tpu_topology", "only for TPU training", got=repr(self.tpu_topology), allowed="use_tpu: true")
            if tpu_type:
                try:  # private to Ray: a Ray that moves it skips this check, never fails the spec
                    from ray._private.accelerators.tpu import VALID_TPU_TOPOLOGY
                except ImportError:
                    VALID_TPU_TOPOLOGY = {}  # noqa: N806

                version = self.accelerator_type.removeprefix("TPU-").lower()
                valid = VALID_TPU_TOPOLOGY.get(version)
                if valid is not None and self.tpu_topology not in valid:
                    shown = sorted(valid, key=lambda t: [int(d) for d in t.split("x")])
                    raise problem("tpu_topology", f"not a topology of {self.accelerator_type}",
                                  got=repr(self.tpu_topology), allowed=", ".join(shown[:16]) + (", ..." if len(shown) > 16 else ""))
        return self

    def tpu_problem(self) -> SpecProblem | None:
        """Ray Train's own rule, checked once the framework can train on TPU at all: "`topology`
        and `accelerator_type` must be specified in ScalingConfig when use_tpu=True and
        num_workers > 1" (ray/train/v2/api/config.py)."""
        if self.use_tpu and self.max_workers > 1 and (self.tpu_topology is None or self.accelerator_type is None):
            missing = [k for k in ("accelerator_type", "tpu_topology") if getattr(self, k) is None]
            return problem(missing[0], "multi-host TPU training needs accelerator_type and tpu_topology",
                           got=f"{self.max_workers} workers, {missing[0]} not set",
                           allowed="e.g. accelerator_type: TPU-V6E, tpu_topology: 4x4")
        return None


# ---------------------------------------------------------------- tuning and serving

Distribution = dict[str, Any]


class TuneSpec(_Strict):
    num_samples: int = Field(8, ge=1, le=10_000, description="Trials (times each grid combination).")
    max_concurrent: int = Field(2, ge=1, description="Trials running at once (lowered to what the cluster fits).")
    scheduler: SchedulerField = Field(
        default_factory=lambda: SCHEDULER_SPEC_MODELS["asha"](),
        description="Trial scheduler, by name or as {<name>: {<parameter>: <value>}}: asha (grace_period, "
                    "reduction_factor, max_t, brackets), median (grace_period, min_samples_required, min_time_slice), "
                    "pbt (perturbation_interval, burn_in_period, quantile_fraction, resample_probability, "
                    "perturbation_factors, synch) or fifo. Clock: units trained (epochs; boosting rounds).",
        json_schema_extra=scheduler_json_schema,
    )
    search: Literal[SEARCH_NAMES] = Field("random", description="random, grid, or optuna (Bayesian: Optuna's TPE).")
    seed: Optional[int] = Field(None, ge=0, le=2**32 - 1, description="Seed of the search (random draws, Optuna's "
                                                                        "sampler); default data.split.seed.")
    time_budget_s: Optional[float] = Field(None, gt=0, description="Stop the sweep after this many seconds; the winner "
                                                                   "is chosen among the trials finished or stopped by then.")
    space: dict[str, Distribution] = Field(
        min_length=1,
        description="Dotted spec path -> distribution. Tunable: model.params.<param>, train.epochs, "
                    "train.batch_size, train.workers, train.optimizer.name/lr/momentum/weight_decay.",
    )

    @field_validator("scheduler", mode="before")
    @classmethod
    def _scheduler_name(cls, v):
        return parse_scheduler(v)  # `asha` or `{asha: {grace_period: 2}}`

    @field_validator("space")
    @classmethod
    def _distributions(cls, space):
        problems = check_distributions(space)
        if problems:
            raise SpecProblem(*problems)
        return space

    @model_validator(mode="after")
    def _grid_search(self):
        problems = check_grid(self.search, self.space)
        if problems:
            raise SpecProblem(*problems)
        return self


class ReplicasSpec(_Strict):
    min: int = Field(1, ge=0, description="Fewest replicas (0 scales to zero).")
    max: int = Field(1, ge=1, description="Most replicas.")
    target_ongoing_requests: float = Field(2, gt=0, description="Autoscaling target per replica.")
    upscale_delay_s: float = Field(30.0, ge=0, description="Load must stay above target this long before a replica is added (Ray Serve's default).")
    downscale_delay_s: float = Field(600.0, ge=0, description="Load must stay below target this long before a replica is removed (Ray Serve's default).")
    look_back_period_s: float = Field(30.0, gt=0, description="Window the load is averaged over (Ray Serve's default).")
    cpus: Optional[float] = Field(None, gt=0, description="Deprecated: use serve.resources_per_replica.cpus.")

    @model_validator(mode="after")
    def _bounds(self):
        if self.max < self.min:
            raise problem("max", "must be >= min", got=f"max={self.max}, min={self.min}")
        return self


class ResourcesSpec(_Strict):
    cpus: float = Field(0.25, ge=0, description="Logical CPUs each replica reserves (fractions allowed).")
    gpus: float = Field(0.0, ge=0, description="GPUs each replica reserves (fractions share one GPU).")

    @model_validator(mode="after")
    def _something(self):
        if self.cpus == 0 and self.gpus == 0:
            raise problem("", "a replica must reserve some CPU or GPU", got="cpus: 0, gpus: 0",
                          allowed="cpus > 0 or gpus > 0")
        return self


class BatchingSpec(_Strict):
    """Dynamic batching: concurrent requests' rows merged into one model call (Ray Serve's @serve.batch)."""

    enabled: bool = Field(True, description="false: every request calls the model alone.")
    # On by default: measured a tie for the digits MLP on 2 cores (figures in
    # rayline/serve/batching.py); merged model calls should pay where the model call is the cost.
    max_batch_size: int = Field(64, ge=1, le=100_000, description="Most rows in one model call.")
    wait_timeout_ms: float = Field(2.0, ge=0, le=10_000, description="Longest a request waits for others to join its batch.")

    @model_validator(mode="before")
    @classmethod
    def _flag(cls, v):
        # `batching: false` / `batching: true` as a shorthand.
        return {"enabled": v} if isinstance(v, bool) else v


class CanarySpec(_Strict):
    """Deploy the run's winner as a canary beside the champion, with an automatic rollback gate."""

    percent: int = Field(10, ge=1, le=99, description="Percent of the route's traffic the canary gets (the champion the rest).")
    max_error_rate: Optional[float] = Field(
        None, ge=0, le=1, description="Canary error rate (5xx and failed calls; 4xx are the client's) above which traffic returns to the champion.")
    max_p99_ms: Optional[float] = Field(None, gt=0, description="Canary p99 latency (ms, at the router) above which traffic returns to the champion.")
    min_requests: int = Field(100, ge=1, description="Canary requests seen before the limits are checked.")

    def gate(self) -> Optional[dict]:
        """The router's gate limits, or None when no limit is set."""
        if self.max_error_rate is None and self.max_p99_ms is None:
            return None
        return {"max_error_rate": self.max_error_rate, "max_p99_ms": self.max_p99_ms, "min_requests": self.min_requests}


_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class AuthSpec(_Strict):
    """Where the replicas find the API keys; the spec never holds a key itself."""

    api_keys_env: Optional[str] = Field(
        None, description="Environment variable of the Ray nodes holding comma-separated keys (read by each replica).")
    api_keys_file: Optional[str] = Field(
        None, description="File with one key per line (# comments allowed), readable where the replicas run; "
                          "relative to the spec file.")

    @field_validator("api_keys_env")
    @classmethod
    def _env_name(cls, v):
        if v is not None and not _ENV_NAME_RE.match(v):
            # Do not echo it: a value that is not a variable name may be a key pasted by mistake.
            raise problem("", "not an environment variable name", got="a value that is not shown",
                          allowed="letters, digits and '_', not starting with a digit, e.g. RAYLINE_API_KEYS")
        return v

    @model_validator(mode="after")
    def _one_source(self):
        given = [k for k in ("api_keys_env", "api_keys_file") if getattr(self, k) is not None]
        if len(given) != 1:
            raise problem("", "give exactly one of api_keys_env or api_keys_file", got=str(given or "neither"),
                          allowed="api_keys_env: VAR or api_keys_file: PATH")
        if self.api_keys_file is not None and not self.api_keys_file.strip():
            raise problem("api_keys_file", "empty path", got="''", allowed="a file path")
        return self


class ServeSpec(_Strict):
    route: Optional[str] = Field(None, description="HTTP route prefix; default /<name>.")
    replicas: ReplicasSpec = Field(default_factory=ReplicasSpec)
    resources_per_replica: ResourcesSpec = Field(default_factory=ResourcesSpec)
    batching: BatchingSpec = Field(default_factory=BatchingSpec)
    max_instances: int = Field(10_000, ge=1, description="Most instances accepted in one request.")
    max_ongoing_requests: int = Field(64, ge=1, description="Requests one replica works on at once (batching needs >= max_batch_size requests to fill a batch).")
    max_queued_requests: int = Field(256, ge=-1, description="Requests waiting for a replica before new ones get 429 with Retry-After (-1: no limit).")
    retry_after_s: int = Field(1, ge=0, description="Retry-After seconds on a 429.")
    max_body_bytes: int = Field(10 * 1024 * 1024, ge=1024, description="Largest request body; larger ones get 413 before parsing.")
    request_timeout_s: float = Field(60.0, gt=0, description="A request still unanswered after this long gets 504.")
    oip: bool = Field(True, description="Serve the Open Inference Protocol (KServe V2) for this model at /v2/models/<name> from replicas of its own that hold the model, as the route's do (one hop, like /predict); false: /v2 still answers through the shared rayline-v2 application, one hop more, and saves a replica.")
    drain_timeout_s: float = Field(20.0, ge=0, description="When a replica stops (SIGTERM of `rayline run`, a scale-down, a redeploy): how long its in-flight requests may take to finish. Keep it below the pod's terminationGracePeriodSeconds (Kubernetes' default 30 s).")
    auth: Optional[AuthSpec] = Field(None, description="API keys required on every route but GET /health.")
    canary: Optional[CanarySpec] = Field(
        None, description="`rayline run` deploys the winner as a canary (percent of traffic, rollback limits) instead of the new champion.")

    @field_validator("route")
    @classmethod
    def _route(cls, v):
        if v is not None and (not v.startswith("/") or v == "/" or v.endswith("/") or " " in v):
            raise problem("", "must start with '/', not end with '/', and hold no spaces", got=repr(v),
                          allowed="e.g. /digits")
        return v

    @model_validator(mode="after")
    def _deprecated_replica_cpus(self):
        # `replicas.cpus` (before resources_per_replica existed) still works and moves over.
        cpus = self.replicas.cpus
        if cpus is not None:
            if "resources_per_replica" in self.model_fields_set and self.resources_per_replica.cpus != cpus:
                raise problem(("replicas", "cpus"), "deprecated, and it contradicts resources_per_replica.cpus",
                              got=f"{cpus:g} and {self.resources_per_replica.cpus:g}",
                              allowed="only resources_per_replica.cpus")
            self.resources_per_replica = ResourcesSpec(cpus=cpus, gpus=self.resources_per_replica.gpus)
            self.replicas.cpus = None
        return self


class PipelineSpec(_Strict):
    name: str = Field(description="Lowercase letters, digits and '-'; names the model and the default route.")
    data: DataSpec
    task: Optional[Literal["classification", "regression"]] = Field(
        None, description="Inferred from the label when omitted."
    )
    model: ModelSpec
    train: TrainSpec = Field(default_factory=TrainSpec)
    tune: Optional[TuneSpec] = None
    serve: Optional[ServeSpec] = None

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
        return self

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
