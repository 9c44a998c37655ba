"""Open Inference Protocol tensors <-> rows (rayline.serve.oip_codec), without Ray: JSON and
binary tensors (encoded by tritonclient's own helpers where they exist), nulls, and the
exact error messages."""

import json
import struct

import numpy as np
import pytest

from rayline.serve import oip_codec
from rayline.serve.oip_codec import OipError, decode_request, encode_response, model_metadata, translate_detail

FEATURES = [
    {"name": "age", "type": "number", "nullable": True},
    {"name": "visits", "type": "integer", "nullable": False},
    {"name": "plan", "type": "string", "nullable": False, "categories": ["a", "b"]},
    {"name": "active", "type": "boolean", "nullable": True},
]


def _request(*inputs, **extra):
    return json.dumps({"inputs": list(inputs), **extra}).encode()


def _t(name, datatype, data, shape=None):
    return {"name": name, "datatype": datatype, "shape": shape or [len(data)], "data": data}


def _binary(tensors):
    """(header bytes, header length) of a binary request built like tritonclient does."""
    header, raw = {"inputs": []}, []
    for name, datatype, payload, n in tensors:
        header["inputs"].append({"name": name, "datatype": datatype, "shape": [n, 1],
                                 "parameters": {"binary_data_size": len(payload)}})
        raw.append(payload)
    text = json.dumps(header).encode()
    return text + b"".join(raw), str(len(text))


def test_json_tensors_become_positional_rows_in_feature_order():
    body = _request(_t("plan", "BYTES", ["a", "b"]), _t("visits", "INT64", [[3], [4]], shape=[2, 1]),
                    _t("age", "FP64", [41.5, None]), id="r1")
    decoded = decode_request(body, None, FEATURES, "classification")
    # active left out (nullable): null in every row; age's JSON null passes on as null
    assert decoded.rows == [[41.5, 3, "a", None], [None, 4, "b", None]]
    assert decoded.id == "r1" and decoded.outputs == ["predictions", "probabilities"]
    assert decoded.binary == {"predictions": False, "probabilities": False}


def test_binary_tensors_decode_like_tritonclient_encodes_them():
    from tritonclient.utils import serialize_byte_tensor

    plan = serialize_byte_tensor(np.array([b"a", "bé".encode()], dtype=np.object_)).item()
    age = np.array([1.5, np.nan], dtype=np.float32).tobytes()  # NaN: a binary tensor's null
    visits = np.array([7, 8], dtype=np.int32).tobytes()
    active = np.array([True, False]).tobytes()
    body, length = _binary([("age", "FP32", age, 2), ("visits", "INT32", visits, 2), ("plan", "BYTES", plan, 2),
                            ("active", "BOOL", active, 2)])
    decoded = decode_request(body, length, FEATURES, "regression")
    assert decoded.rows == [[1.5, 7, "a", True], [None, 8, "bé", False]]
    assert decoded.outputs == ["predictions"]


