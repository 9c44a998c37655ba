"""Keeping a served model current (issue 39): judging a challenger version against the champion on
the same rows (judge.py), and the loop that retrains on drift, data change or a schedule and rolls a
qualifying challenger out as a gated canary (loop.py; its decisions in decisions.py). The loop is
imported from rayline.retrain.loop where it is used: it is not needed to judge."""

from rayline.retrain.judge import Judgement, judge, judge_on_test_split, read_rows, record_judgement

__all__ = ["Judgement", "judge", "judge_on_test_split", "record_judgement", "read_rows"]
