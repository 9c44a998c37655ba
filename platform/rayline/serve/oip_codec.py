"""Open Inference Protocol (KServe V2) tensors <-> rayline rows, without Ray or HTTP.

A V2 request carries one tensor per raw feature, named after the feature, shape [n] or
[n, 1]; this module turns those into the positional rows `/predict` takes
(`{"instances": [[v0, v1, ...], ...]}`, in the order of `/metadata`'s features) and turns
`/predict`'s answer back into output tensors. Value rules (ranges, categories, which
features may be null) are *not* repeated here: `/predict` checks them and its 422 detail is
translated into one V2 error message (`translate_detail`), so the two routes cannot drift.

Datatypes. Inputs: BYTES for string features, BOOL for boolean features, any numeric
datatype (FP16/FP32/FP64/BF16, INT*/UINT*) for integer and number features; metadata
advertises FP64 for number (JSON numbers are doubles: the values reach the model exactly as
over /predict) and INT64 for integer features. Outputs: `predictions` (BYTES for string
labels, BOOL for boolean labels, INT64 for integer labels, FP64 otherwise and for
regression) and, for classification, `probabilities` [n, n_classes] FP64 in the order of
`/metadata`'s `labels`.

Nulls (nullable = an impute step fills the feature): JSON `null` in a tensor's `data`; NaN
in a binary FP16/FP32/FP64/BF16 tensor (binary tensors have no null); or leave the whole
input tensor out (every row null). A null in a feature that is not nullable is refused by
/predict, and the message says so.

Binary tensor extension (Triton's `binary_tensor_data`, which tritonclient and KServe's SDK
use by default): a request body may be the JSON header followed by raw tensor bytes, its
JSON length in the `Inference-Header-Content-Length` header, each binary input marked with
`parameters.binary_data_size`; outputs are sent binary when an output asks
`parameters.binary_data: true`, or the request asks `parameters.binary_data_output: true`
(tritonclient does when no outputs are named). BYTES elements are a 4-byte little-endian
length then the UTF-8 bytes; other datatypes are little-endian, row-major.
"""

from __future__ import annotations

import base64
import json
import math
import struct
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
from pydantic_core import from_json

from rayline.serve.schema import FLOAT32_MAX

__all__ = [
    "OipError", "DecodedRequest", "NUMERIC_DATATYPES", "INPUT_DATATYPES", "decode_request", "encode_response",
    "model_metadata", "input_datatype", "label_datatype", "translate_detail", "HEADER_LENGTH",
]

HEADER_LENGTH = "inference-header-content-length"

# little-endian numpy dtypes of the fixed-size datatypes (BF16 is decoded by hand: numpy has none)
_DTYPES = {
    "BOOL": "?", "UINT8": "<u1", "UINT16": "<u2", "UINT32": "<u4", "UINT64": "<u8",
    "INT8": "<i1", "INT16": "<i2", "INT32": "<i4", "INT64": "<i8",
    "FP16": "<f2", "FP32": "<f4", "FP64": "<f8", "BF16": "<u2",
}
NUMERIC_DATATYPES = ("FP64", "FP32", "FP16", "BF16", "INT64", "INT32", "INT16", "INT8",
                     "UINT64", "UINT32", "UINT16", "UINT8")
_FLOATS = {"FP16", "FP32", "FP64", "BF16"}
# which datatypes a feature kind accepts (first one: what metadata advertises)
INPUT_DATATYPES = {
    "string": ("BYTES",),
    "image": ("BYTES",),  # JSON: base64 text; binary: the file's bytes (handed on as base64 text)
    "text": ("BYTES",),
    "boolean": ("BOOL",),
    "number": NUMERIC_DATATYPES,
    "integer": ("INT64",) + tuple(d for d in NUMERIC_DATATYPES if d != "INT64"),
}
_OUTPUTS = ("predictions", "probabilities")


class OipError(Exception):
    """A request the protocol refuses: `status` and a one-line message for `{"error": ...}`."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class DecodedRequest:
    id: Optional[str]
    columns: dict[str, list]  # feature name -> its n values (a feature left out: absent)
    names: list[str]  # the model's features, in order
    n: int
    outputs: list[str]  # output names to answer, in order
    binary: dict[str, bool] = field(default_factory=dict)  # output name -> send as binary
    # every value as one float64 (n, features) matrix, when the model takes numbers only and each
    # value is one /predict's schema accepts (see asgi_call.HandedRows); else None
    matrix: Optional[np.ndarray] = None

    @property
    def rows(self) -> list[list[Any]]:
        """Positional rows in feature order, ready for /predict's "instances" (a left-out feature: null)."""
        nulls = [None] * self.n
        return [list(r) for r in zip(*(self.columns.get(name, nulls) for name in self.names))]

    def value(self, row: int, name: str) -> Any:
        return self.columns[name][row] if name in self.columns else None


