"""A sweep's leaderboard of model families: the best trial of each family, best first (H2O AutoML style)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FamilyBest", "family_leaderboard"]


@dataclass
class FamilyBest:
    family: str  # "torch/mlp", "xgboost/gbdt"
    trial_id: str
    value: float  # the sweep's metric on the validation split, at the trial's best epoch
    trials: int  # trials of this family that reported the metric
    overrides: dict


def family_leaderboard(trials: list, metric: str, mode: str) -> list[FamilyBest]:
    """The best trial of each family that reported `metric`, best family first (`mode`: max or min)."""
    sign = 1 if mode == "max" else -1
    best: dict[str, FamilyBest] = {}
    for trial in trials:
        if trial.result is None or metric not in trial.result.metrics:
            continue
        family = trial.family or "unknown"
        value = float(trial.result.metrics[metric])
        held = best.get(family)
        count = (held.trials if held else 0) + 1
        if held is None or sign * value > sign * held.value:
            best[family] = FamilyBest(family, trial.trial_id, value, count, dict(trial.overrides))
        else:
            held.trials = count
    return sorted(best.values(), key=lambda row: -sign * row.value)
