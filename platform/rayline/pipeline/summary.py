"""What a pipeline run gives back (`RunSummary`) and the names of its stages.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["STAGES", "RunSummary"]

STAGES = ("data", "train", "register", "deploy")


@dataclass
class RunSummary:
    name: str
    version: str
    task: str
    metric: str
    valid_metrics: dict
    test_metrics: dict
    trials: list = field(default_factory=list)  # TrialOutcome
    endpoint: str | None = None
    run_id: str = ""
    rows: dict = field(default_factory=dict)
    resumed_from: list = field(default_factory=list)
    resumed_run: str | None = None  # `--resume`: the interrupted run (experiment) this one continued
    seconds: dict = field(default_factory=dict)
    # A sweep over model families: the best trial of each, best first (`leaderboard`).
    leaderboard: list = field(default_factory=list)
    data_variants: int = 1  # preprocessing configurations the data stage prepared (one data stage each)
    report: str | None = None  # the sweep report (HTML; rayline.report), written after registering a sweep
    tensorboard: str | None = None  # the run's TensorBoard event files (rayline.train.event_files), one directory per trial
    throughput: tuple | None = None  # the winner's training samples/s (total, per worker), mean over its epochs
    # Where the run's time went, phase by phase (rayline/pipeline/phases.py), as its record keeps them.
    phases: dict = field(default_factory=dict)
    # What the winner's workers trained on, as they found it ('2 workers x NVIDIA H200 (cuda)':
    # rayline/train/hardware.py); None for runs recorded before workers said.
    trained_on: str | None = None
    record_folder: str | None = None  # the run's experiment folder (its record: rayline/pipeline/record.py)
    # The new version against the serving champion on this run's test split (rayline/retrain/judge.py),
    # or why it could not be judged; None when the model had no champion.
    judgement: str | None = None
    retrain: str | None = None  # the retrain loop this run started (the spec's retrain section), a line
