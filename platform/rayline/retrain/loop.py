"""The retrain loop of one served model: a detached Ray actor on the cluster that watches the
champion's drift, the data source and the clock, and when the spec's `retrain` section says so,
retrains, reads the challenger's judgement and rolls it out as a gated canary, promoted when it
stays within its limits (decisions.py decides; this module gathers and acts).

Why an actor, not a thread of `rayline run`: it outlives the command that started it on a cluster
(`lifetime="detached"`), Ray restarts it when its process or node dies (`max_restarts=-1`; it runs
on the head node, where a worker node's death or scale-down never reaches it: nodes.py), and
its name (`rayline-retrain-NAME` in namespace `rayline`, `get_if_exists`) makes a second start find
the first: one loop per model. Its record is a registered-model tag (RETRAIN_LOOP_TAG), written at
every change of state, so a restarted loop picks up where it was: a canary it was watching is
still watched, a retrain it started is found by the id its version carries (RETRAIN_TAG).

A retrain is `rayline run SPEC --no-serve` in a subprocess of the actor (its pid and node recorded:
a loop restarted on another node asks that node whether it still runs), a driver of its own on the
same cluster: the pipeline's stages, its data cache (an unchanged data stage is free) and its
register stage, which judges the new version against the champion on the new run's test split
with `retrain.compare` (rayline/pipeline/register.py) and records the reason it was given.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from typing import Optional

from rayline.retrain.decisions import add_decision, backoff_s, canary_verdict, due, new_record, note_drift
from rayline.retrain.nodes import ON_THE_HEAD, here, process_alive
from rayline.retrain.reason import RETRAIN_REASON_ENV

__all__ = ["LOOP_NAMESPACE", "loop_name", "start_loop", "start_loop_line", "start_for_version", "loop_status", "stop_loop",
           "RetrainLoop"]

LOOP_NAMESPACE = "rayline"
_TAIL_CHARS = 400  # of a failed retrain's output, in its decision
RECORD_CHARS = 4800  # MLflow keeps at most 5000 characters of a registered model's tag value

log = logging.getLogger("rayline.retrain")


def loop_name(model: str) -> str:
    return f"rayline-retrain-{model}"


def _iso(now: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))


class RetrainLoop:
    """The actor's class (made remote by start_loop). Its thread does the work; the methods answer."""

    def __init__(self, name: str, spec_raw: dict, workspace: str, tracking_uri: Optional[str]):
        from rayline.spec import parse_spec
        from rayline.workspace import workspace as open_workspace

        self.name, self.spec_raw = name, spec_raw
        self.spec = parse_spec(spec_raw, source=f"the retrain loop of {name}")
        self.ws = open_workspace(workspace, tracking_uri)
        self.waiting, self.error = "starting", None
        self.proc: Optional[subprocess.Popen] = None
        self.record = self._load_record()
        self._published = json.loads(json.dumps(self.record))
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._counter = None
        threading.Thread(target=self._run, name=f"rayline-retrain-{name}", daemon=True).start()

    # ---------------------------------------------------------------- methods

    def status(self) -> dict:
        # The record as last saved: never waits for the loop's thread (a deploy takes it for seconds).
        return {"model": self.name, "record": self._published, "waiting": self.waiting, "error": self.error,
                "pid": os.getpid()}

    def update_spec(self, spec_raw: dict) -> None:
        """A second start with a changed spec: the running loop follows the new one."""
        from rayline.spec import parse_spec

        spec = parse_spec(spec_raw, source=f"the retrain loop of {self.name}")
        with self._lock:
            if spec_raw != self.spec_raw and self.record.get("failures"):
                # A changed spec may be the fix for what failed: its retrains are tried afresh.
                self.record.update(failures=0, retry_after=None, tried=None)
                self._save()
            self.spec, self.spec_raw = spec, spec_raw

    def stop(self, why: str = "stopped") -> None:
        """Stop for good: a running retrain is terminated, the record says stopped, the actor exits
        (an intended exit: Ray does not restart it)."""
        import ray

        self._stop.set()
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        else:
            self._stop_inherited()
        with self._lock:
            self.record["state"] = "stopped"
            self._decide("stopped", why, None)
            self._save()
        ray.actor.exit_actor()

    def _stop_inherited(self) -> None:
        """A retrain this loop found running when it restarted (not its child: no Popen to wait on),
        on this node: its process group gets SIGTERM, as `rayline run` takes a Ctrl-C. One on
        another node is left to finish: it registers a version that nothing deploys."""
        current = self.record.get("current") or {}
        pid = current.get("pid")
        if self.record.get("state") != "retraining" or not pid or current.get("node") not in (None, here()):
            return
        try:
            os.killpg(pid, signal.SIGTERM)  # started with start_new_session: its group is its pid
        except (ProcessLookupError, PermissionError):
            pass  # ended already (or the number is another user's now)

    # ---------------------------------------------------------------- the record

    def _registry(self):
        from rayline.registry import Registry

        return Registry(self.ws)

    def _load_record(self) -> dict:
        from rayline.registry import RETRAIN_LOOP_TAG

        raw = self._registry().model_tag(self.name, RETRAIN_LOOP_TAG)
        record = json.loads(raw) if raw else None
        if not record or record.get("state") == "stopped":  # a stopped loop started again starts afresh
            kept = (record or {}).get("decisions") or []
            record = new_record(time.time(), self.spec.retrain.every)
            record["decisions"] = kept
        return record

    def _save(self) -> None:
        from rayline.registry import RETRAIN_LOOP_TAG

        text = json.dumps(self.record)
        while len(text) > RECORD_CHARS and self.record.get("decisions"):  # MLflow's limit on a tag's value
            self.record["decisions"].pop(0)
            text = json.dumps(self.record)
        self._registry().set_model_tag(self.name, RETRAIN_LOOP_TAG, text)
        self._published = json.loads(text)

    def _decide(self, decision: str, why: str, version: Optional[str]) -> None:
        entry = add_decision(self.record, _iso(time.time()), decision, why, version)
        log.warning("rayline retrain %s: %s%s: %s", self.name, decision, f" version {version}" if version else "", why)
        try:
            if self._counter is None:
                from ray.util.metrics import Counter

                self._counter = Counter("rayline_retrain_decisions", description="Decisions of the retrain loop, "
                                        "per model and decision.", tag_keys=("model", "decision"))
            self._counter.inc(1, tags={"model": self.name, "decision": decision})
        except Exception:  # noqa: BLE001 - metrics are best effort; the record holds the decision
            pass
        return entry

    # ---------------------------------------------------------------- the work

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with self._lock:
                    self._tick(time.time())
                self.error = None
            except Exception as exc:  # noqa: BLE001 - one bad look (MLflow busy, a node gone) is retried
                self.error = f"{type(exc).__name__}: {' '.join(str(exc).split())[:400]}"
                log.warning("rayline retrain %s: %s", self.name, self.error)
            self._stop.wait(self._poll_s())

    def _poll_s(self) -> float:
        # Busy states are followed closely (a subprocess, a canary's counts); watching at check_every.
        return 1.0 if self.record.get("state") in ("retraining", "canary") else self.spec.retrain.check_every

    def _tick(self, now: float) -> None:
        state = self.record.get("state")
        if state == "retraining":
            self._follow_retrain(now)
        elif state == "canary":
            self._follow_canary(now)
        else:
            self._watch(now)

    def _watch(self, now: float) -> None:
        registry, retrain = self._registry(), self.spec.retrain
        champion = registry.alias_version(self.name, "champion")
        if champion is None:
            self.waiting = "no champion deployed yet"
            return
        drift = None
        if "drift" in retrain.on:
            from rayline.monitoring.live import latest_report

            drift = latest_report(self.name, champion)
            before = self.record.get("drift_since")
            note_drift(self.record, bool(drift) and drift.get("status") == "drifting", now)
            if before != self.record.get("drift_since"):
                self._save()
        from rayline.data.fingerprint import fingerprint as source_fingerprint

        # Always: a failed retrain remembers the data it failed on (decisions.py, MAX_FAILURES_SAME_DATA).
        trained_on, unreadable = None, ""
        try:
            fingerprint = source_fingerprint(self.spec.data.source)
        except Exception as exc:  # noqa: BLE001 - an unreadable source is said, and looked at again
            fingerprint, unreadable = None, f"the source cannot be read: {' '.join(str(exc).split())[:300]}"
        if "data_change" in retrain.on:
            mv, _ = registry.version_details(self.name, champion)
            trained_on = (mv.tags or {}).get("data_fingerprint")
        trigger, waiting = due(retrain, self.record, now, drift=drift, fingerprint=fingerprint, trained_on=trained_on)
        if trigger is None:
            self.waiting = "; ".join(w for w in (waiting, unreadable) if w) or "watching"
            return
        current = {"id": uuid.uuid4().hex[:12], **trigger.to_dict(), "started": now, "fingerprint": fingerprint,
                   "champion": champion, "version": None, "rollout": None}
        self.record.update(state="retraining", current=current, last_started=now)
        if trigger.kind == "schedule" and retrain.every:
            self.record["next_schedule"] = now + retrain.every
        self._decide("retrain", f"{trigger.kind}: {trigger.detail}", None)
        self._save()
        self._start_or_fail(current, now)

    def _start_or_fail(self, current: dict, now: float) -> None:
        # A run that cannot even start (the workspace unwritable, no python) is a failed retrain,
        # backed off like one, not a state the next look would try again every second.
        try:
            self._start_run(current)
        except Exception as exc:  # noqa: BLE001 - see above
            self._failed(now, f"the run could not start: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}")

    def _spec_file(self) -> str:
        import yaml

        folder = self.ws.root / "retrain"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{self.name}.yaml"
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(yaml.safe_dump(self.spec_raw, sort_keys=False))
        os.replace(tmp, path)  # a reader never sees half a spec
        return str(path)

    def _start_run(self, current: dict) -> None:
        import ray

        address = ray.get_runtime_context().gcs_address
        command = [sys.executable, "-m", "rayline.cli", "run", self._spec_file(), "--no-serve", "--address", address,
                   "--workspace", self.ws.location]
        env = {**os.environ, RETRAIN_REASON_ENV: json.dumps({k: current[k] for k in ("id", "trigger", "detail")})}
        if self.ws.tracking_uri_override:
            env["RAYLINE_TRACKING_URI"] = self.ws.tracking_uri_override
        log_path = self.ws.root / "retrain" / f"{self.name}-{current['id']}.log"
        with open(log_path, "wb") as out:
            self.proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, cwd=str(self.ws.root), start_new_session=True)
        current["pid"], current["node"], current["log"] = self.proc.pid, here(), str(log_path)
        self.waiting = f"retraining ({current['trigger']}), pid {self.proc.pid}"
        self._save()

    def _find_version(self, run_id: str) -> Optional[str]:
        """The version the retrain `run_id` registered (it carries the id in RETRAIN_TAG)."""
        from rayline.registry import RETRAIN_TAG

        for mv in sorted(self._registry().model_versions(self.name), key=lambda v: -int(v.version)):
            reason = (mv.tags or {}).get(RETRAIN_TAG)
            if reason and json.loads(reason).get("id") == run_id:
                return str(mv.version)
        return None

    def _follow_retrain(self, now: float) -> None:
        current = self.record["current"]
        if self.proc is None:  # this loop restarted while the retrain ran: its run may have finished
            version = self._find_version(current["id"])
            if version is None:
                pid = current.get("pid")
                if pid and process_alive(pid, current.get("node")):
                    self.waiting = f"retraining ({current['trigger']}), pid {pid} (started before a restart)"
                    return
                self._decide("resumed", "the loop restarted while retraining and found no new version: retraining again", None)
                self._start_or_fail(current, now)
                return
            return self._judged(version, now)
        code = self.proc.poll()
        if code is None:
            self.waiting = f"retraining ({current['trigger']}), {now - current['started']:.0f} s"
            return
        self.proc = None
        current["run_done"] = now  # the phases of a retrain (benchmarks/retrain_loop.py)
        if code != 0:
            return self._failed(now, f"the run exited with code {code}: {_tail(current.get('log'))}")
        version = self._find_version(current["id"])
        if version is None:
            return self._failed(now, f"the run finished but registered no version: {_tail(current.get('log'))}")
        self._judged(version, now)

    def _failed(self, now: float, why: str) -> None:
        failures = int(self.record.get("failures") or 0) + 1
        wait = backoff_s(failures, self.spec.retrain.min_interval)
        self.record.update(state="watching", failures=failures, retry_after=now + wait,
                           tried=(self.record.get("current") or {}).get("fingerprint"), current=None)
        self._decide("failed", f"the champion keeps serving, next try in {wait:.0f} s; {why}", None)
        self._save()

    def _judged(self, version: str, now: float) -> None:
        from rayline.registry import JUDGEMENT_TAG

        current = self.record["current"]
        current["version"] = version
        mv, _ = self._registry().version_details(self.name, version)
        judgement = json.loads((mv.tags or {}).get(JUDGEMENT_TAG) or "null")
        self.record.update(failures=0, retry_after=None, tried=current.get("fingerprint"))
        if not judgement or judgement.get("champion") != current.get("champion"):
            why = "not judged against the champion" if not judgement else \
                f"judged against version {judgement.get('champion')}, not the serving champion {current.get('champion')}"
            self.record.update(state="watching", current=None, drift_since=None)
            self._decide("not_deployed", why, version)
            self._save()
            return
        line = (f"{judgement['metric']} {judgement['challenger_score']:.4f} vs champion version {judgement['champion']} "
                f"{judgement['champion_score']:.4f} on {judgement['rows']} rows of the new test split: gain "
                f"{judgement['gain']:+.4f}, needed >= {judgement['min_delta']:+.4f}")
        if not judgement.get("qualifies"):
            self.record.update(state="watching", current=None, drift_since=None)
            self._decide("not_deployed", line, version)
            self._save()
            return
        from rayline.serve.versions import deploy

        canary = self.spec.retrain.canary
        from rayline.serve.address import running_serve_http

        host, port = running_serve_http() or ("127.0.0.1", 8000)  # the champion's Serve: where the canary goes too
        try:
            deploy(self.name, version, ws=self.ws, canary_percent=canary.percent, gate=canary.gate(), host=host, port=port)
        except Exception as exc:  # noqa: BLE001 - no CPUs for its replica, Serve gone: decided once, backed off
            detail = ' '.join(str(exc).split())[:300]
            self._failed(now, f"version {version} qualified ({line}) but its canary could not start: {detail}")
            return
        from rayline.serve.routing_table import rollout_state

        current["rollout"] = (rollout_state(self.name) or {}).get("rollout")
        current["canary_at"] = time.time()
        self.record["state"] = "canary"
        self._decide("canary", f"{line}; {canary.percent}% of traffic, promoted after {canary.promote_after} "
                               f"requests within max_error_rate {canary.max_error_rate:g}", version)
        self._save()

    def _follow_canary(self, now: float) -> None:
        from rayline.serve.routing_table import canary_counts, rollout_state
        from rayline.serve.versions import promote, rollback

        current = self.record["current"]
        version = current["version"]
        table = rollout_state(self.name, self.ws) or {}
        tripped = table.get("rolled_back") if (table.get("rolled_back") or {}).get("version") == version else None
        if table.get("canary") != version and not tripped:
            champion = table.get("champion")
            verdict = "promoted" if champion == version else "ended"
            self._finish(verdict, f"the canary ended outside the loop (champion is now version {champion})", version)
            return
        requests, errors = canary_counts(self.name, current["rollout"], version) if not tripped else (0, 0)
        verdict, why = canary_verdict(self.spec.retrain.canary, requests, errors, tripped)
        if verdict == "wait":
            self.waiting = f"canary version {version}: {why}"
            return
        if verdict == "promote":
            promote(self.name, ws=self.ws)
            self._finish("promoted", why, version)
        else:
            if not tripped:
                rollback(self.name, ws=self.ws)
            self._finish("rolled_back", why, version)

    def _finish(self, decision: str, why: str, version: str) -> None:
        self.record.update(state="watching", current=None, drift_since=None)
        self._decide(decision, why, version)
        self._save()


