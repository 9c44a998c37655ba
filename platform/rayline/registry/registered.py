"""The model registry: the winner's artifact logged under `model/` of the pipeline run and registered as
a new version of model `<name>`; versions, aliases, tags and each version's deployments.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass

from rayline.errors import RegistryError
from rayline.redact import redact_text
from rayline.registry.store import one_line

__all__ = ["JUDGEMENT_TAG", "RETRAIN_TAG", "RETRAIN_LOOP_TAG", "DEPLOYMENTS_TAG", "DEPLOYMENTS_TAG_CHARS", "deployments_of", "ModelVersion", "RegisteredModels"]

# A version's deployments (`rayline models show`), oldest first: a JSON list of {at, action, role,
# percent, route, app, ...} that rayline/serve appends to each time the version is given traffic.
DEPLOYMENTS_TAG = "rayline.deployments"
# On a challenger version: its judgement against the champion (rayline/retrain/judge.py), JSON.
JUDGEMENT_TAG = "rayline.judgement"
# On a version the retrain loop asked for: why (its trigger and what it saw), JSON (rayline/retrain/loop.py).
RETRAIN_TAG = "rayline.retrain"
# On the registered model: the retrain loop's record (state, last decision, what it has seen), JSON.
RETRAIN_LOOP_TAG = "rayline.retrain_loop"
# Newest entries that fit in this many characters are kept: MLflow 2+ takes 100,000 per model
# version tag, MLflow 1.x servers 5,000 (about 30 entries of ~150 characters).
DEPLOYMENTS_TAG_CHARS = 5000


def deployments_of(tags: dict) -> list[dict]:
    """The deployment record in a version's tags, oldest first; [] when there is none (a version
    registered or deployed before rayline kept it) or it is not a JSON list."""
    try:
        items = json.loads((tags or {}).get(DEPLOYMENTS_TAG) or "[]")
    except ValueError:
        return []
    return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []


@dataclass
class ModelVersion:
    name: str
    version: str
    run_id: str
    source: str
    metrics: dict
    created: str = ""
    framework: str = ""


def _choices(values: list[str], limit: int = 20) -> str:
    """`a, b, c`; a long list's first `limit` and how many more."""
    shown = ", ".join(values[:limit])
    return shown + (f" and {len(values) - limit} more" if len(values) > limit else "")


def _name_filter(name: str) -> tuple[str, bool]:
    """An MLflow filter selecting model `name`, and whether results need an exact-name check.

    MLflow's filter parser strips the quotes around a value without unescaping anything
    (measured: `name='a\\'b'` matches the model named `a\\'b`), so a name is quoted with a quote
    character it does not contain. A name with both kinds is matched with LIKE, each quote
    and wildcard as `_`, and the results are filtered to the exact name.
    """
    if "'" not in name:
        return f"name = '{name}'", False
    if '"' not in name:
        return f'name = "{name}"', False
    return "name LIKE '" + re.sub(r"['\"%_]", "_", name) + "'", True


