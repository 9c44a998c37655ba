"""The pipeline spec: the public contract users write in YAML.

Every model forbids unknown keys. `load_spec` turns a YAML file into a `PipelineSpec`
or raises `SpecError` with one line per problem, each of the form
``path.to.field: <what is wrong> (got <value>; allowed: <...>)``.

Modules, one concern each:
  pipeline_spec.py  PipelineSpec, the whole spec (and the JSON Schema made from it)
  problems.py   `Problem` (path, what, got, allowed, hint) and its one text form
  paths.py      dotted paths: rendering, walking the model tree, setting keys
  space.py      tune.space rules: tunable paths, values checked against their fields
  yaml_safe.py  YAML with duplicate-key, recursive-alias and expansion limits
  loading.py    file -> YAML -> validated spec
  overrides.py  `--set PATH=VALUE` and a trial's overrides
"""

from rayline.spec.loading import MAX_SPEC_BYTES, load_spec, parse_spec
from rayline.spec.pipeline_spec import (
    CLASSIFICATION_METRICS,
    PREPROCESS_KINDS,
    REGRESSION_METRICS,
    SKLEARN_DATASETS,
    AuthSpec,
    BatchingSpec,
    MonitoringSpec,
    DataSpec,
    ModelSpec,
    OptimizerSpec,
    PipelineSpec,
    PreprocessStep,
    ReplicasSpec,
    ResourcesSpec,
    RetrainCanarySpec,
    RetrainCompareSpec,
    RetrainSpec,
    ServeSpec,
    SourceSpec,
    SplitSpec,
    TrainSpec,
    TuneSpec,
    metric_mode,
    spec_json_schema,
)
from rayline.spec.overrides import apply_overrides, parse_set_options
from rayline.spec.problems import Problem, SpecProblem
from rayline.spec.distributions import largest_value
from rayline.spec.space import TUNABLE

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
    "MAX_SPEC_BYTES",
    "TUNABLE",
    "Problem",
    "SpecProblem",
    "load_spec",
    "parse_spec",
    "apply_overrides",
    "parse_set_options",
    "spec_json_schema",
    "metric_mode",
    "largest_value",
]
