"""rayline: one YAML spec to a served model on Ray.

Ray Data reads and preprocesses, Ray Train trains (torch DDP, TensorFlow
MultiWorkerMirroredStrategy, XGBoost), Ray Tune sweeps, MLflow registers the winner with
its fitted preprocessing, and Ray Serve answers HTTP. This module is the public API;
heavy dependencies load only when a function that needs them runs.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys

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
    """The registered model `name` (default: newest version) as an offline `rayline.inference.predictor.Predictor`.

    The version's files are downloaded once into the workspace's cache (`<workspace>/cache/models`;
    see `Registry.cache_root`) and reused by later loads and by Serve replicas on this machine."""
    from rayline.inference.predictor import Predictor
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


# Modules that moved from the package's top level into the stage they serve, by their old names. A
# version registered before the move carries a copy of the old pyfunc_model.py (`from rayline.model
# import ...`, `from rayline.pyfunc import ...`), and Tune's saved sweep state pickles its callbacks by
# module name: `import rayline.model` gives the module at its new home, the same module object,
# imported only when the old name is.
_MOVED = {
    "rayline.artifact": "rayline.pipeline.artifact",
    "rayline.cluster_probe": "rayline.cluster.probe",
    "rayline.event_files": "rayline.train.event_files",
    "rayline.lineage": "rayline.registry.lineage",
    "rayline.model": "rayline.inference.predictor",
    "rayline.native_stderr": "rayline.inference.native_stderr",
    "rayline.offline_metrics": "rayline.evaluation.offline",
    "rayline.orphans": "rayline.cluster.orphans",
    "rayline.pyfunc": "rayline.registry.pyfunc",
    "rayline.pyfunc_model": "rayline.registry.pyfunc_model",
    "rayline.resources": "rayline.train.resources",
    "rayline.resume": "rayline.tune.resume",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds a `_MOVED` old name and loads it as the module at its new name."""

    def find_spec(self, fullname, path=None, target=None):
        return importlib.machinery.ModuleSpec(fullname, self) if fullname in _MOVED else None

    def create_module(self, spec):
        module = importlib.import_module(_MOVED[spec.name])
        spec.loader_state = module.__spec__  # the import system now sets module.__spec__ to `spec`
        return module

    def exec_module(self, module):
        spec = module.__spec__
        if spec.loader is self:  # put back the module's own spec: its name, origin, loader
            module.__spec__ = spec.loader_state


if not any(type(f).__name__ == _MovedModules.__name__ and type(f).__module__ == __name__ for f in sys.meta_path):
    sys.meta_path.insert(0, _MovedModules())
