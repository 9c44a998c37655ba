"""The spec's serve section, the Serve application builder's args, and the ingress choice (no Ray)."""

import pytest
import yaml

from rayline.errors import ClusterError, ServeError
from rayline.spec import ServeSpec


def test_batching_defaults_and_shorthand():
    assert ServeSpec().batching.model_dump() == {"enabled": True, "max_batch_size": 64, "wait_timeout_ms": 2.0}
    assert ServeSpec.model_validate({"batching": False}).batching.enabled is False
    assert ServeSpec.model_validate({"batching": {"max_batch_size": 8}}).batching.max_batch_size == 8


@pytest.mark.parametrize("serve, message", [
    ({"batching": {"max_batch_size": 0}}, "batching.max_batch_size"),
    ({"batching": {"wait_ms": 2}}, "batching.wait_ms"),
    ({"resources_per_replica": {"cpus": -1}}, "resources_per_replica.cpus"),
    ({"resources_per_replica": {"cpus": 0, "gpus": 0}}, "must reserve some CPU or GPU"),
    ({"replicas": {"upscale_delay_s": -1}}, "replicas.upscale_delay_s"),
    ({"max_queued_requests": -2}, "max_queued_requests"),
    ({"max_body_bytes": 10}, "max_body_bytes"),
    ({"request_timeout_s": 0}, "request_timeout_s"),
    ({"replicas": {"cpus": 0.5}, "resources_per_replica": {"cpus": 1}}, "contradicts resources_per_replica.cpus"),
])
def test_bad_serve_settings_name_the_key(serve, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.")) if "." in message else pytest.raises(ValueError, match=message):
        ServeSpec.model_validate(serve)


def test_deprecated_replica_cpus_moves_to_resources_per_replica():
    spec = ServeSpec.model_validate({"replicas": {"min": 1, "max": 2, "cpus": 0.5}})
    assert spec.resources_per_replica.cpus == 0.5 and spec.replicas.cpus is None
    gpu = ServeSpec.model_validate({"resources_per_replica": {"cpus": 0.25, "gpus": 0.5}})
    assert gpu.resources_per_replica.gpus == 0.5


def _deployment(args):
    from rayline.serve.app import build_app

    app = build_app({"name": "digits", "version": "1", **args})  # "latest" would be resolved in the registry
    return app._bound_deployment


def test_build_app_maps_the_spec_to_ray_serve_options():
    d = _deployment({"replicas": {"min": 1, "max": 3, "upscale_delay_s": 1, "downscale_delay_s": 5},
                     "resources_per_replica": {"cpus": 0.5, "gpus": 0.25}, "max_ongoing_requests": 8,
                     "max_queued_requests": 4, "retry_after_s": 3})
    auto = d._deployment_config.autoscaling_config
    assert (auto.min_replicas, auto.max_replicas, auto.upscale_delay_s, auto.downscale_delay_s) == (1, 3, 1, 5)
    assert d.ray_actor_options["num_cpus"] == 0.5 and d.ray_actor_options["num_gpus"] == 0.25
    from rayline.serve.deployment_options import REFUSAL_HEADROOM

    assert d.max_ongoing_requests == 8 + 4 + REFUSAL_HEADROOM and d.max_queued_requests == -1  # the app queues and refuses (limits.py)


def test_build_app_rejects_unknown_or_bad_args():
    from rayline.serve.app import build_app
    from rayline.serve.deployment_options import REFUSAL_HEADROOM

    with pytest.raises(ServeError, match=r"unknown keys \['batch_size'\]"):
        build_app({"name": "digits", "batch_size": 8})
    with pytest.raises(ServeError, match="batching.max_batch_size"):
        build_app({"name": "digits", "batching": {"max_batch_size": 0}})


def test_serving_config_uses_resources_per_replica():
    from pathlib import Path

    config = yaml.safe_load((Path(__file__).resolve().parents[2] / "serving" / "digits.yaml").read_text())
    args = config["applications"][0]["args"]
    assert "cpus" not in args.get("replicas", {}) and args["resources_per_replica"]["cpus"] > 0


def test_serve_env_haproxy_is_private_to_each_ray(monkeypatch):
    from rayline.cluster.env import serve_env

    monkeypatch.delenv("RAYLINE_SERVE_INGRESS", raising=False)
    for key in ("RAY_SERVE_HAPROXY_STATS_PORT", "RAY_SERVE_HAPROXY_METRICS_PORT", "RAY_SERVE_HAPROXY_SOCKET_PATH", "RAY_SERVE_ENABLE_HA_PROXY",
                "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"):
        monkeypatch.delenv(key, raising=False)
    a, b = serve_env(), serve_env()
    assert a["RAY_SERVE_ENABLE_HA_PROXY"] == a["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "1"
    assert a["RAY_SERVE_HAPROXY_SOCKET_PATH"] != b["RAY_SERVE_HAPROXY_SOCKET_PATH"]
    # Ray puts a 56-character node id below the directory; HAProxy allows 97 characters.
    assert len(a["RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH"]) + 57 <= 97
    assert a["RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"] == "2"  # not Ray's 30 s per serve.delete
    # HAProxy binds its stats and metrics ports when Serve starts, maybe minutes later: they lie
    # outside the range the OS hands to outgoing connections (one took such a port meanwhile)
    # and above Ray's worker ports, and are free now.
    from rayline.ports import ephemeral_range, port_holder

    first, last = ephemeral_range()
    ports = [int(env[k]) for env in (a, b) for k in ("RAY_SERVE_HAPROXY_STATS_PORT", "RAY_SERVE_HAPROXY_METRICS_PORT")]
    assert all(20000 <= p < first or p > last for p in ports), (ports, first, last)
    assert len(set(ports)) == 4 and all(port_holder("0.0.0.0", p) is None for p in ports)


def test_serve_env_proxy_and_bad_choice(monkeypatch):
    from rayline.cluster.env import serve_env

    assert serve_env("proxy") == {"RAY_SERVE_ENABLE_HA_PROXY": "0", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "0"}
    monkeypatch.setenv("RAYLINE_SERVE_INGRESS", "proxy")
    assert serve_env()["RAY_SERVE_ENABLE_HA_PROXY"] == "0"
    with pytest.raises(ClusterError, match=r"ingress: unknown Serve ingress \(got 'nginx'; allowed: haproxy, proxy"):
        serve_env("nginx")


def test_serve_config_workspace_uri_is_passed_on_and_a_path_made_absolute(tmp_path, monkeypatch):
    from rayline.serve.deployment_options import workspace_arg

    monkeypatch.chdir(tmp_path)
    assert workspace_arg("s3://bucket/prefix") == "s3://bucket/prefix"  # abspath made it <cwd>/s3:/bucket/prefix
    assert workspace_arg("gs://bucket") == "gs://bucket"
    assert workspace_arg(".rayline") == str(tmp_path / ".rayline")
    assert workspace_arg(None) is None
