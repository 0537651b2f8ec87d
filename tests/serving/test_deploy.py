"""The Kubernetes manifests under ``deploy/``, checked without a cluster.

Core kinds (Deployment, Service) are validated strictly against the Kubernetes OpenAPI schemas
that ``kubernetes-validate`` ships. No PyPI package ships the LeaderWorkerSet or KubeRay
RayService CRD schemas, so for those the pod templates they embed are validated as core
``PodTemplateSpec``s and the CRD fields jaxgen relies on are checked by hand here; the
RayService's Serve config is validated by Ray's own schema (``ServeDeploySchema``, what
``serve deploy`` reads) and built with ``serving.ray_app.build_app``.
"""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from jaxgen.parallel.distributed_env import distributed_setup

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
K8S_VERSION = "1.33.0"
CORE_KINDS = {"Deployment", "Service"}


def documents(relative: str) -> list[dict]:
    with open(DEPLOY / relative) as f:
        return [doc for doc in yaml.safe_load_all(f) if doc]


def by_kind(docs: list[dict], kind: str) -> dict:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def validate_pod_template(template: dict) -> None:
    """A CRD's embedded pod template, validated strictly as a core ``PodTemplateSpec``."""
    wrapper = {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {"name": "embedded"},
        "template": template,
    }
    kubernetes_validate.validate(wrapper, K8S_VERSION, strict=True)


def container(template: dict) -> dict:
    (only,) = template["spec"]["containers"]
    return only


def flag(args: list[str], name: str) -> str:
    (value,) = [a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")]
    return value


ALL_FILES = sorted(str(p.relative_to(DEPLOY)) for p in DEPLOY.rglob("*.yaml"))


def test_every_manifest_is_checked():
    assert ALL_FILES == [
        "lws/jaxgen-v5e-16.yaml",
        "ray/rayservice.yaml",
        "ray/serve_config.yaml",
        "replicas/jaxgen-replicas.yaml",
    ]


@pytest.mark.parametrize("relative", ["lws/jaxgen-v5e-16.yaml", "replicas/jaxgen-replicas.yaml"])
def test_core_kinds_are_schema_valid(relative):
    docs = [d for d in documents(relative) if d["kind"] in CORE_KINDS]
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_schema_validation_catches_a_broken_manifest():
    deployment = by_kind(documents("replicas/jaxgen-replicas.yaml"), "Deployment")
    deployment["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)
    template = deployment["spec"]["template"]
    template["spec"]["containers"][0]["portz"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_pod_template(template)


def test_replicas_deployment_reserves_its_degree_and_drains():
    docs = documents("replicas/jaxgen-replicas.yaml")
    deployment, service = by_kind(docs, "Deployment"), by_kind(docs, "Service")
    template = deployment["spec"]["template"]
    main = container(template)
    assert main["command"] == ["python", "-m", "serving"]
    degree = int(flag(main["args"], "tensor-parallel-degree"))
    assert int(main["resources"]["limits"]["google.com/tpu"]) == degree
    assert template["spec"]["terminationGracePeriodSeconds"] > float(
        flag(main["args"], "drain-timeout")
    )
    assert main["readinessProbe"]["httpGet"]["path"] == "/health"
    assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()


def test_leader_worker_set_is_one_v5e_16_group():
    docs = documents("lws/jaxgen-v5e-16.yaml")
    lws, service = by_kind(docs, "LeaderWorkerSet"), by_kind(docs, "Service")
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    spec = lws["spec"]["leaderWorkerTemplate"]
    size = spec["size"]
    assert isinstance(size, int) and size == 4
    assert spec["restartPolicy"] in ("RecreateGroupOnPodRestart", "None")
    chips = 0
    for role in ("leaderTemplate", "workerTemplate"):
        template = spec[role]
        validate_pod_template(template)
        main = container(template)
        assert main["command"] == ["python", "-m", "serving.pod"]
        topology = template["spec"]["nodeSelector"]["cloud.google.com/gke-tpu-topology"]
        rows, columns = (int(n) for n in topology.split("x"))
        chips = int(main["resources"]["limits"]["google.com/tpu"])
        assert rows * columns == size * chips  # the group is the whole slice
        assert int(flag(main["args"], "tensor-parallel-degree")) == size * chips
        port = {e["name"]: e["value"] for e in main["env"]}["JAXGEN_COORDINATOR_PORT"]
        assert int(port) == 8476
    leader = spec["leaderTemplate"]
    assert service["spec"]["selector"] == {
        "leaderworkerset.sigs.k8s.io/name": lws["metadata"]["name"],
        "jaxgen.role": leader["metadata"]["labels"]["jaxgen.role"],
    }
    assert spec["workerTemplate"]["metadata"]["labels"]["jaxgen.role"] != "leader"
    # What each pod of the group computes from the variables LeaderWorkerSet injects.
    for index in range(size):
        environ = {
            "LWS_LEADER_ADDRESS": "jaxgen-v5e-16-0.jaxgen-v5e-16.default",
            "LWS_GROUP_SIZE": str(size),
            "LWS_WORKER_INDEX": str(index),
            "JAXGEN_COORDINATOR_PORT": port,
        }
        setup = distributed_setup(environ)
        assert setup.coordinator_address == "jaxgen-v5e-16-0.jaxgen-v5e-16.default:8476"
        assert (setup.num_processes, setup.process_id, setup.is_leader) == (4, index, index == 0)


def test_ray_service_deploys_the_serve_config():
    serve_schema = pytest.importorskip("ray.serve.schema", reason="the ray extra")
    from serving.ray_app import build_app

    config = documents("ray/serve_config.yaml")[0]
    service = by_kind(documents("ray/rayservice.yaml"), "RayService")
    assert service["apiVersion"] == "ray.io/v1"
    assert yaml.safe_load(service["spec"]["serveConfigV2"]) == config
    serve_schema.ServeDeploySchema.model_validate(config)  # what `serve deploy` reads

    cluster = service["spec"]["rayClusterConfig"]
    validate_pod_template(cluster["headGroupSpec"]["template"])
    (workers,) = cluster["workerGroupSpecs"]
    validate_pod_template(workers["template"])
    (app_config,) = config["applications"]
    args = app_config["args"]
    tpus = container(workers["template"])["resources"]["limits"]["google.com/tpu"]
    assert int(tpus) == args["tpus"] >= args["tensor_parallel_degree"]
    assert workers["maxReplicas"] >= args["max_replicas"]

    application = build_app(args)  # as each replica will: settings and options checked
    assert args["request_router"] == "prefix"
    ingress = application._bound_deployment  # the prefix router's HTTP ingress, then the replicas
    assert ingress.ray_actor_options == {"num_cpus": 0}
    engine = ingress.init_args[0]._bound_deployment
    options = engine._deployment_config
    assert options.request_router_config.request_router_class.endswith("PrefixRouter")
    assert options.autoscaling_config.max_replicas == args["max_replicas"]
    assert options.graceful_shutdown_timeout_s == args["graceful_shutdown_timeout_s"]
    actor = engine.ray_actor_options
    assert actor["resources"] == {"TPU": 4} and actor["num_cpus"] == 4
