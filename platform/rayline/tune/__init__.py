"""The tune stage: Ray Tune sweeps over a spec, each trial a full Ray Train run.

One module a job, in the order data flows:

- `clock`: the units a trial trains (`TIME_ATTR`, `total_units`) and the defaults derived from them;
- `schedulers`: tune.scheduler (ASHA, FIFO, median stopping, PBT), one class each, registered in SCHEDULERS;
- `searchers`: tune.search (random, grid, Optuna TPE), one class each, registered in SEARCHERS;
- `handoff`: PBT's exploit, a checkpoint handed from one trial's Train run to another's;
- `sweep`: `tune_pipeline`, the stage itself;
- `decisions`: why each trial ended and what the scheduler did to it;
- `leaderboard`: the best trial of each model family.

The spec imports `schedulers` and `searchers` (their parameters are spec sections); neither imports
the sweep, so the stage's modules import the spec and never the other way round. Nothing is
imported here: `import rayline.tune.schedulers` from the spec loads that module alone.
"""
