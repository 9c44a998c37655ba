"""Keeping a served model current (issue 39): judging a challenger version against the champion on
the same rows. The loop that retrains on drift, data change or a schedule builds on this."""

from rayline.retrain.judge import Judgement, judge, judge_on_test_split, read_rows, record_judgement

__all__ = ["Judgement", "judge", "judge_on_test_split", "record_judgement", "read_rows"]
