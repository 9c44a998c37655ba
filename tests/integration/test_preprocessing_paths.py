"""The training path (Ray Data tasks over Arrow blocks) and the request path (JSON rows) give
the same model input for every step type, with nulls and unseen categories."""

import json

import numpy as np
import pandas as pd

from tests.unit.test_steps import EVERY_STEP, FEATURES, LABEL, ROWS, TRAIN, _steps


def test_ray_data_path_equals_request_path_for_every_step(ray_session):
    import ray

    from rayline.data.pipeline import _ToTrainingBatch
    from rayline.data.preprocess import fit_preprocessing

    steps = _steps(*EVERY_STEP[:4], {"one_hot": {"columns": ["region"]}}, *EVERY_STEP[5:])
    train = pd.concat([TRAIN] * 20, ignore_index=True).assign(churn=["no", "yes"] * 50)
    blocks = [train.iloc[i:i + 30] for i in range(0, len(train), 30)]  # several blocks: statistics combine
    fitted = fit_preprocessing(ray.data.from_pandas(blocks), FEATURES, LABEL, steps)
    assert fitted.to_dict() == fit_preprocessing(train, FEATURES, LABEL, steps).to_dict()

    rows = ROWS * 3
    frame = pd.DataFrame(rows).assign(churn="no")
    # One block, so Ray Data keeps the row order; the batch goes through Arrow and back, as in training.
    ds = ray.data.from_pandas(frame).map_batches(_ToTrainingBatch(fitted), batch_format="pandas")
    on_ray = np.stack(ds.take_batch(len(rows), batch_format="numpy")["features"])
    on_request = fitted.encode_records(json.loads(json.dumps(rows)))
    assert on_ray.dtype == on_request.dtype == np.float32
    assert np.array_equal(on_ray, on_request)
    assert (on_request[:, fitted.output_columns.index("plan=basic")] == [0, 1, 0] * 3).all()  # unseen, imputed null, other