def input_datatype(kind: str) -> str:
    """The datatype metadata advertises for a feature kind (integer | number | boolean | string)."""
    return INPUT_DATATYPES.get(kind, ("BYTES",))[0]


def label_datatype(task: str, labels: Optional[list]) -> str:
    if task != "classification" or not labels:
        return "FP64"
    if all(isinstance(v, bool) for v in labels):
        return "BOOL"
    if all(isinstance(v, int) and not isinstance(v, bool) for v in labels):
        return "INT64"
    if all(isinstance(v, str) for v in labels):
        return "BYTES"
    return "FP64" if all(isinstance(v, (int, float)) for v in labels) else "BYTES"


def model_metadata(meta: dict, versions: list[str]) -> dict:
    """V2 model metadata from a version's `/metadata` body."""
    outputs = [{"name": "predictions", "datatype": label_datatype(meta["task"], meta.get("labels")), "shape": [-1]}]
    if meta["task"] == "classification":
        outputs.append({"name": "probabilities", "datatype": "FP64", "shape": [-1, len(meta.get("labels") or [])]})
    return {
        "name": meta["name"],
        "versions": versions,
        "platform": f"rayline-{meta['framework']}",
        "inputs": [{"name": f["name"], "datatype": input_datatype(f["type"]), "shape": [-1],
                    **({"parameters": {"nullable": True}} if f.get("nullable") else {})}
                   for f in meta["features"]],
        "outputs": outputs,
    }


def _split_body(body: bytes, header_length: Optional[str]) -> tuple[bytes, bytes]:
    if header_length is None:
        return body, b""
    try:
        n = int(header_length)
    except ValueError:
        n = -1
    if not 0 < n <= len(body):
        raise OipError(f"Inference-Header-Content-Length: must be the JSON header's length in bytes "
                       f"(got {header_length!r}; allowed: 1 to {len(body)}, the body's length)")
    return body[:n], body[n:]


def _flatten(data: Any, where: str) -> list:
    if type(data) is not list:
        raise OipError(f"{where}.data: must be a list of values, flat or nested by shape (got {type(data).__name__})")
    if list in set(map(type, data)):  # set(map(type, ...)) runs in C: most requests are flat
        flat: list = []
        stack = [iter(data)]
        while stack:
            for v in stack[-1]:
                if isinstance(v, list):
                    stack.append(iter(v))
                    break
                flat.append(v)
            else:
                stack.pop()
        return flat
    return data


