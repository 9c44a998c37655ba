"""Model monitoring: training statistics saved with every version (statistics.py), and the drift of
scored data and answers against them (drift.py): batch scoring's summary, the replicas' live
windows (live.py) and the HTML drift pages (report.py)."""

from rayline.monitoring.drift import PSI_FLOOR, FeatureCounts, FeatureDrift, Thresholds, drift, psi
from rayline.monitoring.statistics import BINS, STATISTICS_FILE, CategoricalStats, NumericStats, TrainingStatistics

__all__ = ["BINS", "STATISTICS_FILE", "NumericStats", "CategoricalStats", "TrainingStatistics", "PSI_FLOOR",
           "Thresholds", "FeatureCounts", "FeatureDrift", "psi", "drift"]
