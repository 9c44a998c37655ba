"""The pipeline: its stages run in a straight line, data -> train or tune -> register -> deploy.

One module a job: `run` (`run_pipeline`, the stages in order), `record` (each run's record and
finding the run to resume), `plan` (resource planning that waits for the cluster to settle),
`summary` (what a run gives back). Nothing is imported here.
"""
