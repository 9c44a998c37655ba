"""The Open Inference Protocol (KServe V2) at /v2, called by the real clients people already
use: tritonclient.http (binary tensors by default) and KServe's Python SDK REST client, plus
plain HTTP for the error bodies. Predictions must equal /digits/predict's for the same rows.

Layout as the version router builds it: app `digits` (the traffic split; until the router
lands, a ModelServer) and app `digits-vN` (one version, route /digits/v/N).
"""

import asyncio
import json
import secrets

import numpy as np
import pytest

from .. import loopback
from .conftest import PORT, deploy_registered, serve_digits, wait_for_200

import tritonclient.http as tritonhttp  # declared in pyproject.toml: a broken install fails, not skips
BASE = f"http://127.0.0.1:{PORT}"
SMALL = {"resources_per_replica": {"cpus": 0.1}, "replicas": {"min": 1, "max": 1}}
KEY = "oip-key-" + secrets.token_urlsafe(24)


def _wait_v2_live() -> None:
    """Until the shared /v2 application answers its liveness route (a moment after it is deployed)."""
    wait_for_200(f"{BASE}/v2/health/live", timeout_s=60, what="the shared /v2 application")


@pytest.fixture(scope="module")
def oip(digits, ws, tmp_path_factory):
    from rayline.serve.oip import ensure_oip_app

    from ray import serve

    endpoint = serve_digits(digits, ws, oip=True)
    if f"digits-v{digits.version}" not in serve.status().applications:  # `rayline run` deploys it (router layout)
        deploy_registered(f"digits-v{digits.version}", digits, ws, route=f"/digits/v/{digits.version}", **SMALL)
    keys = tmp_path_factory.mktemp("oip-keys") / "keys"
    keys.write_text(KEY + "\n")
    deploy_registered("digits-keyed", digits, ws, auth={"api_keys_file": str(keys)}, **SMALL)
    ensure_oip_app()
    assert ensure_oip_app() is False  # already there: left alone
    _wait_v2_live()
    meta = loopback.get(f"{endpoint}/metadata", timeout=30).json()
    return {"endpoint": endpoint, "features": [f["name"] for f in meta["features"]], "labels": meta["labels"],
            "version": str(digits.version)}


@pytest.fixture(scope="module")
def pixels():
    from sklearn.datasets import load_digits

    return load_digits().data[:25].astype(np.float64)  # (25, 64)


