"""Offline batch scoring: a registered model over a dataset, into one Parquet file.

`score` (in `engine`) picks an engine and runs it: `local` (this process) or `on_ray` (Ray Data
and a pool of actors); both apply the same `scorer`.
"""

from __future__ import annotations

from rayline.batch.engine import ENGINES, ScoreResult, choose_engine, input_files, score
from rayline.batch.on_ray import plan_scorers
from rayline.batch.scorer import BATCH_ROWS, OUTPUT_SUFFIXES

__all__ = ["ScoreResult", "score", "plan_scorers", "input_files", "choose_engine", "ENGINES", "OUTPUT_SUFFIXES",
           "BATCH_ROWS"]
