"""Talking to a cluster's Jobs API (the dashboard's HTTP server): where it is, how to reach it, and
Ray's errors mapped to one-line rayline errors.

Address, first found wins: `--address`; RAY_API_SERVER_ADDRESS (what `ray job` reads); RAY_ADDRESS
when it is an http(s) URL (a GCS address such as 10.0.0.1:6379 is for drivers, not for the Jobs
API); the dashboard of the head `rayline cluster up` recorded in the workspace. A bare
`host:port` means http://host:port.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from rayline.errors import ClusterError, RaylineError
from rayline.jobs.auth import auth_headers, load_token, mask, missing_token_message

__all__ = ["JobError", "JobsClient", "resolve_address", "TERMINAL", "exit_code_for"]

TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
_AGENT_WAIT_S = 60.0


class JobError(RaylineError):
    """A job the cluster does not know, or a Jobs API request it refused."""


def resolve_address(address: str | None, ws) -> tuple[str, str]:
    """(the Jobs API URL, where it came from)."""
    if address:
        return _as_url(address), "--address"
    for var in ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS"):
        value = os.environ.get(var, "").strip()
        if value and (var == "RAY_API_SERVER_ADDRESS" or value.startswith(("http://", "https://"))):
            return _as_url(value), var
    if ws is not None:
        from rayline.cluster.connection import read_head_record

        record = read_head_record(ws) or {}
        if record.get("dashboard") and record.get("state") != "starting":
            return record["dashboard"].rstrip("/"), f"the head of `rayline cluster up` ({ws.cluster_file})"
    raise ClusterError("no Ray cluster to submit to (allowed: --address http://HEAD:8265, RAY_API_SERVER_ADDRESS or "
                       "RAY_ADDRESS set to the dashboard's http(s) URL, or a head started with `rayline cluster up`)")


def _as_url(address: str) -> str:
    address = address.strip().rstrip("/")
    if address.startswith("ray://"):
        raise ClusterError(f"--address: a Ray Client address cannot take jobs (got {address}; allowed: the "
                           "dashboard's URL, http://HEAD:8265)")
    return address if address.startswith(("http://", "https://")) else f"http://{address}"


def exit_code_for(status: str, driver_exit_code: int | None) -> int:
    """The exit code of `rayline submit --follow` / `jobs logs --follow` for a finished job.

    SUCCEEDED 0; STOPPED 130 (stopped by someone, like Ctrl-C of `rayline run`); FAILED: the
    driver's own exit code when it has one (rayline's: 2 bad spec or data, 3 resources the
    cluster lacks, 130 interrupted), else 1.
    """
    if status == "SUCCEEDED":
        return 0
    if status == "STOPPED":
        return 130
    if driver_exit_code is not None and 0 < driver_exit_code < 256:
        return driver_exit_code
    return 1


@dataclass
class JobsClient:
    """Ray's JobSubmissionClient for one URL, with the token in its headers and errors mapped."""

    url: str
    _client: object = None
    _token: str | None = None

    @classmethod
    def connect(cls, url: str) -> "JobsClient":
        import logging

        import ray.job_submission  # noqa: F401  (its modules set their loggers to INFO when imported)

        # Ray's SDK logs "Token authentication is enabled but no token was found" at WARNING
        # on its own; rayline says it in its error, once.
        logging.getLogger("ray._private.authentication.http_token_authentication").setLevel(logging.ERROR)
        # Its INFO lines ("Uploading package gcs://...", "WebSocket closed ...") are Ray's bookkeeping.
        for name in ("ray.dashboard.modules.dashboard_sdk", "ray.dashboard.modules.job.sdk",
                     "ray._private.runtime_env.packaging"):
            logging.getLogger(name).setLevel(logging.WARNING)
        from rayline.cluster.probe import probe_jobs_api

        self = cls(url=url)
        # Within seconds, and the token only to a cluster that requires one (rayline.cluster.probe).
        self._token = probe_jobs_api(url, token=load_token)
        self._client = self._call(lambda: _new_client(url, auth_headers(self._token)))
        return self

    def _call(self, fn):
        """Run one request; Ray's and requests' errors become one-line rayline errors."""
        import requests

        try:
            from ray.exceptions import AuthenticationError
        except ImportError:  # pragma: no cover - a Ray without token auth
            AuthenticationError = ()  # noqa: N806
        try:
            return fn()
        except AuthenticationError as exc:
            raise ClusterError(missing_token_message(self.url, bool(self._token))) from exc
        except (ConnectionError, requests.exceptions.ConnectionError, requests.exceptions.Timeout) as exc:
            raise ClusterError(f"{self.url}: no Ray Jobs API answers there (allowed: the dashboard's URL of a running "
                               "cluster, e.g. http://HEAD:8265; `kubectl port-forward` or `ray dashboard` to reach a "
                               "private one)") from exc
        except requests.exceptions.RequestException as exc:  # a malformed URL, too many redirects, ...
            raise ClusterError(f"{self.url}: not a Ray Jobs API address ({type(exc).__name__}; allowed: the "
                               "dashboard's URL, e.g. http://HEAD:8265)") from exc
        except RuntimeError as exc:
            text = mask(str(exc), self._token)
            if "status code 404" in text or "does not exist" in text:
                raise JobError(text) from exc
            raise JobError(f"{self.url}: the Jobs API refused the request: {_first_line(text)}") from exc

    def submit(self, **kwargs) -> str:
        # A head that has just started answers 500 "No available agent to submit job" until its
        # dashboard agent has registered (seen for ~10 s after `ray start` on the loaded 2-core
        # machine); Ray's own CLI then fails. Nothing was created, so asking again is safe.
        deadline = time.monotonic() + _AGENT_WAIT_S
        while True:
            try:
                return self._call(lambda: self._client.submit_job(**kwargs))
            except JobError as exc:
                if "No available agent" not in str(exc):
                    raise
                if time.monotonic() > deadline:
                    raise JobError(f"{self.url}: the head's dashboard agent, which starts jobs, did not answer within "
                                   f"{_AGENT_WAIT_S:g} s (got 'No available agent to submit job'; allowed: a head whose "
                                   "agent runs: see dashboard_agent.log in its Ray logs; a port it needs may be taken, "
                                   "e.g. 52365 by another Ray on that machine)") from exc
                time.sleep(2)

    def info(self, job_id: str):
        try:
            return self._call(lambda: self._client.get_job_info(job_id))
        except JobError as exc:
            if "404" not in str(exc) and "does not exist" not in str(exc):
                raise  # the API refused the request for another reason: say that one
            raise JobError(f"{job_id}: no such job on {self.url} (allowed: a submission id from "
                           "`rayline jobs list`)") from exc

    def list(self) -> list:
        return self._call(lambda: self._client.list_jobs())

    def logs(self, job_id: str) -> str:
        self.info(job_id)  # an unknown id: one clear line
        return mask(self._call(lambda: self._client.get_job_logs(job_id)), self._token)

    def stop(self, job_id: str) -> bool:
        self.info(job_id)
        return self._call(lambda: self._client.stop_job(job_id))

    def follow(self, job_id: str, write) -> None:
        """Stream the job's logs to `write` until it finishes (Ray's websocket tail)."""
        import asyncio

        self.info(job_id)

        async def tail() -> None:
            async for chunk in self._client.tail_job_logs(job_id):
                write(mask(chunk, self._token))

        def run() -> None:
            import aiohttp

            try:
                asyncio.run(tail())
            except aiohttp.ClientError as exc:
                raise ClusterError(f"{self.url}: lost the log stream of {job_id} ({type(exc).__name__}; "
                                   f"allowed: `rayline jobs logs {job_id} --follow` again)") from exc

        self._call(run)


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return (lines or [""])[0][:300]


def _new_client(url: str, headers: dict):
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(url, headers=headers or None)