def _decode_bytes_elements(raw: bytes, count: int, where: str, raw_bytes: bool = False) -> list:
    """The elements of a binary BYTES tensor: UTF-8 text, or (`raw_bytes`: an image feature's
    encoded files) base64 text of each element's bytes, the form /predict's schema takes."""
    out, pos = [], 0
    for i in range(count):
        if pos + 4 > len(raw):
            raise OipError(f"{where}: binary BYTES data ends after {i} of {count} elements "
                           "(allowed: each element a 4-byte little-endian length, then its bytes)")
        (size,) = struct.unpack_from("<I", raw, pos)
        pos += 4
        if pos + size > len(raw):
            raise OipError(f"{where}: binary BYTES element {i} says {size} bytes, {len(raw) - pos} remain")
        try:
            out.append(base64.b64encode(raw[pos:pos + size]).decode("ascii") if raw_bytes
                       else raw[pos:pos + size].decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise OipError(f"{where}: binary BYTES element {i} is not UTF-8 text (allowed: UTF-8 strings)") from exc
        pos += size
    if pos != len(raw):
        raise OipError(f"{where}: binary BYTES data has {len(raw) - pos} bytes past its {count} elements")
    return out


def _decode_binary(raw: bytes, datatype: str, count: int, where: str, raw_bytes: bool = False) -> list:
    if datatype == "BYTES":
        return _decode_bytes_elements(raw, count, where, raw_bytes)
    dtype = np.dtype(_DTYPES[datatype])
    if len(raw) != count * dtype.itemsize:
        raise OipError(f"{where}: binary_data_size is {len(raw)} bytes; shape and datatype {datatype} need "
                       f"{count} x {dtype.itemsize} = {count * dtype.itemsize}")
    values = np.frombuffer(raw, dtype=dtype)
    if datatype == "BF16":
        values = (values.astype(np.uint32) << 16).view(np.float32)
    if datatype in _FLOATS:  # NaN is how a binary tensor says "missing": /predict's null
        return [None if math.isnan(v) else v for v in values.astype(np.float64).tolist()]
    return values.tolist()


# The Python types json.loads gives that each datatype's JSON data may hold (None: null). json.loads
# makes exact bool/int/float/str objects, so one set of types per tensor, built in C, checks them all.
_JSON_TYPES = {"BYTES": {str, type(None)}, "BOOL": {bool, type(None)}}
_JSON_TYPES.update({d: {int, float, type(None)} for d in _FLOATS})
_JSON_TYPES.update({d: {int, type(None)} for d in NUMERIC_DATATYPES if d not in _FLOATS})
_ALLOWED_TEXT = {"BYTES": "strings (or null)", "BOOL": "true/false (or null)"}


def _check_json_values(values: list, datatype: str, where: str) -> None:
    """The JSON values must be of the tensor's declared datatype (null allowed: /predict
    decides whether the feature takes it)."""
    if set(map(type, values)) <= _JSON_TYPES[datatype]:
        return
    allowed = _ALLOWED_TEXT.get(datatype, "numbers (or null)" if datatype in _FLOATS else "integers (or null)")
    bad = next(i for i, v in enumerate(values) if not (v is None or _fits(v, datatype)))
    raise OipError(f"{where}.data[{bad}]: {_kind_of(values[bad])} in a {datatype} tensor (allowed: {allowed})")


def _fits(v: Any, datatype: str) -> bool:
    if datatype == "BYTES":
        return isinstance(v, str)
    if datatype == "BOOL":
        return isinstance(v, bool)
    if isinstance(v, bool):
        return False
    return isinstance(v, (int, float)) if datatype in _FLOATS else isinstance(v, int)


def _kind_of(v: Any) -> str:
    return {bool: "a boolean", str: "a string", int: "an integer", float: "a number",
            dict: "an object"}.get(type(v), type(v).__name__)


def _checked_tensors(inputs: list, by_name: dict, binary: bytes, max_rows: int) -> tuple[dict, dict]:
    """Every input tensor -> its values, each rule checked in turn: the first broken one is the error."""
    columns: dict[str, list] = {}
    rows_of: dict[str, int] = {}
    offset = 0
    for index, tensor in enumerate(inputs):
        where = f"inputs[{index}]"
        if not isinstance(tensor, dict) or not isinstance(tensor.get("name"), str):
            raise OipError(f"{where}: must be an object with name, shape, datatype and data")
        name = tensor["name"]
        where = f"input '{name}'"
        feature = by_name.get(name)
        if feature is None:
            raise OipError(f"{where}: not a feature of this model (allowed: {', '.join(by_name)})")
        if name in columns:
            raise OipError(f"{where}: given twice (allowed: one tensor per feature)")
        datatype = tensor.get("datatype")
        allowed = INPUT_DATATYPES.get(feature["type"], ("BYTES",))
        if datatype not in allowed:
            raise OipError(f"{where}: datatype {datatype!r} does not fit a {feature['type']} feature "
                           f"(allowed: {', '.join(allowed)})")
        shape = tensor.get("shape")
        if not (type(shape) is list and (len(shape) == 1 or (len(shape) == 2 and type(shape[1]) is int and shape[1] == 1))
                and type(shape[0]) is int and shape[0] >= 0):
            raise OipError(f"{where}: shape {shape!r} not allowed (allowed: [n] or [n, 1], one value per row)")
        n = shape[0]
        if n == 0 or n > max_rows:
            raise OipError(f"{where}: shape {shape} has {n} rows (allowed: 1 to {max_rows})")
        parameters = tensor.get("parameters") or {}
        size = parameters.get("binary_data_size") if isinstance(parameters, dict) else None
        if size is not None:
            if "data" in tensor:
                raise OipError(f"{where}: has both data and parameters.binary_data_size (allowed: one of them)")
            if type(size) is not int or size < 0 or offset + size > len(binary):
                raise OipError(f"{where}: parameters.binary_data_size {size!r} runs past the binary data "
                               f"({len(binary) - offset} bytes left; send Inference-Header-Content-Length "
                               "and the tensor bytes after the JSON)")
            values = _decode_binary(binary[offset:offset + size], datatype, n, where, raw_bytes=feature["type"] == "image")
            offset += size
        else:
            if "data" not in tensor:
                raise OipError(f"{where}: no data (allowed: 'data', or parameters.binary_data_size with binary data)")
            values = _flatten(tensor["data"], where)
            if len(values) != n:
                raise OipError(f"{where}: data has {len(values)} values, shape {shape} needs {n}")
            _check_json_values(values, datatype, where)
        columns[name] = values
        rows_of[name] = n
    if offset != len(binary):
        raise OipError(f"request body: {len(binary) - offset} bytes of binary data belong to no input "
                       "(allowed: exactly the inputs' binary_data_size bytes after the JSON header)")
    return columns, rows_of


def _plain_tensors(inputs: list, by_name: dict, max_rows: int) -> Optional[tuple[dict, dict]]:
    """The common request, decoded with the fewest steps: each input a flat JSON `data` list of n
    values of its declared datatype, shape [n], no parameters. None at the first thing that is not
    so, and `_checked_tensors` decodes the request again and names what is wrong (or handles what
    this path does not: binary data, [n, 1], nested lists)."""
    columns: dict[str, list] = {}
    rows_of: dict[str, int] = {}
    nulls = False
    try:
        for tensor in inputs:
            name, datatype, shape, data = tensor["name"], tensor["datatype"], tensor["shape"], tensor["data"]
            feature = by_name.get(name)
            if (feature is None or name in columns or "parameters" in tensor or type(shape) is not list
                    or len(shape) != 1 or type(data) is not list or datatype not in INPUT_DATATYPES.get(feature["type"], ("BYTES",))):
                return None
            n = shape[0]
            if type(n) is not int or not 0 < n <= max_rows or len(data) != n:
                return None
            types = set(map(type, data))
            if not types <= _JSON_TYPES[datatype]:
                return None
            nulls = nulls or type(None) in types
            columns[name] = data
            rows_of[name] = n
    except (TypeError, KeyError):  # not an object, a key missing, an unhashable name
        return None
    return columns, rows_of, nulls


def _numeric_matrix(columns: dict[str, list], features: list[dict], n: int) -> Optional[np.ndarray]:
    """Every feature's values as one float64 (n, features) matrix, when the model takes numbers
    only (no categories, no strings or booleans), every feature is sent, and every value is what
    /predict's schema accepts (a finite number within float32's range); else None, and the rows
    go through the schema, which names what is wrong."""
    if len(columns) != len(features) or any(f["type"] not in ("integer", "number") or "categories" in f for f in features):
        return None
    try:
        matrix = np.array([columns[f["name"]] for f in features], dtype=np.float64).T
    except (KeyError, OverflowError, TypeError, ValueError):  # an int beyond float64
        return None
    if matrix.shape != (n, len(features)) or not np.isfinite(matrix).all() or (matrix.size and np.abs(matrix).max() > FLOAT32_MAX):
        return None
    return matrix


def decode_request(body: bytes, header_length: Optional[str], features: list[dict], task: str,
                   max_rows: int = 10_000) -> DecodedRequest:
    """A V2 inference request -> positional rows. `features`: `/metadata`'s features
    ({name, type, nullable}); raises OipError naming the tensor and what is allowed."""
    header, binary = _split_body(body, header_length)
    try:
        request = from_json(header)  # pydantic-core's parser: a third faster than json.loads on tensors
    except (ValueError, UnicodeDecodeError) as exc:
        raise OipError("request body: not valid JSON (allowed: a V2 inference request, "
                       "optionally followed by binary tensor data)") from exc
    if not isinstance(request, dict):
        raise OipError(f"request body: must be a JSON object with 'inputs' (got {_kind_of(request)})")
    inputs = request.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise OipError("inputs: required, a non-empty list of tensors, one per feature "
                       f"(allowed names: {', '.join(f['name'] for f in features)})")
    by_name = {f["name"]: f for f in features}
    plain = None if binary else _plain_tensors(inputs, by_name, max_rows)
    columns, rows_of, nulls = plain or (*_checked_tensors(inputs, by_name, binary, max_rows), True)
    counts = sorted(set(rows_of.values()))
    if len(counts) > 1:
        raise OipError("inputs: tensors have different numbers of rows ("
                       + ", ".join(f"{k}: {v}" for k, v in list(rows_of.items())[:6]) + "; allowed: the same n for every input)")
    n = counts[0]
    missing = [f["name"] for f in features if f["name"] not in columns and not f.get("nullable")]
    if missing:
        shown = ", ".join(missing[:10]) + (f" and {len(missing) - 10} more" if len(missing) > 10 else "")
        raise OipError(f"inputs: missing tensor for feature(s) {shown} (allowed: leave out only nullable features: "
                       f"{', '.join(f['name'] for f in features if f.get('nullable')) or 'none in this model'})")
    outputs, binary_out = _requested_outputs(request, task)
    request_id = request.get("id")
    return DecodedRequest(id=request_id if isinstance(request_id, str) else None, columns=columns,
                          names=[f["name"] for f in features], n=n, outputs=outputs, binary=binary_out,
                          matrix=None if nulls else _numeric_matrix(columns, features, n))


def _requested_outputs(request: dict, task: str) -> tuple[list[str], dict[str, bool]]:
    available = _OUTPUTS if task == "classification" else _OUTPUTS[:1]
    parameters = request.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise OipError("parameters: must be an object")
    default_binary = parameters.get("binary_data_output") is True
    asked = request.get("outputs")
    if asked is None:
        return list(available), {name: default_binary for name in available}
    if not isinstance(asked, list):
        raise OipError(f"outputs: must be a list of {{name}} objects (allowed names: {', '.join(available)})")
    names, binary = [], {}
    for index, output in enumerate(asked):
        name = output.get("name") if isinstance(output, dict) else None
        if name not in available:
            raise OipError(f"outputs[{index}]: unknown output {name!r} (allowed: {', '.join(available)})")
        params = output.get("parameters") or {}
        if isinstance(params, dict) and "classification" in params:
            raise OipError(f"outputs[{index}].parameters.classification: not supported "
                           "(allowed: ask for 'probabilities', the full [n, classes] tensor)")
        names.append(name)
        binary[name] = bool(params.get("binary_data", default_binary)) if isinstance(params, dict) else default_binary
    return names, binary


def _encode_binary(values: list, datatype: str) -> bytes:
    if datatype == "BYTES":
        parts = []
        for v in values:
            b = str(v).encode("utf-8")
            parts.append(struct.pack("<I", len(b)) + b)
        return b"".join(parts)
    return np.asarray(values, dtype=_DTYPES[datatype]).tobytes()


def encode_response(model_name: str, version: str, request: DecodedRequest, predict: dict,
                    meta: dict) -> tuple[bytes, Optional[int]]:
    """`/predict`'s answer -> V2 response body, and the JSON header's length when binary
    outputs follow it (the `Inference-Header-Content-Length` value), else None."""
    predictions = predict["predictions"]
    n = len(predictions)
    tensors: dict[str, tuple[str, list[int], list]] = {}
    datatype = label_datatype(meta["task"], meta.get("labels"))
    if datatype == "BYTES":
        predictions = [str(v) for v in predictions]
    tensors["predictions"] = (datatype, [n], predictions)
    if "probabilities" in request.outputs:
        keys = [str(label) for label in meta.get("labels") or []]
        flat = [row[k] for row in predict.get("probabilities") or [] for k in keys]
        tensors["probabilities"] = ("FP64", [n, len(keys)], flat)
    outputs, raw = [], []
    for name in request.outputs:
        datatype, shape, values = tensors[name]
        tensor: dict[str, Any] = {"name": name, "datatype": datatype, "shape": shape}
        if request.binary.get(name):
            data = _encode_binary(values, datatype)
            tensor["parameters"] = {"binary_data_size": len(data)}
            raw.append(data)
        else:
            tensor["data"] = values
        outputs.append(tensor)
    response: dict[str, Any] = {"model_name": model_name, "model_version": str(version), "outputs": outputs}
    if request.id is not None:
        response["id"] = request.id
    header = json.dumps(response, separators=(",", ":")).encode()
    if not raw:
        return header, None
    return header + b"".join(raw), len(header)


def translate_detail(detail: Any, rows: Optional[int] = None) -> str:
    """`/predict`'s error detail (a 422 list of {loc, msg}, or a string) -> one V2 message
    naming the input tensor and row: `input 'pixel_0_0' row 3: Input should be a valid number`."""
    if isinstance(detail, str):
        return detail
    if not isinstance(detail, list):
        return json.dumps(detail)[:500]
    parts = []
    for error in detail[:5]:
        loc = [p for p in error.get("loc", []) if p != "body"]
        msg = str(error.get("msg", "invalid"))
        if len(loc) >= 3 and loc[0] == "instances" and isinstance(loc[1], int):
            parts.append(f"input '{loc[2]}' row {loc[1]}: {msg}")
        elif len(loc) == 2 and loc[0] == "instances" and isinstance(loc[1], int):
            parts.append(f"row {loc[1]}: {msg}")
        elif loc[:1] == ["instances"]:
            parts.append(f"inputs: {msg}" if len(loc) == 1 else f"inputs ({'.'.join(map(str, loc[1:]))}): {msg}")
        else:
            parts.append(f"{'.'.join(map(str, loc)) or 'request'}: {msg}")
    more = len(detail) - 5
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")

