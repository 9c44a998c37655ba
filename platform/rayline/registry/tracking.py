"""MLflow tracking: every pipeline run is an MLflow run in experiment `rayline/<name>`; each trial is a
child run with its overrides as params and its per-epoch validation metrics.
"""

from __future__ import annotations

import json
import re
import time

__all__ = ["Tracking"]


def _flatten(prefix: str, value, out: dict) -> dict:
    """Nested mappings as MLflow params: dotted keys; a list item's `[i]` (tuned preprocessing
    paths such as data.preprocess[0].impute.strategy) as `.i`, since MLflow keys take only
    alphanumerics, `_-. :/`."""
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        key = re.sub(r"[^\w\-. :/]", "_", re.sub(r"\[(\d+)\]", r".\1", prefix))
        out[key] = json.dumps(value) if isinstance(value, (list, tuple)) else value
    return out


class Tracking:
    """MLflow tracking: one run per pipeline, a child run per trial, the leaderboard."""

    def start_pipeline_run(self, spec, spec_path: str | None) -> str:
        with self._guard(f"start a run for pipeline {spec.name!r}"):
            run = self.client.create_run(
                self._experiment_id(spec.name),
                run_name=f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}",
                tags={"rayline.kind": "pipeline", "rayline.spec_path": spec_path or ""},
            )
            from rayline.spec.pipeline_space import model_families

            # A sweep over model families has no one `model`: the trials' runs and the registered
            # version say which family each trained.
            families = spec.tune is not None and model_families(spec.tune.space)
            params = _flatten("", spec.model_dump(mode="json", by_alias=True, exclude_none=True,
                                                  exclude={"tune", "model"} if families else {"tune"}), {})
            self._log(run.info.run_id, params=params)
            return run.info.run_id

    def log_trial(self, parent_run_id: str, spec_name: str, trial_id: str, overrides: dict, status: str,
                  history: list[dict], winner: bool, *, stop_reason: str | None = None,
                  units_trained: int | None = None, events: list[dict] | None = None,
                  family: str | None = None) -> str:
        """One trial as a child run of the pipeline run: its overrides as params, its per-epoch
        validation metrics (step = epoch), and tags the sweep report reads back:
        rayline.stop_reason, rayline.units_trained, rayline.trial_events (JSON) and rayline.family."""
        import json

        tags = {"mlflow.parentRunId": parent_run_id, "rayline.kind": "trial", "rayline.trial_status": status,
                "rayline.winner": str(winner).lower()}
        if stop_reason:
            tags["rayline.stop_reason"] = stop_reason
        if units_trained is not None:
            tags["rayline.units_trained"] = str(units_trained)
        if events:
            tags["rayline.trial_events"] = json.dumps(events, default=str)[:5000]  # MLflow's tag value limit is 8000
        if family:
            tags["rayline.family"] = family
        with self._guard(f"log trial {trial_id}"):
            run = self.client.create_run(
                self._experiment_id(spec_name),
                run_name=f"trial-{trial_id}",
                tags=tags,
            )
            metrics = [(k, v, row["epoch"]) for row in history for k, v in row.items() if k != "epoch"]
            self._log(run.info.run_id, params=_flatten("", overrides, {}), metrics=metrics)
            self.client.set_terminated(run.info.run_id,
                       status="FINISHED" if status != "error" else "FAILED")
            return run.info.run_id

    def log_leaderboard(self, run_id: str, metric: str, rows: list) -> None:
        """The sweep's best trial per model family on the pipeline run: a metric per family
        (`best_valid_<metric>/<family>`) for MLflow's charts and comparisons, and the table as
        `leaderboard.json` (family, trial, value, trials, overrides), best first."""
        from dataclasses import asdict

        with self._guard("log the model-family leaderboard"):
            self._log(run_id, metrics=[(f"best_valid_{metric}/{row.family}", row.value, 0) for row in rows])
            self.client.log_dict(run_id, {"metric": metric, "families": [asdict(row) for row in rows]},
                                 "leaderboard.json")

    def _log(self, run_id: str, params: dict | None = None, metrics: list | None = None) -> None:
        from mlflow.entities import Metric, Param

        now = int(time.time() * 1000)
        params = [Param(k, str(v)[:6000]) for k, v in (params or {}).items()]
        metrics = [Metric(k, float(v), now, int(step)) for k, v, step in (metrics or [])]
        for i in range(0, max(len(params), len(metrics), 1), 100):  # MLflow's batch limits
            self.client.log_batch(run_id, metrics=metrics[i:i + 100], params=params[i:i + 100])

    def fail_run(self, run_id: str, status: str = "FAILED") -> None:
        try:
            self.client.set_terminated(run_id, status=status)
        except Exception:
            pass  # best effort on the way out of a failure
