"""The pipeline spec: the public contract users write in YAML.

Every model forbids unknown keys. `load_spec` turns a YAML file into a `PipelineSpec`
or raises `SpecError` with one line per problem, each of the form
``path.to.field: <what is wrong> (got <value>; allowed: <...>)``.
"""

from __future__ import annotations

import copy
import difflib
import json
import re
import typing
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

import yaml
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, field_validator, model_validator

from rayline.data.steps import STEP_SPEC_MODELS, STEPS
from rayline.errors import SpecError
from rayline.train.catalog import BACKENDS

__all__ = [
    "PipelineSpec",
    "DataSpec",
    "SourceSpec",
    "SplitSpec",
    "ModelSpec",
    "OptimizerSpec",
    "TrainSpec",
    "TuneSpec",
    "ServeSpec",
    "ReplicasSpec",
    "AuthSpec",
    "SKLEARN_DATASETS",
    "CLASSIFICATION_METRICS",
    "REGRESSION_METRICS",
    "load_spec",
    "parse_spec",
    "apply_overrides",
    "parse_set_options",
    "spec_json_schema",
    "metric_mode",
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
    format: Literal["sklearn", "csv", "parquet", "json"] = Field(description="Where the rows come from.")
    name: Optional[str] = Field(None, description="sklearn dataset name (format: sklearn).")
    path: Optional[str] = Field(
        None, description="File, directory, glob or URI (s3://, gs://); relative to the spec file."
    )

    @model_validator(mode="after")
    def _source_fields(self):
        if self.format == "sklearn":
            if self.name not in SKLEARN_DATASETS:
                raise ValueError(
                    f"name: unknown sklearn dataset (got {self.name!r}; allowed: {', '.join(SKLEARN_DATASETS)})"
                )
            if self.path is not None:
                raise ValueError(f"path: not used with format sklearn (got {self.path!r}; allowed: name)")
        else:
            if not self.path:
                raise ValueError(f"path: required for format {self.format} (got None; allowed: a file, directory, glob or URI)")
            if self.name is not None:
                raise ValueError(f"name: only for format sklearn (got {self.name!r}; allowed: path)")
        return self


class SplitSpec(_Strict):
    valid: float = Field(0.2, gt=0, lt=1, description="Fraction of rows for validation (metric, early stopping).")
    test: float = Field(0.1, ge=0, lt=1, description="Fraction of rows held out for final test metrics.")
    seed: int = Field(0, description="Seed of the deterministic split.")

    @model_validator(mode="after")
    def _fractions(self):
        if self.valid + self.test >= 0.9:
            raise ValueError(
                f"valid + test: leaves too little to train on (got {self.valid + self.test:g}; allowed: < 0.9)"
            )
        return self


# Each preprocessing step's spec model comes from its class in data/steps.py (the registry).
PREPROCESS_KINDS = tuple(STEPS)
_STEP_MODELS = STEP_SPEC_MODELS


def _step_tag(value: Any) -> str | None:
    if isinstance(value, dict) and len(value) == 1:
        return _STEP_MODELS[next(iter(value))].__name__ if next(iter(value)) in _STEP_MODELS else None
    return type(value).__name__ if isinstance(value, tuple(_STEP_MODELS.values())) else None


# Tagged by the step's one key, so a bad step reports only its own problems.
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
                    raise ValueError(
                        f"[{i}]: each step is a mapping with one key (got {step!r}; allowed: {', '.join(PREPROCESS_KINDS)})"
                    )
                (kind,) = step
                if kind not in PREPROCESS_KINDS:
                    raise ValueError(
                        f"[{i}]: unknown preprocessing step (got {kind!r}; allowed: {', '.join(PREPROCESS_KINDS)})"
                    )
        return steps

    @field_validator("features")
    @classmethod
    def _features_unique(cls, v):
        if v is not None:
            if not v:
                raise ValueError("must name at least one column (got []; allowed: omit it for every column)")
            dupes = sorted({c for c in v if v.count(c) > 1})
            if dupes:
                raise ValueError(f"duplicate columns (got {dupes}; allowed: each column once)")
        return v

    @model_validator(mode="after")
    def _label_not_feature(self):
        if self.features and self.label in self.features:
            raise ValueError(f"features: the label is not a feature (got {self.label!r}; allowed: other columns)")
        return self


# ---------------------------------------------------------------- model and training


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
        if (self.kind is None) == (self.import_ is None):
            if not info.import_returns:
                if self.import_ is not None:
                    raise ValueError(
                        f"import: not supported for framework {self.framework} (got {self.import_!r}; allowed: kind: {kinds})"
                    )
            raise ValueError(
                f"kind: give exactly one of kind or import (got kind={self.kind!r}, import={self.import_!r}; "
                f"allowed kinds for {self.framework}: {kinds})"
            )
        if self.import_ is not None:
            if not info.import_returns:
                raise ValueError(
                    f"import: not supported for framework {self.framework} (got {self.import_!r}; allowed: kind: {kinds})"
                )
            if not re.match(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$", self.import_):
                raise ValueError(f"import: must be 'module.path:callable' (got {self.import_!r})")
            return self
        if self.kind not in info.kinds:
            raise ValueError(f"kind: unknown model kind for {self.framework} (got {self.kind!r}; allowed: {kinds})")
        allowed = info.kinds[self.kind]
        for key in self.params:
            if key not in allowed:
                raise ValueError(
                    f"params.{key}: unknown parameter for {self.framework} {self.kind} "
                    f"(got {key!r}; allowed: {', '.join(sorted(allowed))})"
                )
        return self


class OptimizerSpec(_Strict):
    name: Literal["adam", "adamw", "sgd"] = "adam"
    lr: float = Field(1e-3, gt=0, le=10, description="Learning rate.")
    momentum: float = Field(0.0, ge=0, lt=1, description="sgd only.")
    weight_decay: float = Field(0.0, ge=0)


class TrainSpec(_Strict):
    workers: int = Field(2, ge=1, le=1024, description="Ray Train workers (DDP ranks, TF replicas, xgboost workers).")
    use_gpu: bool = Field(False, description="One GPU per worker.")
    use_tpu: bool = Field(False, description="TPU workers (only where the framework supports it).")
    cpus_per_worker: Optional[float] = Field(
        None, gt=0, description="Logical CPUs per worker; default: planned from the cluster so nothing stalls."
    )
    epochs: int = Field(10, ge=1, le=100_000, description="Epochs (torch, tensorflow); boosting rounds default for xgboost.")
    batch_size: int = Field(64, ge=1, description="Global batch size, split across workers.")
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec)
    metric: Optional[str] = Field(None, description="Validation metric choosing the best checkpoint and trial.")
    max_failures: int = Field(2, ge=0, description="Worker-group restarts from the latest checkpoint.")

    @model_validator(mode="after")
    def _accelerator(self):
        if self.use_gpu and self.use_tpu:
            raise ValueError("use_tpu: choose one accelerator (got use_gpu: true and use_tpu: true; allowed: one of them)")
        return self


# ---------------------------------------------------------------- tuning and serving

Distribution = dict[str, Any]
_DISTRIBUTIONS = ("loguniform", "uniform", "randint", "choice", "grid")


class TuneSpec(_Strict):
    num_samples: int = Field(8, ge=1, le=10_000, description="Trials (times each grid combination).")
    max_concurrent: int = Field(2, ge=1, description="Trials running at once (lowered to what the cluster fits).")
    scheduler: Literal["asha", "fifo"] = "asha"
    search: Literal["random", "grid"] = "random"
    space: dict[str, Distribution] = Field(min_length=1, description="Dotted spec path -> distribution.")

    @field_validator("space")
    @classmethod
    def _distributions(cls, space):
        for path, dist in space.items():
            if not isinstance(dist, dict) or len(dist) != 1 or next(iter(dist)) not in _DISTRIBUTIONS:
                raise ValueError(
                    f"{path}: a distribution is one of {{{', '.join(k + ': ...' for k in _DISTRIBUTIONS)}}} "
                    f"(got {dist!r}; allowed: {', '.join(_DISTRIBUTIONS)})"
                )
            (kind, args), = dist.items()
            if kind in ("loguniform", "uniform", "randint"):
                ok = (
                    isinstance(args, list) and len(args) == 2
                    and all(isinstance(a, (int, float)) and not isinstance(a, bool) for a in args)
                    and args[0] < args[1]
                )
                if kind == "loguniform" and ok:
                    ok = args[0] > 0
                if kind == "randint" and ok:
                    ok = all(isinstance(a, int) for a in args)
                if not ok:
                    raise ValueError(
                        f"{path}.{kind}: needs [low, high] with low < high"
                        f"{' and low > 0' if kind == 'loguniform' else ''}"
                        f"{' as integers' if kind == 'randint' else ''} (got {args!r})"
                    )
            elif not isinstance(args, list) or not args:
                raise ValueError(f"{path}.{kind}: needs a non-empty list of values (got {args!r})")
        return space

    @model_validator(mode="after")
    def _grid_search(self):
        if self.search == "grid":
            bad = [p for p, d in self.space.items() if next(iter(d)) not in ("grid", "choice")]
            if bad:
                raise ValueError(
                    f"space.{bad[0]}: search grid needs discrete values (got {next(iter(self.space[bad[0]]))}; allowed: grid, choice)"
                )
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
            raise ValueError(f"max: must be >= min (got max={self.max}, min={self.min})")
        return self


class ResourcesSpec(_Strict):
    cpus: float = Field(0.25, ge=0, description="Logical CPUs each replica reserves (fractions allowed).")
    gpus: float = Field(0.0, ge=0, description="GPUs each replica reserves (fractions share one GPU).")

    @model_validator(mode="after")
    def _something(self):
        if self.cpus == 0 and self.gpus == 0:
            raise ValueError("a replica must reserve some CPU or GPU (got cpus: 0, gpus: 0; allowed: cpus > 0 or gpus > 0)")
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
            raise ValueError("not an environment variable name (got a value that is not shown; "
                             "allowed: letters, digits and '_', not starting with a digit, e.g. RAYLINE_API_KEYS)")
        return v

    @model_validator(mode="after")
    def _one_source(self):
        given = [k for k in ("api_keys_env", "api_keys_file") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of api_keys_env or api_keys_file (got {given or 'neither'}; "
                             f"allowed: api_keys_env: VAR or api_keys_file: PATH)")
        if self.api_keys_file is not None and not self.api_keys_file.strip():
            raise ValueError("api_keys_file: empty path (got ''; allowed: a file path)")
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
    auth: Optional[AuthSpec] = Field(None, description="API keys required on every route but GET /health.")

    @field_validator("route")
    @classmethod
    def _route(cls, v):
        if v is not None and (not v.startswith("/") or v == "/" or v.endswith("/") or " " in v):
            raise ValueError(f"must start with '/', not end with '/', and hold no spaces (got {v!r}; allowed: e.g. /digits)")
        return v

    @model_validator(mode="after")
    def _deprecated_replica_cpus(self):
        # `replicas.cpus` (before resources_per_replica existed) still works and moves over.
        cpus = self.replicas.cpus
        if cpus is not None:
            if "resources_per_replica" in self.model_fields_set and self.resources_per_replica.cpus != cpus:
                raise ValueError(
                    f"replicas.cpus: deprecated, and it contradicts resources_per_replica.cpus (got {cpus:g} and "
                    f"{self.resources_per_replica.cpus:g}; allowed: only resources_per_replica.cpus)"
                )
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

    @field_validator("name")
    @classmethod
    def _name(cls, v):
        if not _NAME_RE.match(v) or len(v) > 63:
            raise ValueError(f"lowercase letters, digits and '-', at most 63 (got {v!r}; allowed: e.g. digits-mlp)")
        return v

    @model_validator(mode="after")
    def _cross_checks(self):
        info = BACKENDS[self.model.framework]
        want = "tpu" if self.train.use_tpu else "gpu" if self.train.use_gpu else "cpu"
        if want not in info.accelerators:
            raise ValueError(
                f"train.use_{want}: framework {self.model.framework} cannot train on {want.upper()} with Ray Train "
                f"(got use_{want}: true; supported: {', '.join(sorted(info.accelerators))})"
            )
        if self.train.metric is not None:
            allowed = {
                "classification": CLASSIFICATION_METRICS,
                "regression": REGRESSION_METRICS,
                None: tuple(dict.fromkeys(CLASSIFICATION_METRICS + REGRESSION_METRICS)),
            }[self.task]
            if self.train.metric not in allowed:
                raise ValueError(
                    f"train.metric: unknown metric{' for ' + self.task if self.task else ''} "
                    f"(got {self.train.metric!r}; allowed: {', '.join(allowed)})"
                )
        if self.tune is not None:
            problems = [p for p in (_check_space_path(self, path) for path in self.tune.space) if p]
            if problems:
                raise ValueError(problems[0])
        return self

    @property
    def route(self) -> str:
        return (self.serve.route if self.serve and self.serve.route else f"/{self.name}")

    def resolved_metric(self, task: str) -> str:
        return self.train.metric or ("accuracy" if task == "classification" else "rmse")


# ---------------------------------------------------------------- paths into the spec


def _check_space_path(spec: PipelineSpec, path: str) -> str | None:
    """None if `path` names a tunable field of the spec, else the problem."""
    parts = path.split(".")
    if parts[0] in ("name", "data", "tune", "serve", "task"):
        return f"tune.space.{path}: not tunable (got {path!r}; allowed: paths under train. or model.params.)"
    if parts[:2] == ["model", "params"] and len(parts) == 3:
        if spec.model.import_ is not None:
            return None  # a custom model takes whatever params it declares
        allowed = BACKENDS[spec.model.framework].kinds[spec.model.kind]
        if parts[2] in allowed:
            return None
        return (
            f"tune.space.{path}: no such parameter for {spec.model.framework} {spec.model.kind} "
            f"(got {parts[2]!r}; allowed: {', '.join('model.params.' + a for a in sorted(allowed))})"
        )
    node: Any = PipelineSpec
    for i, part in enumerate(parts):
        fields = getattr(node, "model_fields", None)
        if not fields or part not in fields:
            where = ".".join(parts[:i]) or "the spec"
            allowed = sorted(fields) if fields else []
            hint = difflib.get_close_matches(part, allowed, n=1)
            return (
                f"tune.space.{path}: no field {part!r} in {where} (got {path!r}; allowed: "
                f"{', '.join('.'.join(parts[:i] + [a]) for a in allowed) or 'nothing'})"
                + (f"; did you mean {'.'.join(parts[:i] + hint)!r}?" if hint else "")
            )
        node = _model_class(fields[part].annotation)
    if getattr(node, "model_fields", None):
        return f"tune.space.{path}: names a section, not a value (got {path!r}; allowed: one of its fields)"
    return None


def _model_class(annotation):
    """The BaseModel class inside an annotation such as Optional[X], or the annotation."""
    for arg in (annotation, *typing.get_args(annotation)):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return annotation


def apply_overrides(spec: PipelineSpec, overrides: dict[str, Any]) -> PipelineSpec:
    """A copy of `spec` with each dotted path set to its value, validated again."""
    raw = spec.model_dump(by_alias=True, exclude_none=True)
    _set_paths(raw, overrides, "overrides")
    return parse_spec(raw, source="overrides")


def _set_paths(raw: dict, overrides: dict[str, Any], source: str) -> None:
    for path, value in overrides.items():
        node = raw
        *parents, leaf = path.split(".")
        keys = parents + [leaf]
        for depth, p in enumerate(parents):
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                where = ".".join(keys[: depth + 1])
                raise SpecError([f"{path}: {where} is not a mapping, so it has no key {keys[depth + 1]!r} (got {node!r})"], source)
        node[leaf] = copy.deepcopy(value)


def parse_set_options(items: list[str]) -> dict[str, Any]:
    """`--set PATH=VALUE` options as overrides; VALUE is YAML (`2`, `0.01`, `[64, 32]`, `adam`)."""
    overrides: dict[str, Any] = {}
    for item in items:
        path, sep, text = item.partition("=")
        if not sep or not path.strip():
            raise SpecError([f"--set: expected PATH=VALUE such as train.epochs=2 (got {item!r})"])
        try:
            overrides[path.strip()] = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise SpecError([f"--set {path.strip()}: the value is not valid YAML (got {text!r}): {getattr(exc, 'problem', exc)}"]) from None
    return overrides


# ---------------------------------------------------------------- loading and errors


def parse_spec(raw: Any, source: str | None = None) -> PipelineSpec:
    if not isinstance(raw, dict):
        raise SpecError([f"(top level): expected a mapping of spec keys (got {type(raw).__name__}; allowed: name, data, task, model, train, tune, serve)"], source)
    try:
        return PipelineSpec.model_validate(raw)
    except ValidationError as exc:
        raise SpecError([_format_error(err) for err in exc.errors()], source) from None


def load_spec(path: str | Path, check_data: bool = True, overrides: dict[str, Any] | None = None) -> PipelineSpec:
    """Read, validate and resolve a spec file; with `check_data`, also check it against its data.

    Relative data paths resolve against the spec file's directory. `overrides` (dotted
    path -> value, from `--set`) are applied before validation, so they are checked too.
    """
    path = Path(path)
    if not path.is_file():
        raise SpecError([f"(file): no such spec file (got {str(path)!r})"])
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise SpecError([f"(yaml): {where}{getattr(exc, 'problem', None) or exc}"], str(path)) from None
    if overrides and isinstance(raw, dict):  # a non-mapping file fails in parse_spec below
        _set_paths(raw, overrides, str(path))
    spec = parse_spec(raw, source=str(path))
    src = spec.data.source
    if src.path and "://" not in src.path and not Path(src.path).is_absolute():
        resolved = str((path.parent / src.path).resolve())
        spec = spec.model_copy(update={"data": spec.data.model_copy(update={"source": src.model_copy(update={"path": resolved})})})
    keys_file = spec.serve.auth.api_keys_file if spec.serve and spec.serve.auth else None
    if keys_file and not Path(keys_file).expanduser().is_absolute():  # replicas run elsewhere: pass an absolute path
        auth = spec.serve.auth.model_copy(update={"api_keys_file": str((path.parent / keys_file).resolve())})
        spec = spec.model_copy(update={"serve": spec.serve.model_copy(update={"auth": auth})})
    if check_data:
        from rayline.data.schema_check import check_spec_against_data

        problems = check_spec_against_data(spec)
        if problems:
            raise SpecError(problems, str(path))
    return spec


def spec_json_schema() -> dict:
    schema = PipelineSpec.model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "rayline pipeline spec"
    return schema


def _format_error(err: dict) -> str:
    loc = [str(p) for p in err["loc"]]
    # Drop pydantic's union-member labels (e.g. 'ImputeStep') from the path.
    loc = [p for p in loc if not (p[:1].isupper() and p.endswith("Step"))]
    path = _dotted(loc)
    kind = err["type"]
    got = err.get("input")
    if kind == "extra_forbidden":
        allowed = _allowed_keys(loc[:-1])
        hint = difflib.get_close_matches(loc[-1], allowed, n=1)
        return (
            f"{path}: unknown key (got {loc[-1]!r}; allowed: {', '.join(allowed) or 'none'})"
            + (f"; did you mean {hint[0]!r}?" if hint else "")
        )
    if kind == "missing":
        return f"{path}: required field is missing"
    msg = err["msg"]
    if kind == "value_error":
        msg = msg.removeprefix("Value error, ")
        # Our validators start with a relative sub-path ("name: ..." or "[0]: ...").
        # Top-level validators already give full paths.
        m = re.match(r"^(\[\d+\]|[\w.]+)(:\s)", msg)
        if not path:
            return msg
        if m:
            sub = m.group(1)
            return f"{path}{sub if sub.startswith('[') else '.' + sub}: {msg[m.end():]}"
        return f"{path}: {msg}"
    return f"{path}: {msg} (got {_short(got)})"


def _dotted(loc: list[str]) -> str:
    out = ""
    for p in loc:
        out += f"[{p}]" if p.isdigit() else (("." if out else "") + p)
    return out


def _allowed_keys(loc: list[str]) -> list[str]:
    node: Any = PipelineSpec
    for part in loc:
        if part.isdigit():
            continue
        if part in _STEP_MODELS and loc[0] == "data":
            node = _model_class(_STEP_MODELS[part].model_fields[part].annotation)  # the step's parameters
            continue
        fields = getattr(node, "model_fields", None)
        if not fields or part not in fields:
            return []
        node = _model_class(fields[part].annotation)
        if typing.get_origin(fields[part].annotation) is list:
            args = typing.get_args(fields[part].annotation)
            node = _model_class(args[0]) if args else node
    fields = getattr(node, "model_fields", None) or {}
    return [f.alias or name for name, f in fields.items()]


def _short(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
