"""Property tests of `load_spec`: whatever the file holds, a valid PipelineSpec or a SpecError whose every line names a path.

Deterministic for CI: `derandomize=True` and no example database, so every run tries the
same examples; `check_data=False` because the data is not the point here.
"""

import copy
import re
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rayline.errors import SpecError
from rayline.spec import PipelineSpec, load_spec, parse_spec

ROOT = Path(__file__).resolve().parents[2]
BASES = [yaml.safe_load(p.read_text()) for p in sorted((ROOT / "pipelines").glob("*.yaml"))]

# Every line of a SpecError starts with a path (or a label such as "(yaml)") and ": ".
PROBLEM_LINE = re.compile(r"^\S.*?: ")

SETTINGS = dict(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _keys_of(node, out):
    if isinstance(node, dict):
        for k, v in node.items():
            out.add(k)
            _keys_of(v, out)
    elif isinstance(node, list):
        for v in node:
            _keys_of(v, out)
    return out


SPEC_KEYS = sorted(_keys_of(BASES, set()) | {"import", "space", "choice", "grid", "uniform", "loguniform", "randint",
                                             "auth", "api_keys_env", "api_keys_file", "batching", "features", "split",
                                             "impute", "one_hot", "standard_scale", "min_max_scale", "columns"})
SPEC_VALUES = ["torch", "tensorflow", "xgboost", "mlp", "gbdt", "sklearn", "csv", "json", "parquet", "digits", "iris",
               "numeric", "classification", "regression", "accuracy", "rmse", "/x", "x", "a:b", "train.epochs",
               "train.workers", "model.params.dropout", "&a", "*a", "<<"]

keys = st.sampled_from(SPEC_KEYS) | st.text(max_size=6) | st.integers(-3, 3) | st.none() | st.booleans()
scalars = (st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
           | st.sampled_from(SPEC_VALUES))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=5),
                      max_leaves=20)
YAML_CHARS = "ab:-_ \n\t[]{},&*!<>|%@#'\"?.=0123456789e"


@pytest.fixture(scope="module")
def spec_file():
    folder = Path(tempfile.mkdtemp(prefix="rayline-prop-"))
    yield folder / "spec.yaml"
    shutil.rmtree(folder)


def _dump(doc) -> str:
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)


def _check(path: Path, text: str, **kw):
    path.write_text(text, encoding="utf-8")
    try:
        spec = load_spec(path, check_data=False, **kw)
    except SpecError as exc:
        assert exc.problems, text
        for line in exc.problems:
            assert PROBLEM_LINE.match(line) and "\n" not in line, (line, text)
        return
    assert isinstance(spec, PipelineSpec)
    # A valid spec survives the round trip every trial and the registry make.
    parse_spec(spec.model_dump(by_alias=True, exclude_none=True))


@settings(max_examples=200, **SETTINGS)
@given(doc=st.dictionaries(keys, values, max_size=8) | values)
def test_generated_documents(spec_file, doc):
    _check(spec_file, _dump(doc))


@settings(max_examples=150, **SETTINGS)
@given(text=st.text(alphabet=YAML_CHARS, max_size=60))
def test_generated_yaml_text(spec_file, text):
    _check(spec_file, text)


def _locations(node, at=()):
    """Every (container path, key) in a document: mapping keys and list indices."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield at, k
            yield from _locations(v, at + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield at, i
            yield from _locations(v, at + (i,))


def _containers(node, at=()):
    if isinstance(node, dict):
        yield at
    for k, v in (node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()):
        yield from _containers(v, at + (k,))


def _at(node, path):
    for k in path:
        node = node[k]
    return node


@st.composite
def mutated_specs(draw):
    raw = copy.deepcopy(draw(st.sampled_from(BASES)))
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["delete", "replace", "insert"]))
        if op == "insert":
            target = _at(raw, draw(st.sampled_from(list(_containers(raw)))))
            target[draw(keys)] = draw(values)
            continue
        locations = list(_locations(raw))
        if not locations:
            break
        parent, key = draw(st.sampled_from(locations))
        container = _at(raw, parent)
        if op == "delete":
            del container[key]
        else:
            container[key] = draw(values)
    return raw


@settings(max_examples=300, **SETTINGS)
@given(raw=mutated_specs())
def test_mutated_valid_specs(spec_file, raw):
    _check(spec_file, _dump(raw))


@settings(max_examples=100, **SETTINGS)
@given(base=st.sampled_from(BASES),
       overrides=st.dictionaries(st.lists(st.sampled_from(SPEC_KEYS) | st.text(max_size=4), min_size=1, max_size=4)
                                 .map(".".join), values, min_size=1, max_size=3))
def test_overrides_on_valid_specs(spec_file, base, overrides):
    _check(spec_file, _dump(base), overrides=overrides)
