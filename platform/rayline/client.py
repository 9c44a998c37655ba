"""`rayline.Client`: a pandas client for a served model, with retries.

    with rayline.Client("http://127.0.0.1:8000/digits", api_key=key) as client:
        frame = client.predict(df, probabilities=True)   # prediction, probability_<label>...
        client.version                                   # the version that answered

The URL is a model's route (`/predict` there follows the traffic split) or one version's
(`ROUTE/v/N`). Rows go out as JSON objects in chunks of `batch_size` (a 1,000-row digits
chunk is ~1.2 MB of JSON, well under the server's default 10 MB body limit and 10,000
`max_instances`); a server with a smaller `max_instances` says so in its 422 ("List should have
at most N items") and the client re-chunks at N; a 413 halves the chunk. Answers are put back
together in input order, indexed like the input DataFrame.

Retries: 429 (after Retry-After, in seconds or an HTTP date, capped at `max_backoff_s`), 502,
503, 504, Serve's HAProxy ingress's 500 (its own 502/503/504 rewritten by Ray's errorfile; a model's
error is rayline's JSON 500, never retried) and connection failures (refused, reset, closed without an
answer) are retried up to
`max_retries` times with exponential backoff and full jitter (AWS's "Exponential Backoff And
Jitter": sleep uniform(0, min(cap, base * 2**attempt))), so many clients refused at once do not
come back in step. A prediction is a pure function of its rows, so repeating one is safe. Any
other 4xx (401, 404, 422) is the caller's to fix and fails at once; so does a read timeout
(the server has the request and is slow: repeating it would only add load). Every failure is
one `ServeRequestError` (a `ServeError`) naming the endpoint, the attempts and the last status.
"""

from __future__ import annotations

import email.utils
import json
import math
import random
import re
import time
from pathlib import Path
from typing import Any

import httpx

from rayline.errors import DataError, ServeError
from rayline.serve.request_rows import check_finite, describe_error_body, rows_from_table

__all__ = ["Client", "ServeRequestError", "PREDICTION_COLUMN", "probability_column", "parse_retry_after",
           "backoff_delay", "RETRY_STATUSES", "ingress_unavailable", "ONLINE_WRITERS", "write_predictions"]

PREDICTION_COLUMN = "prediction"
RETRY_STATUSES = frozenset({429, 502, 503, 504})
VERSION_HEADER = "x-rayline-version"
# Connection-level failures where the server did not start on the request (or dropped it
# without an answer): safe and useful to repeat.
_RETRY_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.ReadError, httpx.WriteError,
                 httpx.RemoteProtocolError)
# Ray Serve's HAProxy ingress answers its own 502/503/504 (no replica answered: it died under the
# request, or none is up) with this exact 500 (Ray's errorfile, serve/_private/haproxy.py). A 500 from
# a replica differs: rayline's is JSON, Serve's own for an escaped exception has no content type.
_INGRESS_500 = ("text/plain", b"Internal Server Error")
_TOO_MANY = re.compile(r"at most (\d+) item")


def ingress_unavailable(response: httpx.Response) -> bool:
    """Whether `response` is Serve's HAProxy ingress saying that no replica answered (a 502/503/504 of
    its own, which Ray's errorfile turns into a plain-text 500): retryable, unlike a model's 500."""
    content_type = response.headers.get("content-type", "").split(";")[0].strip().lower()
    return response.status_code == 500 and (content_type, response.content.strip()) == _INGRESS_500


def probability_column(label: Any) -> str:
    """The column holding the probability of class `label` (its JSON key: `probability_7`, `probability_yes`)."""
    return f"probability_{label}"


class ServeRequestError(ServeError):
    """A request to a served model failed: a refusal (4xx), or still failing after the retries."""

    def __init__(self, message: str, *, status: int | None, attempts: int, detail: str = ""):
        super().__init__(message)
        self.status = status  # the last HTTP status; None when no answer came (connection failure)
        self.attempts = attempts
        self.detail = detail  # the server's message, one line


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date); None if absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
        return max(0.0, seconds) if math.isfinite(seconds) else None
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def backoff_delay(retry: int, backoff_s: float, max_backoff_s: float, retry_after: float | None = None,
                  rng: random.Random | None = None) -> float:
    """Seconds before retry number `retry` (0-based): the server's Retry-After when it gave one
    (capped at `max_backoff_s`), else full jitter: uniform(0, min(max_backoff_s, backoff_s * 2**retry))."""
    if retry_after is not None:
        return min(retry_after, max_backoff_s)
    return (rng or random).uniform(0.0, min(max_backoff_s, backoff_s * (2 ** retry)))


