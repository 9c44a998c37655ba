"""Ray Jobs API submission: package a project, submit a pipeline as a Ray Job, list, follow, stop.

`rayline submit` and `rayline jobs ...` are thin over these modules: `package` decides what a job
ships, `auth` the token it sends, `api` where the Jobs API is and how its errors read, `submit`
the job itself (entrypoint, runtime_env, workspace on the cluster).
"""

from rayline.jobs.api import JobError, JobsClient, exit_code_for, resolve_address
from rayline.jobs.auth import load_token
from rayline.jobs.package import Package, PackageError, collect_files, human_size, stage_package
from rayline.jobs.submit import Submission, job_workspace, plan_submission, submit

__all__ = [
    "load_token",
    "JobError",
    "JobsClient",
    "exit_code_for",
    "resolve_address",
    "Package",
    "PackageError",
    "collect_files",
    "human_size",
    "stage_package",
    "Submission",
    "job_workspace",
    "plan_submission",
    "submit",
]