def _tail(path: Optional[str]) -> str:
    if not path:
        return ""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 4 * _TAIL_CHARS))
            lines = [line.strip() for line in fh.read().decode("utf-8", "replace").splitlines() if line.strip()]
    except OSError:
        return ""
    # The CLI's own one-line error says what went wrong; Ray's log lines before it rarely do.
    said = [line for line in lines if line.startswith("error:")]
    return (said[-1] if said else " | ".join(lines[-3:]))[-_TAIL_CHARS:]


# ---------------------------------------------------------------- the driver's side


def start_loop(spec, ws) -> str:
    """Start model `spec.name`'s loop on the connected cluster (or find the running one and give it
    this spec). Returns one line for the user."""
    import ray

    spec_raw = spec.model_dump(by_alias=True, exclude_none=True)
    actor_class = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)(RetrainLoop)
    handle = actor_class.options(name=loop_name(spec.name), namespace=LOOP_NAMESPACE, lifetime="detached",
                                 get_if_exists=True, **ON_THE_HEAD).remote(spec.name, spec_raw, str(ws.location),
                                                             ws.tracking_uri_override)
    ray.get(handle.update_spec.remote(spec_raw))
    retrain = spec.retrain
    return f"retrain loop of {spec.name}: watching ({', '.join(retrain.on)}; `rayline retrain status {spec.name}`)"