class RegisteredModels:
    """The model registry: registering a version, finding versions, aliases, tags, deployments."""

    def register(self, run_id: str, name: str, artifact_dir: str, metrics: dict, tags: dict,
                 input_example=None) -> ModelVersion:
        """Log the artifact under the pipeline run as an MLflow pyfunc model and register it as a
        new version of `name`. `input_example`: raw rows (a DataFrame, e.g. the test split) whose
        first rows become the pyfunc model's input example."""
        from mlflow.exceptions import MlflowException

        with self._guard(f"register model {name!r}"):
            self._log(run_id, metrics=[(k, v, 0) for k, v in metrics.items()])
            pyfunc = self._log_model(run_id, artifact_dir, input_example)
            try:
                self.client.create_registered_model(name, description="Registered by rayline.")
            except MlflowException as exc:
                if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                    raise
            source = f"{self.client.get_run(run_id).info.artifact_uri}/model"
            # `rayline.pyfunc`: versions registered before rayline wrote pyfunc models lack it.
            mv = self.client.create_model_version(name, source=source, run_id=run_id,
                            tags={k: str(v) for k, v in {**tags, **({"rayline.pyfunc": "true"} if pyfunc else {})}.items()})
            self.client.set_terminated(run_id, status="FINISHED")
        return ModelVersion(name=name, version=str(mv.version), run_id=run_id, source=source, metrics=metrics)

    def _log_model(self, run_id: str, artifact_dir: str, input_example) -> bool:
        """The run's `model/`: the MLflow pyfunc model of a rayline artifact (rayline/registry/pyfunc.py),
        built in the workspace's tmp and logged whole, so a failure logs nothing. Measured on a
        2-core machine: +0.03 s for digits (64 features), +0.3 s the first time in a process
        (MLflow's pyfunc modules load). A directory that is not a rayline artifact (no
        preprocessing.json: stand-ins in tests) is logged as it is. True when a pyfunc model was logged."""
        from rayline.inference.predictor import META_FILE, PREPROCESSING_FILE

        if not all(os.path.isfile(os.path.join(artifact_dir, f)) for f in (META_FILE, PREPROCESSING_FILE)):
            self.client.log_artifacts(run_id, artifact_dir, artifact_path="model")
            return False
        from rayline.registry.pyfunc import package

        staging = self.ws.temp_dir("pyfunc")
        try:
            model_dir = package(artifact_dir, os.path.join(staging, "model"), run_id=run_id, artifact_path="model",
                                input_example=input_example)
            self.client.log_artifacts(run_id, model_dir, artifact_path="model")
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return True

    def _versions(self, name: str) -> list:
        """Every version of model `name` (all pages), whatever characters the name holds."""
        filter_string, exact = _name_filter(name)
        out, token = [], None
        while True:
            page = self.client.search_model_versions(filter_string, page_token=token)
            out.extend(v for v in page if not exact or v.name == name)
            token = getattr(page, "token", None)
            if not token:
                return out

    def resolve(self, name: str, version: str | None = None) -> ModelVersion:
        """A registered version (default: the newest)."""
        from mlflow.exceptions import MlflowException

        label = f"model {name!r} version {version or 'latest'}"
        with self._guard(f"look up {label}"):
            if version in (None, "latest"):
                versions = self._versions(name)
                if not versions:
                    raise RegistryError(f"model {name!r}: no registered versions in {self.shown_uri}")
                mv = max(versions, key=lambda v: int(v.version))
            else:
                try:
                    mv = self.client.get_model_version(name, str(version))
                except MlflowException as exc:
                    if exc.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                        raise
                    raise RegistryError(f"{label}: not found in {self.shown_uri} "
                                        f"({redact_text(one_line(exc.message), self.tracking_uri)})") from exc
            metrics = self.client.get_run(mv.run_id).data.metrics if mv.run_id else {}
        return ModelVersion(
            name=name, version=str(mv.version), run_id=mv.run_id, source=mv.source, metrics=metrics,
            created=time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(mv.creation_timestamp / 1000)),
            framework=(mv.tags or {}).get("framework", ""),
        )

    def _model_names(self) -> list[str]:
        """Every registered model's name (all pages), sorted."""
        names, token = [], None
        while True:
            page = self.client.search_registered_models(page_token=token)
            names.extend(m.name for m in page)
            token = getattr(page, "token", None)
            if not token:
                return sorted(names)

    def list_models(self, name: str | None = None) -> list[ModelVersion]:
        with self._guard("list registered models" if name is None else f"list versions of model {name!r}"):
            names = [name] if name is not None else self._model_names()
            out = []
            for n in names:
                versions = self._versions(n)
                if name is not None and not versions:
                    raise RegistryError(f"model {name!r}: no registered versions in {self.shown_uri}")
                for mv in sorted(versions, key=lambda v: int(v.version)):
                    out.append(self.resolve(n, mv.version))
        return out

    def version_details(self, name: str, version: str | None = None):
        """(MLflow's ModelVersion, its run or None when the run is gone) of version `version` of
        `name` (default or "latest": the newest). An unknown model names the registered ones, an
        unknown version the model's versions."""
        from mlflow.exceptions import MlflowException

        with self._guard(f"look up model {name!r} version {version or 'latest'}"):
            versions = self._versions(name)
            if not versions:
                names = self._model_names()
                if name in names:  # registered, its versions all deleted
                    raise RegistryError(f"model {name!r}: no registered versions in {self.shown_uri}")
                known = _choices(names) if names else "none registered yet: run `rayline run SPEC`"
                raise RegistryError(f"model {name!r}: not registered in {self.shown_uri} (got {name!r}; allowed: {known})")
            numbers = sorted((str(v.version) for v in versions), key=int)
            if version in (None, "latest"):
                mv = max(versions, key=lambda v: int(v.version))
            else:
                found = [v for v in versions if str(v.version) == str(version).strip()]
                if not found:
                    raise RegistryError(f"model {name!r} version {version}: not registered (got {version!r}; "
                                        f"allowed: {_choices(numbers)} or latest)")
                mv = found[0]
            mv = self.client.get_model_version(name, str(mv.version))  # a search's versions lack their aliases
            try:
                run = self.client.get_run(mv.run_id) if mv.run_id else None
            except MlflowException as exc:
                if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
                    raise
                run = None  # deleted for good (mlflow gc): the version outlives it
        return mv, run

    def record_deployment(self, name: str, version: str, entry: dict) -> None:
        """Append `entry` to version `version`'s deployment record (DEPLOYMENTS_TAG)."""
        with self._guard(f"record a deployment of model {name!r} version {version}"):
            tags = self.client.get_model_version(name, str(version)).tags or {}
            record = [*deployments_of(tags), entry]
            while len(record) > 1 and len(json.dumps(record)) > DEPLOYMENTS_TAG_CHARS:
                record.pop(0)
            self.client.set_model_version_tag(name, str(version), DEPLOYMENTS_TAG, json.dumps(record))

    def alias_version(self, name: str, alias: str) -> str | None:
        """The version `alias` points at on model `name`, or None when the alias is not set."""
        from mlflow.exceptions import MlflowException

        with self._guard(f"read alias {alias!r} of model {name!r}"):
            try:
                return str(self.client.get_model_version_by_alias(name, alias).version)
            except MlflowException as exc:
                if exc.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                    raise
                return None

    def set_alias(self, name: str, alias: str, version: str) -> None:
        with self._guard(f"set alias {alias!r} of model {name!r} to version {version}"):
            self.client.set_registered_model_alias(name, alias, str(version))

    def delete_alias(self, name: str, alias: str) -> None:
        """Remove `alias` from model `name`; nothing to do when it is not set."""
        from mlflow.exceptions import MlflowException

        with self._guard(f"delete alias {alias!r} of model {name!r}"):
            try:
                self.client.delete_registered_model_alias(name, alias)
            except MlflowException as exc:
                if exc.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                    raise

    def set_version_tag(self, name: str, version: str, key: str, value: str) -> None:
        with self._guard(f"tag model {name!r} version {version}"):
            self.client.set_model_version_tag(name, str(version), key, value)

    def model_tag(self, name: str, key: str) -> str | None:
        """Tag `key` of registered model `name`, or None (also when the model is not registered)."""
        from mlflow.exceptions import MlflowException

        with self._guard(f"read the tags of model {name!r}"):
            try:
                return (self.client.get_registered_model(name).tags or {}).get(key)
            except MlflowException as exc:
                if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
                    raise
                return None

    def model_versions(self, name: str) -> list:
        """Every version of model `name` as MLflow's search gives them (with their tags)."""
        with self._guard(f"list the versions of model {name!r}"):
            return self._versions(name)

    def set_model_tag(self, name: str, key: str, value: str) -> None:
        with self._guard(f"tag model {name!r}"):
            self.client.set_registered_model_tag(name, key, value)
