"""Keeping a served model current (issue 39): judging a challenger version against the champion on
the same rows. The loop that retrains on drift, data change or a schedule builds on this."""

from rayline.retrain.judge import Judgement, judge, read_rows

__all__ = ["Judgement", "judge", "read_rows"]
