"""The models-from-code file of every registered rayline version (see rayline/registry/pyfunc.py).

MLflow copies this file into the model directory when rayline registers a version, and runs
it when the model is loaded (`mlflow.pyfunc.load_model`, `mlflow models serve`): it holds no
state, only the class that builds rayline's own Predictor from the model's `rayline`
artifact. Not meant to be imported as a module.
"""

import mlflow
import pandas as pd
from mlflow.pyfunc import PythonModel

__all__ = ["RaylineModel"]


class RaylineModel(PythonModel):
    """Raw feature rows (a DataFrame) in; `prediction` and `probability_<label>` columns out."""

    def load_context(self, context):
        from rayline.inference.predictor import PYFUNC_ARTIFACT, Predictor

        self.predictor = Predictor(context.artifacts[PYFUNC_ARTIFACT])

    # Annotated as a DataFrame: MLflow then neither warns about a missing type hint nor infers
    # a signature from it; the signature comes from the feature schema (rayline/registry/pyfunc.py).
    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        from mlflow.exceptions import MlflowException

        from rayline.errors import DataError, PredictionError
        from rayline.registry.pyfunc import predict_frame

        frame = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
        try:
            return predict_frame(self.predictor, frame)
        except (DataError, PredictionError) as exc:
            # A bad row is the caller's error: MLflow's scoring server answers 400 with this message.
            raise MlflowException.invalid_parameter_value(str(exc)) from exc


mlflow.models.set_model(RaylineModel())
