"""The pipeline: its stages run in a straight line, data -> train or tune -> register -> deploy.

One module a job: `run` (`run_pipeline`, the conveyor: hands each stage what it needs, keeps the
run's record, cleans up after an interruption), one module per stage (`prepare`: the data stage;
`training`: the resource plan and the train or tune stage; `register`: trials, artifact, test
metrics, model version; `deploy`: champion or canary, from the serve section alone), `record`
(each run's record and finding the run to resume), `plan` (resource planning that waits for the
cluster to settle), `summary` (what a run gives back). Nothing is imported here.
"""
