"""Model monitoring: training statistics saved with every version, and drift of scored data
against them (issue 26: batch scoring's summary; live windows on the replicas are next)."""

from rayline.monitoring.drift import PSI_FLOOR, FeatureCounts, FeatureDrift, Thresholds, drift, psi
from rayline.monitoring.statistics import BINS, STATISTICS_FILE, CategoricalStats, NumericStats, TrainingStatistics

__all__ = ["BINS", "STATISTICS_FILE", "NumericStats", "CategoricalStats", "TrainingStatistics", "PSI_FLOOR",
           "Thresholds", "FeatureCounts", "FeatureDrift", "psi", "drift"]
