"""A small HTTP client for served models (what `rayline predict` uses)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import httpx

from rayline.errors import ServeError

__all__ = ["load_instances", "post_predict"]


def load_instances(json_body: str | None, input_file: Path | None) -> list[dict]:
    """Rows from --json (an object with `instances`, a list of rows, or one row) or a file."""
    if (json_body is None) == (input_file is None):
        raise ServeError("give exactly one of --json or --input (got " + ("both" if json_body else "neither") + ")")
    if json_body is not None:
        try:
            data = json.loads(json_body)
        except ValueError as exc:
            raise ServeError(f"--json: not valid JSON ({exc})") from None
        rows = data.get("instances") if isinstance(data, dict) and "instances" in data else data
        rows = [rows] if isinstance(rows, dict) else rows
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise ServeError('--json: expected {"instances": [{...}, ...]}, a list of rows or one row')
        return rows
    import pandas as pd

    path = Path(input_file)
    if not path.is_file():
        raise ServeError(f"--input: no such file (got {str(path)!r})")
    readers = {".csv": pd.read_csv, ".parquet": pd.read_parquet, ".jsonl": lambda p: pd.read_json(p, lines=True)}
    reader = readers.get(path.suffix.lower())
    if reader is None:
        raise ServeError(f"--input: unknown file type (got {path.suffix!r}; allowed: .csv, .parquet, .jsonl)")
    try:
        frame = reader(path)
    except Exception as exc:
        raise ServeError(f"--input: cannot read {path}: {exc}") from None
    rows = frame.to_dict(orient="records")
    return [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()} for row in rows]


def post_predict(url: str, instances: list[dict], probabilities: bool = False, timeout: float = 60.0) -> dict:
    endpoint = url.rstrip("/")
    if not endpoint.endswith("/predict"):
        endpoint += "/predict"
    try:
        response = httpx.post(endpoint, json={"instances": instances, "probabilities": probabilities}, timeout=timeout)
    except httpx.HTTPError as exc:
        raise ServeError(f"cannot reach {endpoint}: {exc} (is the model deployed? `rayline run SPEC`)") from None
    if response.status_code == 422:
        details = response.json().get("detail", [])
        lines = [f"{'.'.join(str(p) for p in d.get('loc', [])[1:])}: {d.get('msg')}" for d in details] or [response.text]
        raise ServeError("the model rejected the request:\n  " + "\n  ".join(lines))
    if response.status_code != 200:
        try:
            detail = response.json().get("detail", response.text)
        except ValueError:  # Ray Serve's own 429/503 bodies are plain text
            detail = response.text
        retry = response.headers.get("retry-after")
        hint = f" (retry after {retry} s)" if retry else ""
        raise ServeError(f"{endpoint} answered {response.status_code}: {str(detail)[:300]}{hint}")
    return response.json()
