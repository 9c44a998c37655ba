"""The probe record (rayline/train/probe.py): written beside a checkpoint's state file, read back,
and the registration-time skew check that compares it with what the loaded artifact gives."""

import os

import numpy as np

from rayline.train.probe import ATOL, PROBE_FILE, RTOL, check_probe, read_probe, write_probe

OUTPUTS = np.array([[0.1, 0.7, 0.2], [0.6, 0.3, 0.1]], dtype=np.float32)


def test_written_beside_the_state_file_and_read_back(tmp_path):
    model_dir = tmp_path / "checkpoint" / "model"
    model_dir.mkdir(parents=True)
    write_probe(str(model_dir), OUTPUTS)
    assert set(os.listdir(tmp_path / "checkpoint")) == {"model", PROBE_FILE}  # beside model/, as rayline_state.json
    record = read_probe(str(tmp_path / "checkpoint"))
    assert record["rows"] == 2 and record["precision"] == "fp32" and record["class_ids"] == [1, 0]
    assert np.array_equal(np.array(record["outputs"], dtype=np.float32), OUTPUTS)  # float32 values kept exactly
    assert read_probe(str(tmp_path)) is None
    write_probe(str(model_dir), None)  # no probe given to the trainer: nothing written, nothing fails


def test_regression_values_have_no_class_ids(tmp_path):
    (tmp_path / "model").mkdir()
    write_probe(str(tmp_path / "model"), np.array([1.5, -2.0]))
    record = read_probe(str(tmp_path))
    assert record["outputs"] == [1.5, -2.0] and "class_ids" not in record


def test_the_same_outputs_within_float_noise_pass(tmp_path):
    (tmp_path / "model").mkdir()
    write_probe(str(tmp_path / "model"), OUTPUTS)
    record = read_probe(str(tmp_path))
    assert check_probe(record, OUTPUTS.astype(np.float64) * (1 + RTOL / 10), "m") == ""
    assert check_probe(None, OUTPUTS, "m") == ""  # a checkpoint from before the probe


def test_skew_is_named_with_the_row_and_the_numbers():
    record = {"rows": 2, "precision": "fp32", "outputs": OUTPUTS.tolist()}
    served = OUTPUTS.copy()
    served[1] = [0.5, 0.4, 0.1]
    assert check_probe(record, served, "register: model digits") == (
        "register: model digits: the registered model, loaded as serving loads it, does not reproduce the predictions "
        "the model being trained made on the probe rows of the test split: row 1 gives [0.5, 0.4, 0.1], training gave "
        f"[0.6, 0.3, 0.1] (max difference 0.1; allowed: rtol {RTOL:g}, atol {ATOL:g}): training/serving skew "
        "(preprocessing or weights differ between the two)")
    assert "gives (1, 3) outputs on the 2 probe rows" in check_probe(record, served[:1], "m")


def test_reduced_precision_training_is_not_compared_value_by_value():
    record = {"rows": 2, "precision": "bf16", "outputs": OUTPUTS.tolist()}
    assert check_probe(record, OUTPUTS + 0.01, "m") == ""
