"""Where rayline keeps state: one workspace directory (MLflow store, artifacts, Ray results).

Default `./.rayline`; override with `--workspace` or RAYLINE_WORKSPACE. The MLflow
tracking URI defaults to a SQLite store inside it; RAYLINE_TRACKING_URI (or
MLFLOW_TRACKING_URI) points at any MLflow server instead.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Workspace", "workspace"]


@dataclass(frozen=True)
class Workspace:
    root: Path
    tracking_uri_override: str | None = None

    @property
    def tracking_uri(self) -> str:
        return self.tracking_uri_override or f"sqlite:///{self.root / 'mlflow.db'}"

    @property
    def artifact_location(self) -> str:
        return (self.root / "mlartifacts").as_uri()

    @property
    def runs_dir(self) -> str:
        return str(self.root / "runs")

    @property
    def cluster_file(self) -> Path:
        return self.root / "cluster.json"

    def ensure(self) -> "Workspace":
        (self.root / "runs").mkdir(parents=True, exist_ok=True)
        (self.root / "mlartifacts").mkdir(parents=True, exist_ok=True)
        return self


def workspace(path: str | os.PathLike | None = None, tracking_uri: str | None = None) -> Workspace:
    root = Path(path or os.environ.get("RAYLINE_WORKSPACE") or ".rayline").expanduser().resolve()
    uri = tracking_uri or os.environ.get("RAYLINE_TRACKING_URI") or os.environ.get("MLFLOW_TRACKING_URI")
    return Workspace(root=root, tracking_uri_override=uri)