def start_loop_line(spec, ws) -> str:
    """start_loop's line, or one saying why the loop did not start: a caller whose model is served
    already (`rayline run`, `rayline serve deploy`) says it and carries on."""
    try:
        return start_loop(spec, ws)
    except Exception as exc:  # noqa: BLE001 - see above
        return f"retrain loop of {spec.name} not started: {_said(exc)}"


def _said(exc: Exception) -> str:
    """An exception as one short line: rayline's own message, or the type and text of another's."""
    from rayline.errors import RaylineError

    detail = str(exc) if isinstance(exc, RaylineError) else f"{type(exc).__name__}: {exc}"
    return " ".join(detail.split())[:300]


def start_for_version(name: str, version: str, ws) -> Optional[str]:
    """After `rayline serve deploy NAME --version N` made N the champion: the loop of the spec N was
    trained with, when that spec has a retrain section (a line for the user), else None. A running
    loop is handed that spec, as a second `rayline run` hands it its own."""
    from rayline.registry import Registry
    from rayline.inference.predictor import version_spec

    registry = Registry(ws)
    try:
        spec = version_spec(registry, registry.resolve(name, str(version)))
    except Exception as exc:  # noqa: BLE001 - the deploy is done: an unreadable spec is said, not a failed deploy
        return f"retrain loop of {name} not started: version {version}'s spec could not be read: {_said(exc)}"
    return start_loop_line(spec, ws) if spec.retrain is not None else None


