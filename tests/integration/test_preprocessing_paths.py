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


def test_materialize_with_progress_counts_every_block_and_equals_ray_materialize(ray_session):
    """data/progress.py's materialize: the blocks Ray Data would materialize, in the same order,
    while each block's rows reach the progress line as they land."""
    import ray

    from rayline.data.progress import PhaseProgress, materialize

    ds = ray.data.range(6_000, override_num_blocks=6).map_batches(lambda b: {"id": b["id"] * 2}, batch_size=None)
    lines = []
    progress = PhaseProgress(lines.append, "transforming train", total_rows=6_000, every_s=0)
    ours = materialize(ds, progress)
    assert type(ours).__name__ == "MaterializedDataset"
    assert ours.num_blocks() == ds.materialize().num_blocks() == 6
    assert [r["id"] for r in ours.take_all()] == [2 * i for i in range(6_000)]
    assert ours.count() == 6_000 and progress.rows == 6_000 and progress.blocks == 6
    assert len(lines) == 6 and lines[-1].startswith("transforming train 6,000 of 6,000 rows, ")
    assert lines[-1].endswith(", ~0 s left")
    counts = [int(line.split()[2].replace(",", "")) for line in lines]
    assert counts == sorted(counts) and counts[0] == 1_000
    # Without a total of rows, the blocks Ray Data planned give the time left.
    reading = PhaseProgress(lines.append, "reading", every_s=0)
    materialize(ds, reading)
    assert reading.total_blocks == 6 and lines[-1].startswith("reading 6,000 rows (6 of 6 blocks), "), lines[-1]
    # Used twice: the blocks stay in the object store, not recomputed.
    assert ours.sum("id") == sum(2 * i for i in range(6_000))
