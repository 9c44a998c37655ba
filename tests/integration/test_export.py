"""`rayline serve export`: a Serve config for a registered version, checked with Ray's own schema.

That Ray's `serve deploy` CLI serves it on a running cluster (the routed route, the version's
route and the Open Inference Protocol) is tested in test_cluster.py, on a `rayline cluster up` head:
`serve deploy` replaces every declaratively deployed app of a cluster, so not on the session's Ray.
"""

import os

import pytest
import yaml

from tests.cli import rayline

from .. import loopback
from .conftest import ROOT


def _export(ws, *args):
    env = {**os.environ, "RAYLINE_WORKSPACE": str(ws.root)}
    env.pop("RAY_ADDRESS", None)
    return rayline("serve", "export", *args, cwd=ROOT, env=env)  # in this process (tests/cli.py)


def test_export_writes_a_config_ray_accepts_for_the_version_asked(digits, ws, tmp_path):
    from ray.serve.schema import ServeDeploySchema

    out = tmp_path / "digits.yaml"
    done = _export(ws, "digits", "--version", digits.version, "--output", str(out), "--host", "0.0.0.0", "--port", "8123")
    assert done.returncode == 0, done.stdout + done.stderr
    text = out.read_text()
    assert text.startswith(f"# Ray Serve config for model digits version {digits.version}")
    config = ServeDeploySchema.model_validate(yaml.safe_load(text))
    assert (config.http_options.host, config.http_options.port) == ("0.0.0.0", 8123)
    apps = {a.name: a for a in config.applications}
    version_app, router = apps[f"digits-v{digits.version}"], apps["digits"]
    assert version_app.route_prefix == f"/digits/v/{digits.version}" and router.route_prefix == "/digits"
    assert version_app.import_path == "rayline.serve.app:build_app"
    assert version_app.args["version"] == digits.version and version_app.args["workspace"] == str(ws.root)
    # The serving settings the version was trained with (the spec's serve section), not defaults.
    spec = yaml.safe_load((ROOT / "pipelines" / "digits-torch.yaml").read_text())
    assert version_app.args["replicas"]["max"] == spec["serve"]["replicas"]["max"]
    assert router.args["champion"] == digits.version
    assert apps["rayline-v2"].route_prefix == "/v2"
    # The version's serve.oip too: the suite's digits run has it off (tests/integration/conftest.py run()), so
    # no V2 application of the model's own. With it on (the default): test_cluster.py exports one and Ray's
    # `serve deploy` serves /v2/models/NAME from it; tests/unit/test_serving_configs.py checks its fields.
    assert "digits-oip" not in apps and set(apps) == {f"digits-v{digits.version}", "digits", "rayline-v2"}
    # Each application builds from its args, as Serve's controller will build it.
    from rayline.serve.app import build_app
    from rayline.serve.oip import build_app as build_oip

    assert type(build_app(version_app.args)).__name__ == "Application"
    assert type(build_oip(None)).__name__ == "Application"
    assert [p.name for p in tmp_path.iterdir()] == ["digits.yaml"]  # written atomically: no temporary file left


def test_export_prints_and_defaults_to_the_champion(digits, ws):
    from rayline.registry import Registry

    champion = Registry(ws).alias_version("digits", "champion")
    done = _export(ws, "digits", "--no-v2")
    assert done.returncode == 0, done.stderr
    config = yaml.safe_load(done.stdout)
    names = [a["name"] for a in config["applications"]]
    expected = champion or Registry(ws).resolve("digits").version
    assert names == [f"digits-v{expected}", "digits"]


@pytest.mark.parametrize("args, message", [
    (["nope"], "model 'nope'"),
    (["digits", "--version", "999"], "version 999"),
])
def test_export_of_what_is_not_registered_is_one_line(ws, digits, args, message, tmp_path):
    out = tmp_path / "never.yaml"
    done = _export(ws, *args, "--output", str(out))
    assert done.returncode != 0
    assert message in done.stderr and "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert not out.exists()


def test_router_builder_rejects_bad_args_by_name():
    from rayline.errors import ServeError
    from rayline.serve.export import build_router_app

    with pytest.raises(ServeError, match=r"unknown keys \['colour'\]"):
        build_router_app({"name": "m", "route": "/m", "champion": "1", "colour": "red"})
    with pytest.raises(ServeError, match=r"missing \['champion'\]"):
        build_router_app({"name": "m", "route": "/m"})
    with pytest.raises(ServeError, match="champion: a registered version number"):
        build_router_app({"name": "m", "route": "/m", "champion": "latest"})


def test_deploying_a_version_also_serves_the_open_inference_protocol(digits, ws):
    """`rayline run` and `rayline serve deploy` (serve.versions.deploy) bring up /v2 with the model."""
    from ray import serve

    from rayline.serve import versions
    from rayline.serve.oip import OIP_APP

    from .conftest import PORT

    if OIP_APP in serve.status().applications:
        serve.delete(OIP_APP)
    rollout = versions.deploy("digits", digits.version, ws=ws, port=PORT)
    assert OIP_APP in rollout.created
    ready = loopback.get(f"http://127.0.0.1:{PORT}/v2/models/digits/ready", timeout=60)
    assert ready.status_code == 200, ready.text
    meta = loopback.get(f"http://127.0.0.1:{PORT}/v2/models/digits", timeout=60).json()
    assert meta["name"] == "digits" and digits.version in meta["versions"]
