"""The data stage: sources, deterministic split, preprocessing fitted on train."""

from rayline.data.pipeline import PreparedData, prepare_data
from rayline.data.preprocess import FeatureInfo, FittedPreprocessing, LabelInfo

__all__ = ["PreparedData", "prepare_data", "FeatureInfo", "FittedPreprocessing", "LabelInfo"]
