"""``serving/ray_app.py`` without a Ray cluster: replica options, the Serve config's ``args``, and
``jaxgen serve --ray``'s flags (the end-to-end runs are in ``tests/serving/test_ray_serve.py``,
slow)."""

from __future__ import annotations

import pytest

pytest.importorskip("ray", reason="Ray Serve is the optional 'ray' extra")

from serving import ray_app  # noqa: E402 - after the skip
from serving.ray_app import ReplicaOptions, build_app, build_deployment  # noqa: E402
from serving.ray_routing.ingress_deployment import INGRESS_NAME  # noqa: E402


def deployment_of(application):
    """The engine replicas' bound deployment (behind the ingress, for the prefix router)."""
    root = application._bound_deployment
    if root.name == INGRESS_NAME:
        return root.init_args[0]._bound_deployment
    return root


def test_fixed_replicas_and_actor_resources():
    options = ReplicaOptions(num_replicas=3, cpus=2, tpus=4, graceful_shutdown_timeout_s=45)
    kwargs = options.deployment_options()
    assert kwargs["num_replicas"] == 3 and "autoscaling_config" not in kwargs
    assert kwargs["ray_actor_options"] == {"num_cpus": 2, "resources": {"TPU": 4}}
    assert kwargs["graceful_shutdown_timeout_s"] == 45
    assert ReplicaOptions(gpus=1).actor_options() == {"num_cpus": 1.0, "num_gpus": 1}


def test_autoscaling_on_ongoing_requests():
    options = ReplicaOptions(
        num_replicas=2, min_replicas=1, max_replicas=4, target_ongoing_requests=16
    )
    autoscaling = options.deployment_options()["autoscaling_config"]
    assert autoscaling == {
        "min_replicas": 1,
        "initial_replicas": 2,
        "max_replicas": 4,
        "target_ongoing_requests": 16,
    }
    config = deployment_of(build_deployment({"model": "m"}, options))._deployment_config
    assert config.autoscaling_config.max_replicas == 4


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(num_replicas=0), "num_replicas"),
        (dict(max_replicas=0), "max_replicas"),
        (dict(target_ongoing_requests=0), "target_ongoing_requests"),
        (dict(max_ongoing_requests=0), "max_ongoing_requests"),
        (dict(cpus=-1), "cpus"),
        (dict(graceful_shutdown_timeout_s=-1), "graceful_shutdown_timeout_s"),
    ],
)
def test_bad_options_name_the_field(kwargs, name):
    with pytest.raises(ValueError, match=name):
        ReplicaOptions(**kwargs)


def test_serve_config_args_split_into_options_and_server_settings():
    application = build_app(
        {"model": "m", "max-model-len": "256", "num_replicas": "2", "cpus": "0.5", "tpus": 2,
         "tensor_parallel_degree": 2}
    )  # fmt: skip
    deployment = deployment_of(application)
    assert deployment._deployment_config.num_replicas == 2
    assert deployment.ray_actor_options == {"num_cpus": 0.5, "resources": {"TPU": 2}}
    (flags,) = deployment.init_args
    assert flags == {"model": "m", "max_model_len": "256", "tensor_parallel_degree": 2}
    with pytest.raises(ValueError, match="unknown jaxgen serve setting.*num_replica"):
        build_app({"model": "m", "num_replica": 2})
    with pytest.raises(ValueError, match="cpus must be a number"):
        build_app({"model": "m", "cpus": "many"})
    with pytest.raises(ValueError, match="tensor_parallel_degree=8 needs 8 accelerators"):
        build_app({"model": "m", "tensor_parallel_degree": 8, "tpus": 4})
    with pytest.raises(ValueError, match="max_model_len"):
        build_app({"model": "m", "max_model_len": "-3"})


