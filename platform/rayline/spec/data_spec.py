"""The spec's `data:` section: the source, the split and the preprocessing steps.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from rayline.data.feature_types import FEATURE_TYPES
from rayline.data.steps import STEP_SPEC_MODELS, STEPS
from rayline.spec.common import SKLEARN_DATASETS, Strict
from rayline.spec.problems import problem

__all__ = ["SourceSpec", "SplitSpec", "PREPROCESS_KINDS", "PreprocessStep", "DataSpec"]


class SourceSpec(Strict):
    format: Literal["sklearn", "csv", "parquet", "json", "image_folder"] = Field(
        description="Where the rows come from. json: a JSON array of row objects, or JSON Lines (.json, .jsonl, .ndjson). "
                    "image_folder: a directory with one subfolder per class; rows `image` (the file's bytes) and "
                    "`label` (the folder's name).")
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


class SplitSpec(Strict):
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


class DataSpec(Strict):
    source: SourceSpec
    label: str = Field(description="The column to predict.")
    features: Optional[list[str]] = Field(None, description="Default: every column except the label.")
    split: SplitSpec = Field(default_factory=SplitSpec)
    preprocess: list[PreprocessStep] = Field(default_factory=list, description="Fitted on the train split only.")
    in_process: Literal["auto", "never"] = Field(
        "auto", description="auto: local CSV, Parquet or JSON files or an image folder of at most 64 MB in all, and "
                            "sklearn's bundled sets, are read, split and transformed in the run's own process, "
                            "without Ray Data's tasks (seconds less per run; the data line says so); larger data and "
                            "URIs stream through Ray Data. never: always Ray Data (rayline/data/in_process.py).")
    feature_types: dict[str, Literal[FEATURE_TYPES]] = Field(
        default_factory=dict,
        description="A feature's type where it is not inferred: numeric, categorical, text or image. Number and "
                    "boolean columns are numeric and binary columns images unless stated; a string column must be "
                    "stated or named by a step. A stated column no step names gets its default step: one_hot, text, "
                    "or image at the first image's size (at most 224 pixels a side). An image column of strings "
                    "holding file paths is read from those files (relative to the table's folder).")

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
        if self.label in self.feature_types:
            raise problem(("feature_types", self.label), "the label is not a feature", got=repr(self.label),
                          allowed="feature columns")
        if self.features:
            for col in self.feature_types:
                if col not in self.features:
                    raise problem(("feature_types", col), "not in data.features", got=repr(col),
                                  allowed=", ".join(self.features[:20]))
        return self
