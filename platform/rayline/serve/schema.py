"""Request and response models generated from the training feature schema.

Numeric features take JSON numbers only (no strings, no booleans, no NaN); categorical
features take their training categories only when the one-hot step says
`handle_unknown: error`; imputed features may be null or omitted; unknown features are
rejected. FastAPI turns any violation into a 422 naming the field.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, Strict, create_model

from rayline.data.preprocess import FeatureInfo, FittedPreprocessing

__all__ = ["build_request_model", "feature_type", "PredictResponse"]

Number = Annotated[float, Strict(), Field(allow_inf_nan=False)]


def feature_type(feature: FeatureInfo) -> Any:
    if feature.categories is not None and feature.unknown == "error":
        base: Any = Literal[tuple(feature.categories)]
    elif feature.kind in ("integer", "number"):
        base = Number
    elif feature.kind == "boolean":
        base = Annotated[bool, Strict()]
    else:
        base = Annotated[str, Strict()]
    return Optional[base] if feature.nullable else base


def build_request_model(preprocessing: FittedPreprocessing, max_instances: int = 10_000) -> type[BaseModel]:
    fields: dict[str, Any] = {}
    for index, feature in enumerate(preprocessing.features):
        default = None if feature.nullable else ...
        description = f"{feature.kind}{', nullable (imputed)' if feature.nullable else ''}"
        if feature.categories is not None:
            description += f"; categories seen in training: {feature.categories}"
        fields[f"f{index}"] = (feature_type(feature), Field(default, alias=feature.name, description=description))
    instance = create_model(
        "Instance", __config__=ConfigDict(extra="forbid", populate_by_name=False), **fields
    )
    return create_model(
        "PredictRequest",
        __config__=ConfigDict(extra="forbid"),
        instances=(list[instance], Field(min_length=1, max_length=max_instances, description="Rows to predict.")),
        probabilities=(bool, Field(False, description="Also return class probabilities (classification).")),
    )


class PredictResponse(BaseModel):
    predictions: list[Union[str, int, float, bool]]
    probabilities: Optional[list[dict[str, float]]] = None
    model: str
    version: str
