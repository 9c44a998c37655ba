"""The rows a request to a served model carries, and the rows of its answer: the client side of
the HTTP API that `rayline predict` and `rayline.Client` share (the Client itself is
rayline/client.py).

Rows come from `--json` (strict JSON: NaN and Infinity are rejected here, naming the row and
column, before anything is sent) or from `--input FILE` in any format training reads
(csv, parquet, json arrays, JSON Lines), parsed by the same reader as training
(`rayline.data.sources`). A missing value (an empty CSV cell, a JSON null) is sent as null:
the model imputes it or answers its own 422. Every failure is one line: a `ServeError` for
the endpoint, a `DataError` (exit 2) for the rows.
"""

from __future__ import annotations

import base64
import datetime as _dt
import decimal
import json
import math
from pathlib import Path
from typing import Any

import httpx

from rayline.errors import DataError, ServeError

__all__ = ["load_instances", "rows_from_table", "check_finite", "post_predict", "describe_error_body",
           "prediction_rows"]


def _reject_constant(name: str):
    raise ValueError(f"{name} is not JSON")  # json.loads accepts NaN/Infinity; the server never would


def load_instances(json_body: str | None, input_file: Path | None) -> list[dict]:
    """Rows from --json (an object with `instances`, a list of rows, or one row) or a file."""
    if (json_body is None) == (input_file is None):
        raise DataError("give exactly one of --json or --input (got " + ("both" if json_body is not None else "neither") + ")")
    if json_body is not None:
        try:
            data = json.loads(json_body, parse_constant=lambda name: float(name.replace("Infinity", "inf")))
        except ValueError as exc:
            raise DataError(f"--json: not valid JSON ({exc})") from exc
        rows = data.get("instances") if isinstance(data, dict) and "instances" in data else data
        rows = [rows] if isinstance(rows, dict) else rows
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise DataError('--json: expected {"instances": [{...}, ...]}, a list of rows or one row '
                            f"(got {type(rows).__name__})")
        check_finite(rows, "--json")
        return rows
    from rayline.data.sources import read_file

    path = Path(input_file)
    try:
        table = read_file(path)
    except DataError as exc:
        raise DataError(f"--input: {exc}") from exc
    return rows_from_table(table, f"--input {path}")


def rows_from_table(table, where: str) -> list[dict]:
    """JSON-ready rows of an Arrow table: nulls stay None; NaN/inf and unsendable types are errors."""
    rows = table.to_pylist()
    for i, row in enumerate(rows):
        for column, value in row.items():
            if value is None or isinstance(value, (bool, int, str)):
                continue
            row[column] = _jsonable(value, where, i, column)
    check_finite(rows, where)
    return rows


def _jsonable(value: Any, where: str, row: int, column: str) -> Any:
    if isinstance(value, float):
        return value
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat()
    if isinstance(value, _dt.timedelta):
        return value.total_seconds()
    if isinstance(value, (list, tuple)):
        return [v if v is None or isinstance(v, (bool, int, str)) else _jsonable(v, where, row, column) for v in value]
    if isinstance(value, dict):
        return {k: v if v is None or isinstance(v, (bool, int, str)) else _jsonable(v, where, row, column)
                for k, v in value.items()}
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    raise DataError(f"{where}: row {row}, column {column!r}: cannot be sent as JSON "
                    f"(got {type(value).__name__}; allowed: numbers, strings, booleans, null)")


def check_finite(rows: list[dict], where: str) -> None:
    """A DataError naming the first row and column holding NaN or +-inf (not valid JSON)."""
    for i, row in enumerate(rows):
        for column, value in row.items():
            if isinstance(value, float) and not math.isfinite(value):
                raise DataError(
                    f"{where}: row {i}, column {column!r}: not a finite number (got {value}; allowed: finite "
                    "numbers, or null / an empty cell for a missing value)"
                )


