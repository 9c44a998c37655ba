"""The spec's `model:` and `train:` sections, and the rules each framework sets on them (accelerators,
precisions, strategies, gradient compression, elastic workers, resources).
"""

from __future__ import annotations

import difflib
import math
import re
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from rayline.frameworks import BACKENDS
from rayline.spec.common import Strict
from rayline.spec.problems import Problem, SpecProblem, problem, short

__all__ = ["ModelSpec", "OptimizerSpec", "WorkersRange", "GRAD_COMPRESSIONS", "GradCompression",
           "ray_accelerator_types", "TrainSpec"]

_IMPORT_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")

# Frameworks that distributed-ML surveys name and rayline does not train with: why, and what to use.
_RETIRED_FRAMEWORKS = {
    "mxnet": "Apache MXNet was retired to the Apache Attic in 2023 and gets no releases or fixes; port the model "
             "to torch (Gluon's layers have torch.nn counterparts) or tensorflow",
    "cntk": "Microsoft CNTK has not been developed since 2019 (its last release, 2.7); port the model to torch "
            "or tensorflow (ONNX can carry the weights across)",
}
# Ways of distributing training that are settings, not frameworks: what rayline does instead.
_ALLREDUCE = ("rayline trains with ring all-reduce already: torch DDP (or FSDP: train.strategy), TensorFlow's "
              "MultiWorkerMirroredStrategy and xgboost's collective, over train.workers; no parameter servers")
_DISTRIBUTION_NAMES = {"horovod": "Horovod", "parameter_server": "a parameter server",
                       "parameter-server": "a parameter server", "ps": "a parameter server"}


def _not_a_framework(value) -> Optional[Problem]:
    name = value.strip().lower() if isinstance(value, str) else None
    if name in _RETIRED_FRAMEWORKS:
        return Problem((), _RETIRED_FRAMEWORKS[name], got=repr(value), allowed=", ".join(BACKENDS))
    if name in _DISTRIBUTION_NAMES:
        return Problem((), f"{_DISTRIBUTION_NAMES[name]} is a way to distribute training, not a framework: {_ALLREDUCE}",
                       got=repr(value), allowed=", ".join(BACKENDS))
    return None


class ModelSpec(Strict):
    framework: Literal["torch", "tensorflow", "xgboost"] = Field(
        description="Which training backend. MXNet and CNTK are retired (port to torch or tensorflow); Horovod's "
                    "ring all-reduce is how every backend already trains over train.workers.")
    kind: Optional[str] = Field(None, description="A built-in model: mlp (torch, tensorflow); cnn (image features), "
                                                 "text_cnn or transformer (text features), each with any tabular ones "
                                                 "(torch, tensorflow); gbdt (xgboost).")
    import_: Optional[str] = Field(
        None,
        alias="import",
        description="'module:callable' -> callable(num_features, num_outputs, **params) returning the model; "
                    "a callable with an `input_schema` parameter also gets where each image's pixels lie "
                    "(images: name, start, stop, shape; tabular: positions).",
    )
    params: dict[str, Any] = Field(default_factory=dict, description="Passed to the model builder.")

    @field_validator("framework", mode="before")
    @classmethod
    def _known_framework(cls, v):
        found = _not_a_framework(v)
        if found is not None:
            raise SpecProblem(found)
        return v

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


class OptimizerSpec(Strict):
    name: Literal["adam", "adamw", "sgd"] = "adam"
    lr: float = Field(1e-3, gt=0, le=10, description="Learning rate.")
    momentum: float = Field(0.0, ge=0, lt=1, description="sgd only.")
    weight_decay: float = Field(0.0, ge=0)


class WorkersRange(Strict):
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


class GradCompression(Strict):
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


class TrainSpec(Strict):
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
    in_process: Literal["auto", "never"] = Field(
        "auto", description="auto: a run of one CPU worker (torch, xgboost) on a one-node Ray trains in the driver's process (a trial's, "
                            "in a sweep), without Ray Train's controller and worker processes (13 s less per run); "
                            "so do N plain-DDP CPU workers of a small run (train rows x epochs up to 1,000,000), as "
                            "one process with the N workers' CPUs as threads (same global batch and steps; the start "
                            "line says so); max_failures retries a failed attempt there, but the process's own death "
                            "ends the run (--resume goes on). never: always a Train worker group "
                            "(rayline/train/in_process.py).")
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
    in_memory: Literal["auto", "always", "never"] = Field(
        "auto", description="How a torch or tensorflow worker holds its train shard: always fetched once into memory, "
                            "batches sliced there with a fresh permutation each epoch (fast for small rows); never: "
                            "streamed from Ray Data every epoch; auto: in memory when the shard takes at most half "
                            "of the worker's memory budget. The choice is recorded with each run.")

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

    @field_validator("strategy", mode="before")
    @classmethod
    def _no_parameter_servers(cls, v):
        name = v.strip().lower() if isinstance(v, str) else None
        if name in _DISTRIBUTION_NAMES:
            raise SpecProblem(Problem((), f"{_DISTRIBUTION_NAMES[name]}: {_ALLREDUCE}", got=repr(v), allowed="ddp, fsdp"))
        return v

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
