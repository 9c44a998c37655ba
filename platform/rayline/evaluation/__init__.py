"""Evaluation: metrics from mergeable statistics, and a model artifact's test metrics.

`metrics` (MetricPartials, compute_metrics): the statistics of a set of predictions that merge
exactly across blocks, workers and shards; training's validation, the registered version's test
metrics and batch scoring all compute their metrics from them. `offline` (evaluate_rows): the test
metrics of a model artifact, computed with the serving Predictor where the test rows are.

The names below are `metrics`' own (what `rayline.evaluation` held when it was one module).
"""

from __future__ import annotations

from rayline.evaluation.metrics import AUC_BINS, EXACT_AUC_ROWS, MetricPartials, compute_metrics

__all__ = ["compute_metrics", "MetricPartials", "EXACT_AUC_ROWS", "AUC_BINS"]
