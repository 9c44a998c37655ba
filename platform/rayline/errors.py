"""rayline's one exception hierarchy; errors from Ray, MLflow and pandas are mapped to it at the boundary."""

from __future__ import annotations

__all__ = [
    "RaylineError",
    "SpecError",
    "DataError",
    "ResourceError",
    "TrainingError",
    "RegistryError",
    "ServeError",
    "PredictionError",
    "ClusterError",
    "EnvironmentFault",
    "InterruptedRun",
]


class RaylineError(Exception):
    """Base of every error rayline reports to a user; the CLI prints it without a traceback."""

    exit_code = 1


class SpecError(RaylineError):
    """The pipeline spec is invalid; holds one message per problem."""

    exit_code = 2

    def __init__(self, problems: list, source: str | None = None):
        self.details = list(problems)  # str, or rayline.spec.Problem (path, what, got, allowed, hint)
        self.problems = [str(p) for p in self.details]
        self.source = source
        head = f"{source}: " if source else ""
        super().__init__(head + "invalid pipeline spec\n" + "\n".join(f"  {p}" for p in self.problems))


class DataError(RaylineError):
    """The data named by the spec cannot be read or does not match the spec."""

    exit_code = 2


class ResourceError(RaylineError):
    """The cluster cannot fit what a stage needs; raised before anything starts, never a hang."""

    exit_code = 3


class TrainingError(RaylineError):
    """Training failed after exhausting its retries."""


class RegistryError(RaylineError):
    """The MLflow registry could not store or find a model."""


class ServeError(RaylineError):
    """The model could not be deployed or queried."""


class PredictionError(ServeError):
    """The model produced an output that cannot be returned (a non-finite value)."""


class ClusterError(RaylineError):
    """No Ray cluster could be started or reached."""


class EnvironmentFault(RaylineError):
    """The machine or cluster rayline runs on failed (rayline.faults): a vanished working directory,
    a full disk, an unwritable workspace, a lost Ray node or connection; not a bug in rayline."""


class InterruptedRun(RaylineError):
    """The user stopped a run (Ctrl-C): nothing half-done was registered or deployed; exit 130 like a shell."""

    exit_code = 130