def test_the_prefix_router_puts_an_ingress_in_front_of_the_engine_replicas():
    options = ReplicaOptions(num_replicas=3, max_ongoing_requests=16, ingress_replicas=2)
    application = build_deployment({"model": "m", "max_body_bytes": 4096}, options)
    ingress = application._bound_deployment
    assert ingress.name == INGRESS_NAME
    assert ingress.ray_actor_options == {"num_cpus": 0}
    assert ingress._deployment_config.num_replicas == 2
    assert ingress._deployment_config.max_ongoing_requests == 16 * 3  # every replica's share
    _, max_body_bytes, body_read_timeout = ingress.init_args
    assert (max_body_bytes, body_read_timeout) == (4096, 30.0)
    router = deployment_of(application)._deployment_config.request_router_config
    assert router.request_router_class == "serving.ray_routing.prefix_router.PrefixRouter"
    assert router.request_router_kwargs == {
        "imbalanced_threshold": 8.0,
        "match_rate_threshold": 0.5,
        "max_chars_per_replica": 1 << 20,
    }


def test_the_default_router_serves_http_from_the_replicas_themselves():
    application = build_deployment({"model": "m"}, ReplicaOptions(request_router="default"))
    engine = application._bound_deployment
    assert engine.name == ray_app.DEPLOYMENT_NAME
    assert engine._deployment_config.request_router_config.is_default_request_router()
    from_args = build_app({"model": "m", "request_router": "default", "ingress_replicas": "1"})
    assert from_args._bound_deployment.name == ray_app.DEPLOYMENT_NAME
    tuned = build_app({"model": "m", "router_imbalanced_threshold": "2"})
    kwargs = deployment_of(tuned)._deployment_config.request_router_config.request_router_kwargs
    assert kwargs["imbalanced_threshold"] == 2.0


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(request_router="round_robin"), "request_router"),
        (dict(ingress_replicas=0), "ingress_replicas"),
        (dict(router_imbalanced_threshold=-1), "router_imbalanced_threshold"),
        (dict(router_match_rate_threshold=2), "router_match_rate_threshold"),
        (dict(router_max_chars_per_replica=0), "router_max_chars_per_replica"),
    ],
)
def test_bad_router_options_name_the_field(kwargs, name):
    with pytest.raises(ValueError, match=name):
        ReplicaOptions(**kwargs)


def test_jaxgen_serve_ray_flags_reach_the_replicas(monkeypatch):
    from serving.launch.cli import main

    calls = []
    monkeypatch.setattr(
        ray_app, "run", lambda flags, options, **kw: calls.append((flags, options, kw)) or 0
    )
    argv = ["--ray", "--num-replicas", "2", "--replica-cpus", "0.5", "--model", "m",
            "--max-model-len", "128", "--port", "9000", "--drain-timeout", "12"]  # fmt: skip
    assert main(argv) == 0
    ((flags, options, kw),) = calls
    assert flags == {"model": "m", "max_model_len": 128, "drain_timeout": 12.0}
    assert options.num_replicas == 2 and options.cpus == 0.5
    assert options.graceful_shutdown_timeout_s == 12.0  # the drain timeout, by default
    assert options.request_router == "prefix"  # by default
    assert kw == {"host": "127.0.0.1", "port": 9000}
    argv += ["--ray-request-router", "default", "--ray-router-imbalanced-threshold", "3",
             "--ray-router-match-rate-threshold", "0.5", "--ray-router-max-chars-per-replica",
             "5000", "--ray-ingress-replicas", "2"]  # fmt: skip
    assert main(argv) == 0
    options = calls[-1][1]
    assert (options.request_router, options.ingress_replicas) == ("default", 2)
    assert options.router_imbalanced_threshold == 3 and options.router_match_rate_threshold == 0.5
    assert options.router_max_chars_per_replica == 5000


def test_health_check_fails_once_the_engine_is_dead():
    import asyncio
    from types import SimpleNamespace

    def replica(error):
        server = SimpleNamespace(engine_error=error)
        return SimpleNamespace(server_app=SimpleNamespace(state=SimpleNamespace(server=server)))

    asyncio.run(ray_app.JaxgenReplica.check_health(replica(None)))
    with pytest.raises(RuntimeError, match="jaxgen engine failed: step raised"):
        asyncio.run(ray_app.JaxgenReplica.check_health(replica(RuntimeError("step raised"))))
