"""The register stage: MLflow tracking (one run per trial) and the model registry.

Every pipeline run is an MLflow run in experiment `rayline/<name>`; each trial is a child
run with its overrides as params and its per-epoch validation metrics. The winner's
artifact is logged under `model/` of the pipeline run and registered as a new version of
model `<name>`. Errors from MLflow are mapped to `RegistryError` here.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass

from rayline.errors import RegistryError
from rayline.workspace import Workspace

__all__ = ["ModelVersion", "Registry"]


@dataclass
class ModelVersion:
    name: str
    version: str
    run_id: str
    source: str
    metrics: dict
    created: str = ""
    framework: str = ""


def _flatten(prefix: str, value, out: dict) -> dict:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = json.dumps(value) if isinstance(value, (list, tuple)) else value
    return out


class Registry:
    """MLflow tracking + registry for one workspace."""

    def __init__(self, ws: Workspace):
        os.environ.setdefault("MLFLOW_ENABLE_ASYNC_LOGGING", "false")
        from mlflow.tracking import MlflowClient

        self.ws = ws
        self.tracking_uri = ws.tracking_uri
        try:
            self.client = MlflowClient(tracking_uri=self.tracking_uri, registry_uri=self.tracking_uri)
        except Exception as exc:
            raise RegistryError(f"cannot open the MLflow store at {self.tracking_uri}: {exc}") from None

    # ------------------------------------------------------------ tracking

    def _experiment_id(self, name: str) -> str:
        exp_name = f"rayline/{name}"
        exp = self.client.get_experiment_by_name(exp_name)
        if exp is not None:
            return exp.experiment_id
        location = self.ws.artifact_location if not self.ws.tracking_uri_override else None
        return self.client.create_experiment(exp_name, artifact_location=location)

    def start_pipeline_run(self, spec, spec_path: str | None) -> str:
        try:
            run = self.client.create_run(
                self._experiment_id(spec.name),
                run_name=f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}",
                tags={"rayline.kind": "pipeline", "rayline.spec_path": spec_path or ""},
            )
            params = _flatten("", spec.model_dump(mode="json", by_alias=True, exclude_none=True, exclude={"tune"}), {})
            self._log(run.info.run_id, params=params)
            return run.info.run_id
        except RegistryError:
            raise
        except Exception as exc:
            raise RegistryError(f"MLflow ({self.tracking_uri}): cannot start a run: {exc}") from None

    def log_trial(self, parent_run_id: str, spec_name: str, trial_id: str, overrides: dict, status: str,
                  history: list[dict], winner: bool) -> str:
        run = self.client.create_run(
            self._experiment_id(spec_name),
            run_name=f"trial-{trial_id}",
            tags={"mlflow.parentRunId": parent_run_id, "rayline.kind": "trial", "rayline.trial_status": status,
                  "rayline.winner": str(winner).lower()},
        )
        metrics = [(k, v, row["epoch"]) for row in history for k, v in row.items() if k != "epoch"]
        self._log(run.info.run_id, params=_flatten("", overrides, {}), metrics=metrics)
        self.client.set_terminated(run.info.run_id, status="FINISHED" if status != "error" else "FAILED")
        return run.info.run_id

    def _log(self, run_id: str, params: dict | None = None, metrics: list | None = None) -> None:
        from mlflow.entities import Metric, Param

        now = int(time.time() * 1000)
        params = [Param(k, str(v)[:6000]) for k, v in (params or {}).items()]
        metrics = [Metric(k, float(v), now, int(step)) for k, v, step in (metrics or [])]
        for i in range(0, max(len(params), len(metrics), 1), 100):  # MLflow's batch limits
            self.client.log_batch(run_id, metrics=metrics[i:i + 100], params=params[i:i + 100])

    # ------------------------------------------------------------ registry

    def register(self, run_id: str, name: str, artifact_dir: str, metrics: dict, tags: dict) -> ModelVersion:
        """Log the artifact under the pipeline run and register it as a new version of `name`."""
        from mlflow.exceptions import MlflowException

        try:
            self._log(run_id, metrics=[(k, v, 0) for k, v in metrics.items()])
            self.client.log_artifacts(run_id, artifact_dir, artifact_path="model")
            try:
                self.client.create_registered_model(name, description="Registered by rayline.")
            except MlflowException as exc:
                if "RESOURCE_ALREADY_EXISTS" not in str(exc.error_code):
                    raise
            source = f"{self.client.get_run(run_id).info.artifact_uri}/model"
            mv = self.client.create_model_version(name, source=source, run_id=run_id, tags={k: str(v) for k, v in tags.items()})
            self.client.set_terminated(run_id, status="FINISHED")
        except MlflowException as exc:
            raise RegistryError(f"MLflow ({self.tracking_uri}): cannot register model {name!r}: {exc.message}") from None
        return ModelVersion(name=name, version=str(mv.version), run_id=run_id, source=source, metrics=metrics)

    def fail_run(self, run_id: str, status: str = "FAILED") -> None:
        try:
            self.client.set_terminated(run_id, status=status)  # FAILED, or KILLED for a run the user stopped
        except Exception:
            pass  # best effort on the way out of a failure

    def resolve(self, name: str, version: str | None = None) -> ModelVersion:
        """A registered version (default: the newest)."""
        from mlflow.exceptions import MlflowException

        try:
            if version in (None, "latest"):
                versions = self.client.search_model_versions(f"name='{name}'")
                if not versions:
                    raise RegistryError(f"model {name!r}: no registered versions in {self.tracking_uri}")
                mv = max(versions, key=lambda v: int(v.version))
            else:
                mv = self.client.get_model_version(name, str(version))
        except MlflowException as exc:
            raise RegistryError(f"model {name!r} version {version or 'latest'}: not found in {self.tracking_uri} ({exc.message})") from None
        metrics = self.client.get_run(mv.run_id).data.metrics if mv.run_id else {}
        return ModelVersion(
            name=name, version=str(mv.version), run_id=mv.run_id, source=mv.source, metrics=metrics,
            created=time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(mv.creation_timestamp / 1000)),
            framework=(mv.tags or {}).get("framework", ""),
        )

    def download(self, mv: ModelVersion, dest: str | None = None) -> str:
        """A local directory with the artifact of `mv`."""
        import mlflow.artifacts

        dest = dest or tempfile.mkdtemp(prefix=f"rayline-{mv.name}-v{mv.version}-")
        try:
            return mlflow.artifacts.download_artifacts(artifact_uri=mv.source, dst_path=dest, tracking_uri=self.tracking_uri)
        except Exception as exc:
            raise RegistryError(f"model {mv.name!r} version {mv.version}: cannot download {mv.source}: {exc}") from None

    def list_models(self, name: str | None = None) -> list[ModelVersion]:
        names = [name] if name else sorted(m.name for m in self.client.search_registered_models())
        out = []
        for n in names:
            versions = self.client.search_model_versions(f"name='{n}'")
            if name and not versions:
                raise RegistryError(f"model {name!r}: no registered versions in {self.tracking_uri}")
            for mv in sorted(versions, key=lambda v: int(v.version)):
                out.append(self.resolve(n, mv.version))
        return out
