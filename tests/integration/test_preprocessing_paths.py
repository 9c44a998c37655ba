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


def test_the_data_stage_runs_on_the_cpus_others_leave_and_fails_at_once_when_none_are_left(ray_session, ws, tmp_path):
    """Served models can hold most CPUs (issue 38: a run hung at `data: started` for 12 minutes with
    `{'CPU': 1.0}` pending). A real actor holds all but half a CPU: the stage's read and map tasks
    run on that half. Holding all but 0.01: a ResourceError at once, naming the holder."""
    import threading
    import time

    import pytest
    import ray
    from sklearn.datasets import load_iris

    from rayline.errors import ResourceError
    from rayline.pipeline.prepare import prepare_stage
    from rayline.spec import parse_spec

    csv = tmp_path / "iris.csv"
    load_iris(as_frame=True).frame.assign(target=lambda f: f["target"].map({0: "a", 1: "b", 2: "c"})).to_csv(csv, index=False)
    spec = parse_spec({"name": "busy-iris", "data": {"source": {"format": "csv", "path": str(csv)}, "label": "target",
                                                     "preprocess": [{"standard_scale": {"columns": "numeric"}}]},
                       "task": "classification", "model": {"framework": "torch", "kind": "mlp"}})

    @ray.remote
    class CpuHolder:
        def ready(self) -> bool:
            return True

    def held_until_only(cpus_left: float):
        """A holder leaving `cpus_left` free, once Ray's resource view (which lags the scheduler) says so.
        Other modules' actors may still be going away: then the holder is sized again."""
        for _ in range(20):
            free = ray.available_resources()["CPU"]
            holder = CpuHolder.options(num_cpus=free - cpus_left).remote()
            ray.get(holder.ready.remote())
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                if abs(ray.available_resources().get("CPU", 0.0) - cpus_left) < 1e-6:
                    return holder, free
                time.sleep(0.05)
            ray.kill(holder)  # sized from a view that changed (other actors came or went): size it again
            time.sleep(0.2)
        raise AssertionError(f"the cluster's free CPUs never settled at {cpus_left}")

    def prepared_while_held(cpus_left: float):
        holder, free = held_until_only(cpus_left)
        events, outcome = [], {}

        def stage():
            try:
                outcome["prepared"] = prepare_stage(spec, ws, data_cache=False, on_stage=lambda *e: events.append(e))
            except Exception as exc:  # noqa: BLE001 - asserted below
                outcome["error"] = exc

        thread = threading.Thread(target=stage, daemon=True)
        thread.start()
        thread.join(180)  # before the fix: waits forever for a whole CPU
        ray.kill(holder)
        deadline = time.monotonic() + 30  # the holder's CPUs are back (ray.kill returns before they are)
        while ray.available_resources().get("CPU", 0.0) < free - 1e-6 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not thread.is_alive(), f"the data stage waited with {cpus_left} CPU free: {events}"
        return outcome, events

    outcome, events = prepared_while_held(0.5)
    assert "error" not in outcome, outcome
    assert outcome["prepared"][0].rows["train"] + outcome["prepared"][0].rows["valid"] + outcome["prepared"][0].rows["test"] == 150
    shares = [detail for stage, event, detail in events if event == "progress" and "CPU per task" in detail]
    assert shares and float(shares[0].split()[0]) <= 0.5, events

    outcome, _ = prepared_while_held(0.01)
    with pytest.raises(ResourceError, match=r"^data: 0\.0\d of the cluster's 2 CPUs are free; .*Held by: .*CpuHolder"):
        raise outcome["error"]
