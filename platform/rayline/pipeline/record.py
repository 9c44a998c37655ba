"""Each run's record in its experiment folder (which spec and data it trained, its MLflow run, how it
ended), and finding the run `--resume` / `rayline resume` continues.
"""

from __future__ import annotations

import json

from rayline.errors import RaylineError, SpecError
from rayline.spec import PipelineSpec
from rayline.workspace import Workspace

__all__ = ["RECORD_FILE", "training_spec", "new_record", "write_record", "check_same_data", "run_records", "resumable",
           "find_run", "interrupted_run"]

# Each run's record, in its experiment folder under the workspace's runs dir: which spec
# and data it trained, its MLflow run and how it ended. `--resume` looks for the newest
# interrupted one of a spec and checks that nothing that shapes training changed since.
RECORD_FILE = "rayline-run.json"


def training_spec(spec: PipelineSpec) -> dict:
    """The spec as it shapes training, flat (`serve` changes nothing a resumed run already did, nor
    `data.in_process`: where the data stage runs, not what it gives; records made before it existed
    resume as they were)."""
    flat: dict[str, str] = {}

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict) and value:
            for key, item in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), item)
        else:
            flat[prefix] = json.dumps(value, sort_keys=True)

    walk("", spec.model_dump(mode="json", by_alias=True, exclude_none=True,
                             exclude={"serve": True, "data": {"in_process"}}))
    return flat


def new_record(spec: PipelineSpec, *, experiment: str, spec_path: str | None, ws: Workspace, prepared: list,
               run_id: str, previous: dict | None) -> dict:
    """The record of a run starting now (status "running"), continuing `previous` when resuming.
    driver: who runs it (host, pid, start time), so a later --resume can tell a killed run from a
    live one; spec_raw: the whole spec as parsed, for `rayline resume RUN_ID` without the file."""
    import time

    from rayline.tune.resume import driver_info

    previous = previous or {}
    return {"experiment": experiment, "spec_name": spec.name, "spec_path": spec_path or "", "spec": training_spec(spec),
            "spec_raw": spec.model_dump(by_alias=True, exclude_none=True), "driver": driver_info(),
            "workspace": ws.location, "fingerprint": prepared[0].fingerprint,
            "data_cache_keys": [p.cache_key for p in prepared], "run_id": run_id,
            "created": previous.get("created", time.time()), "status": "running",
            "resumed_runs": previous.get("resumed_runs", []) + ([previous["run_id"]] if previous else [])}


def check_same_data(previous: dict, fingerprint: str) -> None:
    """A resumed run must train on the data the interrupted one did."""
    if previous.get("fingerprint") != fingerprint:
        raise SpecError([f"--resume: the data changed since the interrupted run {previous['experiment']} (fingerprint "
                         f"{previous.get('fingerprint')} then, {fingerprint} now) (allowed: the same data, "
                         "or run without --resume to start over)"])


def write_record(folder: str, record: dict) -> None:
    from rayline.storage import join, write_json

    write_json(join(folder, RECORD_FILE), record)  # never a half-written record (local path or URI)


def run_records(ws: Workspace) -> list[dict]:
    """Every run record in the workspace (runs dir: a directory, or a prefix on object storage)."""
    from rayline.storage import join, list_names, read_json

    records = []
    for name in list_names(ws.runs_dir):
        record = read_json(join(ws.runs_dir, name, RECORD_FILE))
        if isinstance(record, dict):  # else not a run folder, not ours, or from another version
            records.append(record)
    return records


def resumable(record: dict, force: bool = False) -> tuple[bool, str]:
    """Whether a record's run can be resumed now, and if not, why (a phrase). `force`: also when its
    driver is on another host (which this one cannot check); never when it is provably alive here."""
    from rayline.tune.resume import driver_state

    status = record.get("status")
    if status == "interrupted":
        return True, ""
    if status != "running":
        return False, {"registered": f"it finished (model version {record.get('version', '?')} registered)",
                       "failed": "it failed (start a new run)"}.get(status, f"its status is {status!r}")
    # "running" with no driver left: SIGKILL, the OOM killer or a crash ended it without a word.
    state, who = driver_state(record.get("driver"))
    if state == "gone" or (force and state == "unknown"):
        return True, ""
    if state == "alive":
        return False, f"its driver ({who}) is still running it (allowed: stop that process first, e.g. Ctrl-C)"
    return False, (f"it is driven by {who}, which this host cannot check: resuming while that driver runs would "
                   "have two drivers writing the same checkpoints (allowed: resume on that host, where rayline "
                   f"can tell whether its driver is gone; or, once sure it is, rayline resume {record.get('run_id')} "
                   "--force)")


def find_run(ws: Workspace, run_id: str, force: bool = False) -> dict:
    """The record of the pipeline run whose MLflow run id is `run_id`, if it can be resumed now
    (`force`: even when its driver ran on another host; see `resumable`)."""
    records = run_records(ws)
    record = next((r for r in records if r.get("run_id") == run_id), None)
    if record is None:
        later = next((r for r in records if run_id in r.get("resumed_runs", [])), None)
        if later is not None:
            raise RaylineError(f"resume: run {run_id} was resumed already, as run {later.get('run_id')} "
                               f"(allowed: rayline resume {later.get('run_id')})")
        raise RaylineError(f"resume: no run {run_id} in {ws.runs_dir} (allowed: the MLflow run id an interrupted "
                           "run printed, in the same --workspace)")
    ok, why = resumable(record, force)
    if not ok:
        raise RaylineError(f"resume: run {run_id} cannot be resumed: {why}")
    if not record.get("spec_raw"):
        raise RaylineError(f"resume: run {run_id} was recorded without its spec by an older rayline "
                           f"(allowed: rayline run {record.get('spec_path') or 'SPEC'} --resume)")
    return record


def interrupted_run(ws: Workspace, spec: PipelineSpec, run_id: str | None = None, force: bool = False) -> dict:
    """The run to resume: `run_id`'s, else the newest interrupted (or driverless) run of `spec`."""
    if run_id:
        record = find_run(ws, run_id, force)
    else:
        mine = [r for r in run_records(ws) if r.get("spec_name") == spec.name and r.get("status") in ("interrupted", "running")]
        verdicts = [(r, *resumable(r)) for r in mine]
        records = [r for r, ok, _ in verdicts if ok]
        if not records:
            busy = [f"{r.get('experiment')}: {why}" for r, ok, why in verdicts if not ok]
            raise RaylineError(f"--resume: no interrupted run of {spec.name!r} in {ws.runs_dir} "
                               + (f"that can be resumed now ({'; '.join(busy)[:600]}) " if busy else "")
                               + "(allowed: run without --resume to start a new one)")
        record = max(records, key=lambda r: r.get("created", 0))
    before, now = record.get("spec", {}), training_spec(spec)
    changed = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))
    if changed:
        shown = ", ".join(f"{k} (was {before.get(k, 'unset')}, now {now.get(k, 'unset')})" for k in changed[:5])
        raise SpecError([f"--resume: the spec changed since the interrupted run {record['experiment']}: {shown}"
                         f"{' and more' if len(changed) > 5 else ''} (allowed: the same spec and --set options, "
                         "or run without --resume to start over)"])
    # Claimed at once, with this process as its driver: a second `--resume` started while this
    # one prepares its data sees a live driver and refuses.
    from rayline.tune.resume import driver_info
    from rayline.storage import join

    write_record(join(ws.runs_dir, record["experiment"]), {**record, "status": "running", "driver": driver_info()})
    return record