def _json_default(value: Any) -> Any:
    item = getattr(value, "item", None)  # numpy scalars in a list of rows
    if callable(item):
        return item()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


class Client:
    """Predictions from a served rayline model as pandas DataFrames.

    url: the model's route (`http://host:8000/digits`, traffic split) or one version's
    (`http://host:8000/digits/v/2`); a trailing `/predict` is ignored. api_key: sent as
    `Authorization: Bearer <key>` (serve.auth). timeout: seconds per request. max_retries:
    retries after the first attempt on 429/502/503/504 and connection failures. backoff_s:
    the first backoff's ceiling, doubled per retry up to max_backoff_s. batch_size: rows per
    request.
    """

    def __init__(self, url: str, api_key: str | None = None, *, timeout: float = 60.0, max_retries: int = 5,
                 backoff_s: float = 0.5, max_backoff_s: float = 30.0, batch_size: int = 1000,
                 headers: dict[str, str] | None = None):
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ServeError(f"Client url: not an HTTP URL (got {url!r}; allowed: http://host:port/route "
                             "or http://host:port/route/v/N)")
        for name, value, low in (("max_retries", max_retries, 0), ("batch_size", batch_size, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ServeError(f"Client {name}: must be an integer >= {low} (got {value!r})")
        for name, value in (("timeout", timeout), ("backoff_s", backoff_s), ("max_backoff_s", max_backoff_s)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
                raise ServeError(f"Client {name}: must be a number of seconds >= 0 (got {value!r})")
        base = url.rstrip("/")
        self.url = base[: -len("/predict")] if base.endswith("/predict") else base
        self.timeout = float(timeout)
        self.max_retries = max_retries
        self.backoff_s = float(backoff_s)
        self.max_backoff_s = float(max_backoff_s)
        self.batch_size = batch_size
        self.version: str | None = None  # the version that answered the last request
        self.model: str | None = None
        self.attempts = 0  # attempts the last request took (1 = no retry)
        sent = {"accept": "application/json", **(headers or {})}
        if api_key:
            sent["authorization"] = f"Bearer {api_key}"
        # One pool for the client's life: chunks of a large frame reuse one keep-alive connection.
        self._http = httpx.Client(timeout=self.timeout, headers=sent)

    # ------------------------------------------------------------ lifecycle

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({self.url!r})"

    # ------------------------------------------------------------ API

    def health(self) -> dict:
        """GET {url}/health: {'status': 'ok', 'model': ..., 'version': ...}."""
        return self._json(self._request("GET", "/health"), "/health")

    def metadata(self) -> dict:
        """GET {url}/metadata: features, labels, metrics and versions of the model."""
        return self._json(self._request("GET", "/metadata"), "/metadata")

    def predict(self, rows, probabilities: bool = False):
        """A DataFrame with `prediction` (and `probability_<label>` per class when asked, for
        classification), one row per input row, indexed like the input DataFrame."""
        import pandas as pd

        index = rows.index if isinstance(rows, pd.DataFrame) else None
        result = self.predict_raw(rows, probabilities)
        frame = pd.DataFrame({PREDICTION_COLUMN: result["predictions"]},
                             index=index if index is not None else pd.RangeIndex(len(result["predictions"])))
        probs = result.get("probabilities")
        if probabilities and probs:
            labels = list(probs[0])
            columns = {probability_column(label): [row.get(label) for row in probs] for label in labels}
            frame = pd.concat([frame, pd.DataFrame(columns, index=frame.index)], axis=1)
        return frame

    def predict_raw(self, rows, probabilities: bool = False) -> dict:
        """The endpoint's answer for all rows, chunks joined in order: {'predictions': [...],
        'probabilities': [...] (when asked), 'model': ..., 'version': ...}."""
        instances = self._instances(rows)
        if not instances:
            raise DataError("predict: no rows to send (got 0 rows)")
        predictions: list = []
        probs: list = []
        start = 0
        size = self.batch_size
        while start < len(instances):
            chunk = instances[start:start + size]
            try:
                answer = self._predict_chunk(chunk, probabilities)
            except _Rechunk as again:
                size = again.size
                continue
            got = answer.get("predictions")
            if not isinstance(got, list) or len(got) != len(chunk):
                raise ServeRequestError(f"{self.url}/predict answered {len(got) if isinstance(got, list) else 'no'} "
                                        f"predictions for {len(chunk)} rows", status=200, attempts=self.attempts)
            predictions.extend(got)
            if probabilities and isinstance(answer.get("probabilities"), list):
                probs.extend(answer["probabilities"])
            start += len(chunk)
        out: dict[str, Any] = {"predictions": predictions}
        if probs:
            out["probabilities"] = probs
        out["model"], out["version"] = self.model, self.version
        return out

    # ------------------------------------------------------------ internals

    @staticmethod
    def _instances(rows) -> list[dict]:
        try:
            import pandas as pd
        except ImportError:  # pragma: no cover - pandas is a dependency
            pd = None
        if pd is not None and isinstance(rows, pd.DataFrame):
            import pyarrow as pa

            # Arrow turns NaN/None/NaT into null (JSON null: the server imputes it or answers
            # its own 422), numpy scalars into Python ones; +-inf stays and is refused here.
            try:
                table = pa.Table.from_pandas(rows, preserve_index=False)
            except (pa.ArrowException, TypeError, ValueError) as exc:
                raise DataError(f"predict: the DataFrame cannot be sent as JSON rows ({exc})") from exc
            return rows_from_table(table, "predict")
        if isinstance(rows, dict):
            rows = [rows]
        if not isinstance(rows, (list, tuple)) or not all(isinstance(r, dict) for r in rows):
            raise DataError(f"predict: expected a pandas DataFrame or a list of row dicts (got {type(rows).__name__})")
        rows = list(rows)
        check_finite(rows, "predict")
        return rows

    def _predict_chunk(self, chunk: list[dict], probabilities: bool) -> dict:
        try:
            body = json.dumps({"instances": chunk, "probabilities": probabilities}, allow_nan=False,
                              default=_json_default).encode()
        except (TypeError, ValueError) as exc:
            raise DataError(f"predict: rows cannot be sent as JSON ({exc})") from exc
        response = self._request("POST", "/predict", body, chunk_size=len(chunk))
        answer = self._json(response, "/predict")
        version = response.headers.get(VERSION_HEADER) or answer.get("version")
        self.version = None if version is None else str(version)
        self.model = answer.get("model", self.model)
        return answer

    def _json(self, response: httpx.Response, path: str) -> dict:
        try:
            result = response.json()
        except ValueError as exc:
            raise ServeRequestError(f"{self.url}{path} answered {response.status_code} with a body that is not JSON "
                                    f"({response.text[:100]!r})", status=response.status_code,
                                    attempts=self.attempts) from exc
        if not isinstance(result, dict):
            raise ServeRequestError(f"{self.url}{path} answered JSON that is not an object (got {type(result).__name__})",
                                    status=response.status_code, attempts=self.attempts)
        return result

    def _request(self, method: str, path: str, body: bytes | None = None, chunk_size: int = 0) -> httpx.Response:
        endpoint = self.url + path
        headers = {"content-type": "application/json"} if body is not None else None
        last_error: BaseException | None = None
        response: httpx.Response | None = None
        attempt = 0
        while True:
            attempt += 1
            self.attempts = attempt
            try:
                response = self._http.request(method, endpoint, content=body, headers=headers)
                last_error = None
            except httpx.InvalidURL as exc:
                raise ServeRequestError(f"{endpoint}: not a valid URL ({exc})", status=None, attempts=attempt) from exc
            except (httpx.ReadTimeout, httpx.WriteTimeout) as exc:
                raise ServeRequestError(
                    f"{endpoint}: no answer within {self.timeout:g} s ({type(exc).__name__}; allowed: a longer "
                    "timeout, fewer rows per request, or check the deployment with `rayline serve status`)",
                    status=None, attempts=attempt) from exc
            except _RETRY_ERRORS as exc:
                last_error, response = exc, None
            except httpx.HTTPError as exc:
                raise ServeRequestError(f"cannot reach {endpoint}: {exc or type(exc).__name__}", status=None,
                                        attempts=attempt) from exc
            if response is not None:
                status = response.status_code
                if status < 400:
                    return response
                if status not in RETRY_STATUSES and not ingress_unavailable(response):
                    self._refused(endpoint, response, attempt, chunk_size)
            if attempt > self.max_retries:
                break
            retry_after = parse_retry_after(response.headers.get("retry-after")) if response is not None else None
            time.sleep(backoff_delay(attempt - 1, self.backoff_s, self.max_backoff_s, retry_after))
        if response is None:
            reason = str(last_error) or type(last_error).__name__
            raise ServeRequestError(f"cannot reach {endpoint} after {attempt} attempt{'s' if attempt > 1 else ''}: "
                                    f"{reason} (is the model deployed? `rayline serve status`)",
                                    status=None, attempts=attempt) from last_error
        detail = ("no replica answered (Serve's HAProxy ingress; is the deployment healthy? `rayline serve status`)"
                  if ingress_unavailable(response) else describe_error_body(response))
        raise ServeRequestError(f"{endpoint} answered {response.status_code} after {attempt} "
                                f"attempt{'s' if attempt > 1 else ''}: {detail}", status=response.status_code,
                                attempts=attempt, detail=detail)

    def _refused(self, endpoint: str, response: httpx.Response, attempt: int, chunk_size: int) -> None:
        """A 4xx that no retry fixes: raise it (or ask for smaller chunks when the chunk was too big)."""
        status = response.status_code
        detail = describe_error_body(response)
        if chunk_size > 1 and status == 422:
            match = _TOO_MANY.search(detail)
            if match and detail.split(":", 1)[0].strip() == "instances" and int(match.group(1)) < chunk_size:
                raise _Rechunk(int(match.group(1)))
        if chunk_size > 1 and status == 413:
            raise _Rechunk(max(1, chunk_size // 2))
        what = "the model rejected the request: " if status == 422 else ""
        hint = " (pass api_key=, or --api-key / RAYLINE_API_KEY to `rayline predict`)" if status == 401 else ""
        raise ServeRequestError(f"{endpoint} answered {status}: {what}{detail}{hint}", status=status,
                                attempts=attempt, detail=detail)


class _Rechunk(Exception):
    """The server takes at most `size` rows per request: send this chunk again, smaller."""

    def __init__(self, size: int):
        super().__init__(size)
        self.size = size


ONLINE_WRITERS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".json": "json", ".jsonl": "json"}


def write_predictions(url: str, instances: list[dict], path: Path, *, probabilities: bool = False,
                      keep: list[str] | None = None, api_key: str | None = None, timeout: float = 60.0,
                      retries: int = 3) -> tuple[int, str | None]:
    """The served model's predictions for `instances`, beside the kept input columns (default: every
    input column the answer does not name), written to `path` (format from its suffix, all or
    nothing); (rows written, the version that answered)."""
    import pandas as pd

    from rayline.errors import RaylineError
    from rayline.files import atomic_path

    kind = ONLINE_WRITERS[path.suffix.lower()]
    if not path.parent.is_dir():
        raise RaylineError(f"--output: no such directory {str(path.parent)!r} (got {str(path)!r})")
    inputs = pd.DataFrame(instances)
    absent = [k for k in (keep or []) if k not in inputs.columns]
    if absent:
        raise RaylineError(f"--keep: no such input column {', '.join(map(repr, absent))} "
                           f"(allowed: {', '.join(map(str, inputs.columns[:20]))})")
    with Client(url, api_key=api_key, timeout=timeout, max_retries=retries) as client:
        # Only the model's features are sent: other input columns (an id) are kept in the file, not refused.
        features = [f.get("name") for f in client.metadata().get("features") or [] if isinstance(f, dict)]
        sent = [{k: row[k] for k in features if k in row} for row in instances] if features else instances
        predicted = client.predict(sent, probabilities)
        answered = client.version
    kept = inputs[list(dict.fromkeys(keep))] if keep else inputs.drop(columns=[c for c in predicted.columns if c in inputs.columns])
    frame = pd.concat([kept.reset_index(drop=True), predicted.reset_index(drop=True)], axis=1)
    with atomic_path(path) as tmp:
        if kind == "parquet":
            frame.to_parquet(tmp, index=False)
        elif kind == "csv":
            frame.to_csv(tmp, index=False)
        else:
            frame.to_json(tmp, orient="records", lines=True)
    return len(frame), answered