def _handle(name: str):
    import ray

    try:
        return ray.get_actor(loop_name(name), namespace=LOOP_NAMESPACE)
    except ValueError:
        return None


def loop_status(name: str, restart_wait_s: float = 60.0) -> Optional[dict]:
    """The running loop's status, or None when model `name` has none on this cluster. A loop whose
    process just died is being restarted by Ray: its status is waited for (`restart_wait_s`)."""
    import ray
    from ray.exceptions import RayActorError

    deadline = time.monotonic() + restart_wait_s
    while True:
        handle = _handle(name)
        if handle is None:
            return None
        try:
            return ray.get(handle.status.remote(), timeout=30)
        except RayActorError:  # dead for good, its name is gone at the next look (`_handle`: None)
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def stop_loop(name: str, why: str = "stopped") -> bool:
    """Stop model `name`'s loop; False when it has none running."""
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError

    from rayline.errors import ServeError

    handle = _handle(name)
    if handle is None:
        return False
    try:
        ray.get(handle.stop.remote(why), timeout=120)
    except RayActorError:
        pass  # exit_actor ends the call this way
    except GetTimeoutError:
        # The call stays queued: the loop stops once its current step (a canary's deploy) is done.
        raise ServeError(f"model {name}: the retrain loop is still finishing its current step after 120 s; it stops "
                         f"when that is done (see `rayline retrain status {name}`)") from None
    return True