def describe_error_body(response: httpx.Response) -> str:
    """The server's message on one line: FastAPI's 422 list as `loc: msg; ...`, a `detail` string, or the text."""
    try:
        body = response.json()
    except ValueError:  # Ray Serve's own 429/503 bodies are plain text
        body = None
    detail = body.get("detail", body) if isinstance(body, dict) else body
    if isinstance(detail, list) and detail:
        parts = []
        for item in detail[:5]:
            if isinstance(item, dict):
                loc = [str(p) for p in item.get("loc", [])]
                loc = loc[1:] if loc[:1] == ["body"] else loc
                parts.append(f"{'.'.join(loc)}: {item.get('msg', '')}" if loc else str(item.get("msg", "")))
            else:
                parts.append(str(item))
        text = "; ".join(parts) + (f"; {len(detail) - 5} more" if len(detail) > 5 else "")
    elif detail is None:
        text = response.text.strip() or response.reason_phrase
    else:
        text = detail if isinstance(detail, str) else json.dumps(detail)
    return " ".join(text.split())[:500]


def post_predict(url: str, instances: list[dict], probabilities: bool = False, timeout: float = 60.0) -> dict:
    """The endpoint's JSON answer; a one-line ServeError for anything else, within `timeout` seconds."""
    endpoint = url.rstrip("/")
    if not endpoint.endswith("/predict"):
        endpoint += "/predict"
    try:
        # allow_nan=False: rows were checked already; this is the last guard (httpx's own
        # encoder raises a bare ValueError for NaN).
        body = json.dumps({"instances": instances, "probabilities": probabilities}, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise DataError(f"instances: cannot be sent as JSON ({exc})") from exc
    try:
        response = httpx.post(endpoint, content=body, headers={"content-type": "application/json"}, timeout=timeout)
    except httpx.TimeoutException as exc:
        raise ServeError(f"{endpoint}: no answer within {timeout:g} s ({type(exc).__name__}; "
                         "allowed: a longer --timeout, or check the deployment with `rayline serve status`)") from exc
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        raise ServeError(f"cannot reach {endpoint}: {exc or type(exc).__name__} "
                         "(is the model deployed? `rayline run SPEC`)") from exc
    if response.status_code != 200:
        retry = response.headers.get("retry-after")
        hint = f" (retry after {retry} s)" if retry else ""
        what = "the model rejected the request: " if response.status_code == 422 else ""
        raise ServeError(f"{endpoint} answered {response.status_code}: {what}{describe_error_body(response)}{hint}")
    try:
        result = response.json()
    except ValueError as exc:
        raise ServeError(f"{endpoint} answered 200 with a body that is not JSON ({response.text[:100]!r})") from exc
    if not isinstance(result, dict):
        raise ServeError(f"{endpoint} answered 200 with JSON that is not an object (got {type(result).__name__})")
    return result


def prediction_rows(result: dict) -> tuple[list[tuple[str, str, str]], bool]:
    """(rows of (#, prediction, probability), whether probabilities came) for any answer shape.

    The probability shown is the predicted class's; when the server's keys do not name it (a
    JSON key is always a string: `true` for the label True) it is the largest one. A missing
    or null prediction or probability shows as "-".
    """
    predictions = result.get("predictions")
    if not isinstance(predictions, list):
        keys = ", ".join(map(str, result)) or "none"
        raise ServeError(f"the answer holds no list of predictions (got keys: {keys})")
    probabilities = result.get("probabilities")
    has_probabilities = isinstance(probabilities, list) and len(probabilities) > 0
    rows = []
    for i, pred in enumerate(predictions):
        cell = "-"
        if has_probabilities:
            cell = _probability_cell(probabilities[i] if i < len(probabilities) else None, pred)
        rows.append((str(i), "-" if pred is None else str(pred), cell))
    return rows, has_probabilities


def _probability_cell(probs: Any, pred: Any) -> str:
    if not isinstance(probs, dict):
        return "-"
    for key in (str(pred), json.dumps(pred)):
        value = probs.get(key)
        if _is_number(value):
            return f"{value:.4f}"
    numbers = [v for v in probs.values() if _is_number(v)]
    return f"{max(numbers):.4f}" if numbers else "-"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
