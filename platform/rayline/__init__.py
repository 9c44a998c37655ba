"""rayline: one YAML spec to a served model on Ray.

Ray Data reads and preprocesses, Ray Train trains (torch DDP, TensorFlow
MultiWorkerMirroredStrategy, XGBoost), Ray Tune sweeps, MLflow registers the winner with
its fitted preprocessing, and Ray Serve answers HTTP. This module is the public API;
heavy dependencies load only when a function that needs them runs.
"""

from __future__ import annotations

from rayline.errors import (
    ClusterError,
    DataError,
    RaylineError,
    RegistryError,
    ResourceError,
    PredictionError,
    ServeError,
    SpecError,
    TrainingError,
)
from rayline.spec import PipelineSpec, load_spec, parse_spec, spec_json_schema
from rayline.version import __version__

__all__ = [
    "__version__",
    "PipelineSpec",
    "load_spec",
    "parse_spec",
    "spec_json_schema",
    "run",
    "load_model",
    "Client",
    "RaylineError",
    "SpecError",
    "DataError",
    "ResourceError",
    "TrainingError",
    "RegistryError",
    "ServeError",
    "PredictionError",
    "ClusterError",
]


def run(spec: PipelineSpec | str, *, workspace: str | None = None, address: str | None = None,
        deploy: bool = True, host: str = "127.0.0.1", port: int = 8000):
    """Run a pipeline (a spec object or a spec file path); returns a `rayline.pipeline.summary.RunSummary`.

    Uses the Ray this process is connected to, else connects like `rayline run`. An
    embedded Ray started here keeps running (and serving) until the process exits.
    """
    from rayline.cluster.connection import connect
    from rayline.pipeline.run import run_pipeline
    from rayline.workspace import workspace as make_workspace

    spec_path = None
    if not isinstance(spec, PipelineSpec):
        spec_path = str(spec)
        spec = load_spec(spec)
    ws = make_workspace(workspace)
    connect(ws, address)
    return run_pipeline(spec, ws, spec_path=spec_path, deploy=deploy, host=host, port=port)


def load_model(name: str, version: str | None = None, *, workspace: str | None = None, tracking_uri: str | None = None):
    """The registered model `name` (default: newest version) as an offline `model.Predictor`.

    The version's files are downloaded once into the workspace's cache (`<workspace>/cache/models`;
    see `Registry.cache_root`) and reused by later loads and by Serve replicas on this machine."""
    from rayline.model import Predictor
    from rayline.registry import Registry
    from rayline.workspace import workspace as make_workspace

    registry = Registry(make_workspace(workspace, tracking_uri))
    mv = registry.resolve(name, version)
    return Predictor(registry.download(mv), version=mv.version)


def __getattr__(name: str):
    # Client imports httpx (~80 ms): loaded on first use, so `rayline --help` and `import rayline` stay fast.
    if name == "Client":
        from rayline.client import Client

        return Client
    raise AttributeError(f"module 'rayline' has no attribute {name!r}")
