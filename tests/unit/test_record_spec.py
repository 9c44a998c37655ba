"""What a run's record keeps of its spec for `--resume` (rayline/pipeline/record.py's training_spec)."""

from rayline.pipeline.record import training_spec
from rayline.spec import apply_overrides, parse_spec

SPEC = {"name": "iris", "data": {"source": {"format": "sklearn", "name": "iris"}, "label": "target"},
        "model": {"framework": "xgboost", "kind": "gbdt"}, "serve": {"route": "/iris"}}


def test_where_the_data_stage_runs_and_how_it_serves_do_not_block_a_resume():
    spec = parse_spec(SPEC)
    flat = training_spec(spec)
    assert "data.source.name" in flat and "data.label" in flat
    assert not any(k.startswith("serve") or k == "data.in_process" for k in flat)
    assert training_spec(apply_overrides(spec, {"data.in_process": "never", "serve.route": "/other"})) == flat
    assert training_spec(apply_overrides(spec, {"data.split.seed": 7})) != flat  # what the data is still counts
