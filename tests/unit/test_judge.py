"""The judgement's arithmetic (rayline/retrain/judge.py) and its line in `rayline models show`
(rayline/registry/lineage.py); the end to end judge on registered versions is in
tests/integration/test_versions.py."""

import pytest

from rayline.errors import DataError
from rayline.registry.lineage import judgement_text
from rayline.retrain import Judgement, read_rows


def _judgement(metric, mode, challenger, champion, min_delta=0.0):
    return Judgement(name="m", challenger="2", champion="1", metric=metric, mode=mode, challenger_score=challenger,
                     champion_score=champion, min_delta=min_delta, rows=10, data="rows.csv")


@pytest.mark.parametrize("metric, mode, challenger, champion, min_delta, gain, qualifies", [
    ("accuracy", "max", 0.91, 0.90, 0.0, 0.01, True),
    ("accuracy", "max", 0.89, 0.90, 0.0, -0.01, False),
    ("accuracy", "max", 0.89, 0.90, -0.02, -0.01, True),  # a bounded loss accepted
    ("accuracy", "max", 0.905, 0.90, 0.01, 0.005, False),  # better, but not by enough
    ("log_loss", "min", 0.30, 0.40, 0.0, 0.10, True),  # lower is better
    ("rmse", "min", 12.0, 10.0, 0.0, -2.0, False),
])
def test_the_gain_is_in_the_metrics_own_direction(metric, mode, challenger, champion, min_delta, gain, qualifies):
    judged = _judgement(metric, mode, challenger, champion, min_delta)
    assert judged.gain == pytest.approx(gain) and judged.qualifies is qualifies
    assert judged.to_dict()["qualifies"] is qualifies
    line = judgement_text({**judged.to_dict(), "time": "T"})
    assert line.startswith(f"challenger of version 1 by {metric} on 10 rows (rows.csv)")
    assert line.endswith(("qualifies (T)" if qualifies else "does not qualify (T)")) and f"gain {gain:+.4f}" in line


def test_a_record_written_by_hand_or_an_older_rayline_still_prints():
    assert judgement_text({}) == "unknown (unknown)"
    assert judgement_text({"qualifies": True, "gain": "x"}) == "qualifies (unknown)"


def test_rows_come_from_csv_or_parquet_and_anything_else_is_named(tmp_path):
    (tmp_path / "rows.csv").write_text("a,target\n1,0\n")
    assert list(read_rows(str(tmp_path / "rows.csv")).columns) == ["a", "target"]
    with pytest.raises(DataError, match=r"--data: unknown file type \(got '.*rows.txt'; allowed: .csv, .parquet, .pq\)"):
        read_rows(str(tmp_path / "rows.txt"))
    with pytest.raises(DataError, match="--data: no such file"):
        read_rows(str(tmp_path / "none.csv"))
    (tmp_path / "bad.parquet").write_text("not parquet")
    with pytest.raises(DataError, match="--data: .*bad.parquet could not be read"):
        read_rows(str(tmp_path / "bad.parquet"))