def test_bf16_and_fp16_binary():
    bf16 = (np.array([2.5, -1.0], dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()
    fp16 = np.array([0.5, 3.0], dtype=np.float16).tobytes()
    features = [{"name": "x", "type": "number"}, {"name": "y", "type": "number"}]
    body, length = _binary([("x", "BF16", bf16, 2), ("y", "FP16", fp16, 2)])
    assert decode_request(body, length, features, "regression").rows == [[2.5, 0.5], [-1.0, 3.0]]


def test_flat_tensors_decode_as_the_fully_checked_form_does():
    """decode_request takes a short path for flat JSON tensors of shape [n] and checks every rule in
    turn for anything else (here: the same values as [n, 1] tensors, nested lists): random requests
    (ints for numbers, nulls, features left out or in any order) decode to the same rows both ways."""
    import random

    rng = random.Random(7)
    values = {"age": lambda: rng.choice([None, rng.random() * 90, rng.randint(0, 90)]),
              "visits": lambda: rng.randint(-5, 5), "plan": lambda: rng.choice(["a", "b"]),
              "active": lambda: rng.choice([True, False, None])}
    datatypes = {"age": ["FP64", "FP32", "FP16"], "visits": ["INT64", "INT8", "FP64"], "plan": ["BYTES"], "active": ["BOOL"]}
    for _ in range(200):
        n = rng.randint(1, 6)
        names = ["visits", "plan"] + [f for f in ("age", "active") if rng.random() < 0.7]
        rng.shuffle(names)
        columns = {f: [values[f]() for _ in range(n)] for f in names}
        kinds = {f: rng.choice(datatypes[f]) for f in names}
        flat = _request(*(_t(f, kinds[f], columns[f]) for f in names))
        nested = _request(*(_t(f, kinds[f], [[v] for v in columns[f]], shape=[n, 1]) for f in names))
        expected = [[columns[f][i] if f in columns else None for f in ("age", "visits", "plan", "active")] for i in range(n)]
        assert decode_request(flat, None, FEATURES, "classification").rows == expected
        assert decode_request(nested, None, FEATURES, "classification").rows == expected


@pytest.mark.parametrize("inputs, message", [
    ([_t("age", "FP64", [1.0])], "inputs: missing tensor for feature(s) visits, plan (allowed: leave out only "
                                 "nullable features: age, active)"),
    ([_t("visits", "BYTES", ["3"])], "input 'visits': datatype 'BYTES' does not fit a integer feature "
                                     "(allowed: INT64, FP64, FP32, FP16, BF16, INT32"),
    ([_t("plan", "FP32", [1.0])], "input 'plan': datatype 'FP32' does not fit a string feature (allowed: BYTES)"),
    ([_t("colour", "BYTES", ["red"])], "input 'colour': not a feature of this model (allowed: age, visits, plan, active)"),
    ([_t("visits", "INT64", [1, 2], shape=[1, 2])], "input 'visits': shape [1, 2] not allowed (allowed: [n] or [n, 1], one value per row)"),
    ([_t("visits", "INT64", [1, 2], shape=[3])], "input 'visits': data has 2 values, shape [3] needs 3"),
    ([_t("visits", "INT64", [1, 2]), _t("plan", "BYTES", ["a"])], "inputs: tensors have different numbers of rows (visits: 2, plan: 1"),
    ([_t("visits", "INT64", [1.5])], "input 'visits'.data[0]: a number in a INT64 tensor (allowed: integers (or null))"),
    ([_t("plan", "BYTES", [3])], "input 'plan'.data[0]: an integer in a BYTES tensor (allowed: strings (or null))"),
    ([_t("visits", "INT64", [1]), _t("visits", "INT64", [2])], "input 'visits': given twice"),
    ([_t("visits", "INT64", [])], "input 'visits': shape [0] has 0 rows (allowed: 1 to 10000)"),
    ([{"name": "visits", "datatype": "INT64", "shape": [1]}], "input 'visits': no data (allowed: 'data', or "
                                                              "parameters.binary_data_size with binary data)"),
])
def test_bad_tensors_name_the_input_and_what_is_allowed(inputs, message):
    with pytest.raises(OipError) as err:
        decode_request(_request(*inputs), None, FEATURES, "classification")
    assert err.value.status == 400 and err.value.message.startswith(message), err.value.message


@pytest.mark.parametrize("body, length, message", [
    (b"{", None, "request body: not valid JSON"),
    (b"[]", None, "request body: must be a JSON object with 'inputs' (got list)"),
    (b'{"inputs": []}', None, "inputs: required, a non-empty list of tensors"),
    (b'{"inputs": []}xx', "99", "Inference-Header-Content-Length: must be the JSON header's length in bytes (got '99'"),
])
def test_bad_bodies(body, length, message):
    with pytest.raises(OipError) as err:
        decode_request(body, length, FEATURES, "classification")
    assert err.value.message.startswith(message), err.value.message


def test_binary_sizes_must_add_up():
    features = [{"name": "x", "type": "number"}]
    body, length = _binary([("x", "FP32", b"\0" * 6, 2)])
    with pytest.raises(OipError, match=r"input 'x': binary_data_size is 6 bytes; shape and datatype FP32 need 2 x 4 = 8"):
        decode_request(body, length, features, "regression")
    body, length = _binary([("x", "FP32", b"\0" * 8, 2)])
    with pytest.raises(OipError, match="request body: 3 bytes of binary data belong to no input"):
        decode_request(body + b"abc", length, features, "regression")
    strings = [{"name": "s", "type": "string"}]
    body, length = _binary([("s", "BYTES", struct.pack("<I", 9) + b"ab", 1)])
    with pytest.raises(OipError, match="input 's': binary BYTES element 0 says 9 bytes, 2 remain"):
        decode_request(body, length, strings, "regression")


def test_requested_outputs_and_binary_choice():
    inputs = [_t("visits", "INT64", [1]), _t("plan", "BYTES", ["a"])]
    decoded = decode_request(_request(*inputs, outputs=[{"name": "probabilities", "parameters": {"binary_data": True}}]),
                             None, FEATURES, "classification")
    assert decoded.outputs == ["probabilities"] and decoded.binary == {"probabilities": True}
    decoded = decode_request(_request(*inputs, parameters={"binary_data_output": True}), None, FEATURES, "classification")
    assert decoded.binary == {"predictions": True, "probabilities": True}
    with pytest.raises(OipError, match=r"outputs\[0\]: unknown output 'probabilities' \(allowed: predictions\)"):
        decode_request(_request(*inputs, outputs=[{"name": "probabilities"}]), None, FEATURES, "regression")
    with pytest.raises(OipError, match=r"outputs\[0\].parameters.classification: not supported"):
        decode_request(_request(*inputs, outputs=[{"name": "predictions", "parameters": {"classification": 2}}]),
                       None, FEATURES, "classification")


META = {"name": "churn", "version": "3", "framework": "xgboost", "task": "classification", "labels": ["no", "yes"],
        "features": FEATURES}


def test_response_json_and_binary_read_back_by_tritonclient():
    from tritonclient.http import InferResult

    predict = {"predictions": ["yes", "no"], "probabilities": [{"no": 0.25, "yes": 0.75}, {"no": 0.9, "yes": 0.1}],
               "version": "3"}
    decoded = decode_request(_request(_t("visits", "INT64", [1, 2]), _t("plan", "BYTES", ["a", "b"]), id="q",
                                      outputs=[{"name": "predictions"},
                                               {"name": "probabilities", "parameters": {"binary_data": True}}]),
                             None, FEATURES, "classification")
    body, length = encode_response("churn", "3", decoded, predict, META)
    result = InferResult.from_response_body(body, header_length=length)
    assert result.as_numpy("predictions").tolist() == ["yes", "no"]  # JSON BYTES come back as str
    assert result.as_numpy("probabilities").tolist() == [[0.25, 0.75], [0.9, 0.1]]
    response = result.get_response()
    assert response["id"] == "q" and response["model_name"] == "churn" and response["model_version"] == "3"
    assert response["outputs"][0] == {"name": "predictions", "datatype": "BYTES", "shape": [2], "data": ["yes", "no"]}
    assert response["outputs"][1]["parameters"] == {"binary_data_size": 32}

    decoded.binary = {"predictions": True, "probabilities": False}
    body, length = encode_response("churn", "3", decoded, predict, META)
    assert InferResult.from_response_body(body, header_length=length).as_numpy("predictions").tolist() == [b"yes", b"no"]
    decoded.binary = {}
    body, length = encode_response("churn", "3", decoded, predict, META)
    assert length is None and json.loads(body)["outputs"][1]["data"] == [0.25, 0.75, 0.9, 0.1]


def test_model_metadata_lists_features_and_outputs():
    assert model_metadata(META, ["3", "4"]) == {
        "name": "churn", "versions": ["3", "4"], "platform": "rayline-xgboost",
        "inputs": [{"name": "age", "datatype": "FP64", "shape": [-1], "parameters": {"nullable": True}},
                   {"name": "visits", "datatype": "INT64", "shape": [-1]},
                   {"name": "plan", "datatype": "BYTES", "shape": [-1]},
                   {"name": "active", "datatype": "BOOL", "shape": [-1], "parameters": {"nullable": True}}],
        "outputs": [{"name": "predictions", "datatype": "BYTES", "shape": [-1]},
                    {"name": "probabilities", "datatype": "FP64", "shape": [-1, 2]}],
    }
    regression = {**META, "task": "regression", "labels": None}
    assert model_metadata(regression, ["1"])["outputs"] == [{"name": "predictions", "datatype": "FP64", "shape": [-1]}]
    assert oip_codec.label_datatype("classification", [0, 1, 2]) == "INT64"
    assert oip_codec.label_datatype("classification", [True, False]) == "BOOL"


def test_predict_errors_become_one_message_naming_tensor_and_row():
    detail = [{"loc": ["body", "instances", 3, "age"], "msg": "Input should be a valid number", "type": "float_type"},
              {"loc": ["body", "instances"], "msg": "instances[0]: plan: unseen category 'c'", "type": "value_error"}]
    assert translate_detail(detail) == ("input 'age' row 3: Input should be a valid number; "
                                        "inputs: instances[0]: plan: unseen category 'c'")
    assert translate_detail("missing API key") == "missing API key"


def test_all_is_complete():
    public = {n for n in dir(oip_codec) if not n.startswith("_") and getattr(getattr(oip_codec, n), "__module__", "") == oip_codec.__name__}
    assert public - {"annotations"} <= set(oip_codec.__all__)


# Numbers-only models: the decoder hands /predict one matrix, and /predict then skips its schema
# checks (asgi_call.HandedRows). So the matrix must exist only when the schema would accept the rows,
# and should whenever it would and no value is null.
NUMERIC = [{"name": "x", "type": "number", "nullable": False}, {"name": "k", "type": "integer", "nullable": True}]


def _numeric_adapter():
    from rayline.data.preprocess import FeatureInfo, FittedPreprocessing, LabelInfo
    from rayline.serve.schema import build_request_adapter

    pre = FittedPreprocessing(features=[FeatureInfo("x", "number"), FeatureInfo("k", "integer", nullable=True)],
                              label=LabelInfo("y", "regression", None))
    return build_request_adapter(pre)


def test_numeric_matrix_only_when_the_schema_accepts_the_rows():
    import random

    from pydantic import ValidationError

    adapter = _numeric_adapter()
    rng = random.Random(11)
    pool = [0, -3, 2.5, 1e-300, 3.4e38, -3.4e38, 3.5e38, 1e39, 10**40, None, True, False]
    seen = {"matrix": 0, "refused": 0}
    for _ in range(400):
        n = rng.randint(1, 4)
        columns = {name: [rng.choice(pool) if rng.random() < 0.15 else rng.uniform(-99, 99) for _ in range(n)]
                   for name in ("x", "k")}
        body = _request(*(_t(name, "FP64", data) for name, data in columns.items()))
        try:
            decoded = decode_request(body, None, NUMERIC, "regression")
        except OipError:  # a boolean in an FP64 tensor: refused by the protocol before /predict
            assert any(type(v) is bool for data in columns.values() for v in data)
            continue
        try:
            adapter.validate_python({"instances": decoded.rows})
            accepted = True
        except ValidationError:
            accepted = False
        nulls = any(v is None for data in columns.values() for v in data)  # nullable k: rows path, as before
        assert (decoded.matrix is not None) == (accepted and not nulls), columns
        if decoded.matrix is not None:
            assert decoded.matrix.shape == (n, 2) and decoded.matrix.dtype == np.float64
            assert decoded.matrix.tolist() == [[float(v) for v in row] for row in decoded.rows]
        seen["matrix" if accepted else "refused"] += 1
    assert min(seen.values()) > 50, seen  # both kinds of request were tried
    nan = b'{"inputs": [{"name": "x", "datatype": "FP64", "shape": [1], "data": [NaN]},' \
          b' {"name": "k", "datatype": "INT64", "shape": [1], "data": [1]}]}'
    assert decode_request(nan, None, NUMERIC, "regression").matrix is None  # the schema refuses NaN


def test_no_matrix_for_categories_strings_left_out_features_or_binary_tensors():
    both = [_t("x", "FP64", [1.0, 2.0]), _t("k", "INT64", [1, 2])]
    assert decode_request(_request(*both), None, NUMERIC, "regression").matrix is not None
    assert decode_request(_request(both[0]), None, NUMERIC, "regression").matrix is None  # k left out: null
    one_hot = [NUMERIC[0], {**NUMERIC[1], "categories": [1, 2]}]
    assert decode_request(_request(*both), None, one_hot, "regression").matrix is None
    assert decode_request(_request(_t("visits", "INT64", [1]), _t("plan", "BYTES", ["a"])), None,
                          FEATURES, "classification").matrix is None
    body, length = _binary([("x", "FP64", np.array([1.0, 2.0]).tobytes(), 2), ("k", "INT64", np.array([1, 2]).tobytes(), 2)])
    decoded = decode_request(body, length, NUMERIC, "regression")
    assert decoded.matrix is None and decoded.rows == [[1.0, 1], [2.0, 2]]  # the checked path: rows only