def _predict(oip, pixels):
    rows = [dict(zip(oip["features"], map(float, r))) for r in pixels]
    r = loopback.post(f"{oip['endpoint']}/predict", json={"instances": rows, "probabilities": True}, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    probs = np.array([[p[str(label)] for label in oip["labels"]] for p in body["probabilities"]])
    return body["predictions"], probs


def test_tritonclient_works_unchanged(oip, pixels):
    expected, expected_probs = _predict(oip, pixels)
    client = tritonhttp.InferenceServerClient(url=f"127.0.0.1:{PORT}", connection_timeout=60, network_timeout=60)
    try:
        assert client.is_server_live() and client.is_server_ready()
        assert client.get_server_metadata()["extensions"] == ["binary_tensor_data"]
        assert client.is_model_ready("digits")
        assert client.is_model_ready("digits", oip["version"])
        assert not client.is_model_ready("no-such-model")
        meta = client.get_model_metadata("digits")
        assert meta["name"] == "digits" and meta["platform"] == "rayline-torch"
        assert meta["versions"] == [oip["version"]]
        assert [i["name"] for i in meta["inputs"]] == oip["features"]
        assert {i["datatype"] for i in meta["inputs"]} == {"FP64"} and meta["inputs"][0]["shape"] == [-1]
        assert meta["outputs"] == [{"name": "predictions", "datatype": "INT64", "shape": [-1]},
                                   {"name": "probabilities", "datatype": "FP64", "shape": [-1, 10]}]
        assert client.get_model_metadata("digits", oip["version"])["versions"] == [oip["version"]]

        # The way a Triton user writes it: one InferInput per feature, numpy data, binary (the default).
        inputs = []
        for j, name in enumerate(oip["features"]):
            tensor = tritonhttp.InferInput(name, [len(pixels), 1], "FP64")
            tensor.set_data_from_numpy(pixels[:, j:j + 1])
            inputs.append(tensor)
        result = client.infer("digits", inputs, request_id="req-7")  # no outputs named: all, binary
        assert result.as_numpy("predictions").tolist() == expected
        np.testing.assert_allclose(result.as_numpy("probabilities"), expected_probs, rtol=1e-12)
        response = result.get_response()
        assert response["id"] == "req-7" and response["model_name"] == "digits"
        assert response["model_version"] == oip["version"]

        # FP32 tensors sent as JSON, one output asked for as JSON, the version addressed.
        inputs = []
        for j, name in enumerate(oip["features"]):
            tensor = tritonhttp.InferInput(name, [len(pixels)], "FP32")
            tensor.set_data_from_numpy(pixels[:, j].astype(np.float32), binary_data=False)
            inputs.append(tensor)
        result = client.infer("digits", inputs, model_version=oip["version"],
                              outputs=[tritonhttp.InferRequestedOutput("predictions", binary_data=False)])
        assert result.as_numpy("predictions").tolist() == expected  # digits pixels are exact in float32
        assert result.as_numpy("probabilities") is None
        assert [o["name"] for o in result.get_response()["outputs"]] == ["predictions"]

        from tritonclient.utils import InferenceServerException

        with pytest.raises(InferenceServerException) as err:
            client.infer("no-such-model", inputs)
        assert err.value.status() == "404" and "no model named 'no-such-model'" in err.value.message()
    finally:
        client.close()


def test_kserve_sdk_rest_client_works_unchanged(oip, pixels):
    # Installed by the README's test command (pip install --no-deps -r tests/requirements-kserve.txt,
    # which says why --no-deps): missing, this test fails rather than skips.
    import kserve
    expected, expected_probs = _predict(oip, pixels)

    async def calls():
        client = kserve.InferenceRESTClient(kserve.RESTConfig(protocol="v2", timeout=60))
        try:
            assert await client.is_server_live(BASE) is True
            assert await client.is_server_ready(BASE) is True
            assert await client.is_model_ready(BASE, "digits") is True
            json_inputs = [kserve.InferInput(name, [len(pixels)], "FP64", data=pixels[:, j].tolist())
                           for j, name in enumerate(oip["features"])]
            as_json = await client.infer(BASE, kserve.InferRequest("digits", json_inputs, request_id="k-1"),
                                         model_name="digits")
            binary_inputs = []
            for j, name in enumerate(oip["features"]):
                tensor = kserve.InferInput(name, [len(pixels), 1], "FP64")
                tensor.set_data_from_numpy(pixels[:, j:j + 1], binary_data=True)
                binary_inputs.append(tensor)
            as_binary = await client.infer(BASE, kserve.InferRequest("digits", binary_inputs, request_id="k-2"),
                                           model_name="digits")
            return as_json, as_binary
        finally:
            await client.close()

    as_json, as_binary = asyncio.run(calls())
    for response, request_id in ((as_json, "k-1"), (as_binary, "k-2")):
        assert response.id == request_id and response.model_name == "digits"
        outputs = {o.name: o for o in response.outputs}
        assert outputs["predictions"].as_numpy().tolist() == expected
        np.testing.assert_allclose(outputs["probabilities"].as_numpy(), expected_probs, rtol=1e-12)


def _infer(body, model="digits", headers=None):
    return loopback.post(f"{BASE}/v2/models/{model}/infer", content=json.dumps(body),
                      headers={"content-type": "application/json", **(headers or {})}, timeout=60)


def _tensors(oip, pixels, **override):
    inputs = [{"name": n, "shape": [len(pixels)], "datatype": "FP64", "data": pixels[:, j].tolist()}
              for j, n in enumerate(oip["features"])]
    for name, changes in override.items():
        for tensor in inputs:
            if tensor["name"] == name:
                tensor.update(changes)
    return {"inputs": inputs}


def test_errors_follow_the_protocol_error_body(oip, pixels):
    first, second = oip["features"][:2]
    cases = [
        (_infer({"inputs": []}, model="nope"), 404, "no model named 'nope' is served here"),
        (loopback.get(f"{BASE}/v2/models/digits/versions/999", timeout=30), 404,
         f"model 'digits' has no live version '999' (live versions: {oip['version']})"),
        (_infer(_tensors(oip, pixels, **{first: {"datatype": "BYTES", "data": ["a"] * len(pixels)}})), 400,
         f"input '{first}': datatype 'BYTES' does not fit a number feature (allowed: FP64, FP32"),
        (_infer({"inputs": _tensors(oip, pixels)["inputs"][1:]}), 400, f"inputs: missing tensor for feature(s) {first}"),
        (_infer(_tensors(oip, pixels, **{first: {"shape": [len(pixels), 2]}})), 400,
         f"input '{first}': shape [{len(pixels)}, 2] not allowed (allowed: [n] or [n, 1]"),
        (_infer(_tensors(oip, pixels, **{first: {"data": [1.0]}})), 400,
         f"input '{first}': data has 1 values, shape [{len(pixels)}] needs {len(pixels)}"),
        (_infer({"inputs": _tensors(oip, pixels)["inputs"] + [{"name": "colour", "shape": [1], "datatype": "BYTES",
                                                               "data": ["red"]}]}), 400,
         "input 'colour': not a feature of this model (allowed: "),
        # a value rule of /predict (digits features are not nullable), translated to the tensor and row
        (_infer(_tensors(oip, pixels, **{second: {"data": [None] + pixels[1:, 1].tolist()}})), 400,
         f"input '{second}' row 0: "),
        # a number the schema refuses, on the numbers-only matrix path (HandedRows): the rows path names it
        (_infer(_tensors(oip, pixels, **{second: {"data": [1e39] + pixels[1:, 1].tolist()}})), 400,
         f"input '{second}' row 0: outside the model's float32 input range"),
        (_infer({**_tensors(oip, pixels), "outputs": [{"name": "scores"}]}), 400,
         "outputs[0]: unknown output 'scores' (allowed: predictions, probabilities)"),
        (loopback.get(f"{BASE}/v2/nowhere", timeout=30), 404, "GET /v2/nowhere: Not Found"),
    ]
    for response, status, message in cases:
        assert response.status_code == status, (message, response.text)
        body = response.json()
        assert set(body) == {"error"} and message in body["error"], (message, body)
        assert "Traceback" not in body["error"]


def test_api_keys_apply_through_v2(oip, pixels):
    body = _tensors(oip, pixels[:3])
    refused = _infer(body, model="digits-keyed")
    assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
    assert refused.json() == {"error": "missing API key: send the header 'Authorization: Bearer <key>'"}
    assert loopback.get(f"{BASE}/v2/models/digits-keyed", timeout=30).status_code == 401
    wrong = _infer(body, model="digits-keyed", headers={"Authorization": "Bearer " + "x" * 32})
    assert wrong.status_code == 401 and wrong.json() == {"error": "invalid API key"}
    ok = _infer(body, model="digits-keyed", headers={"Authorization": f"Bearer {KEY}"})
    assert ok.status_code == 200, ok.text
    assert len(ok.json()["outputs"][0]["data"]) == 3
    meta = loopback.get(f"{BASE}/v2/models/digits-keyed", headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    assert meta.status_code == 200 and meta.json()["name"] == "digits-keyed"


def test_the_model_answers_v2_from_its_own_application(oip, pixels):
    """serve.oip: /v2/models/digits/... is application digits-oip's (Serve routes the longest prefix),
    whose replicas hold the model: with the shared /v2 application gone, digits still answers V2, with
    the predictions /predict gives, and its metadata; a model without one of its own does not."""
    from ray import serve

    from rayline.serve.oip import OIP_APP, ensure_oip_app

    body = _tensors(oip, pixels[:3])
    rows = {"instances": [dict(zip(oip["features"], map(float, p))) for p in pixels[:3]]}
    expected = loopback.post(f"{oip['endpoint']}/predict", json=rows, timeout=30).json()["predictions"]
    serve.delete(OIP_APP)
    try:
        answered = _infer(body)
        assert answered.status_code == 200, answered.text
        assert [str(v) for v in answered.json()["outputs"][0]["data"]] == [str(v) for v in expected]
        meta = loopback.get(f"{BASE}/v2/models/digits", timeout=30)
        assert meta.status_code == 200 and meta.json()["name"] == "digits", meta.text
        assert _infer(body, model="digits-keyed").status_code == 404  # served by the shared app only
    finally:
        ensure_oip_app()
        _wait_v2_live()


def test_a_v2_body_just_over_4_mb_is_answered_on_both_v2_paths(oip):
    """digits answers V2 from its own application (in-process); digits-keyed, with no V2 application
    of its own, through the shared one, which sends the rows to the model's replica over a deployment
    handle. Ray's gRPC between replicas (throughput-optimized mode) refuses messages over 4 MB by
    default: a legitimate request under serve.max_body_bytes (10 MB) must not fail there."""
    rng = np.random.default_rng(2)
    n = 3_800
    x = rng.random((n, len(oip["features"]))) * 16  # ~17 digits a value
    body = json.dumps({"inputs": [{"name": f, "datatype": "FP64", "shape": [n], "data": x[:, i].tolist()}
                                  for i, f in enumerate(oip["features"])], "outputs": [{"name": "predictions"}]}).encode()
    assert 4.2 * 1024 * 1024 < len(body) < 10 * 1024 * 1024, len(body)
    answers = {}
    for model, headers in (("digits", {}), ("digits-keyed", {"authorization": f"Bearer {KEY}"})):
        r = loopback.post(f"{BASE}/v2/models/{model}/infer", content=body, timeout=120,
                       headers={"content-type": "application/json", **headers})
        assert r.status_code == 200, (model, r.status_code, r.text[:300])
        answers[model] = r.json()["outputs"][0]["data"]
        assert len(answers[model]) == n
    assert answers["digits"] == answers["digits-keyed"]  # one registered version behind both
