"""jaxgen replicas on Ray Serve: each replica is jaxgen's own server around its own engine.

Every replica (a Ray actor) loads the model into an ``AsyncLLM`` and serves the same Starlette
app as ``jaxgen serve`` (TGI and OpenAI routes, ``/health``, ``/metrics``) through
``serve.ingress``; Ray's HTTP proxy routes requests to replicas (power of two choices on
ongoing requests) and streams responses through. Each response carries the replica's id in
``x-jaxgen-replica``, and every metric sample a ``replica`` label. Ray's health check calls
``check_health``, which fails once the engine has died, so Ray replaces the replica. On
shutdown Ray stops routing to the replica, waits up to ``graceful_shutdown_timeout_s`` for its
requests, then runs the app's lifespan shutdown (which drains what is left, up to the server's
``drain_timeout``) and stops the engine.

Entry points: ``jaxgen serve --ray --num-replicas N ...`` (:func:`run`), ``serve run
serving.ray_app:build_app model=...`` and ``serve deploy deploy/ray/serve_config.yaml``
(:func:`build_app` takes the YAML's ``args``). This is the only module that imports Ray.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from typing import Any

from ray import serve

from serving.app import create_app
from serving.model_loading import build_llm
from serving.settings.flags import FLAG_SETTINGS, check_engine_knobs
from serving.settings.resolve import resolve_settings

logger = logging.getLogger("serving")

REPLICA_HEADER = "x-jaxgen-replica"
DEPLOYMENT_NAME = "jaxgen"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReplicaOptions:
    """How many replicas and what each one holds (Ray's side of a deployment).

    ``num_replicas`` is fixed unless ``max_replicas`` is set: then Ray autoscales between
    ``min_replicas`` and ``max_replicas`` to keep ``target_ongoing_requests`` per replica.
    ``tpus`` / ``gpus`` are the accelerators each replica reserves; the engine's
    ``tensor_parallel_degree`` must fit in them.
    """

    num_replicas: int = 1
    min_replicas: int = 1
    max_replicas: int | None = None
    target_ongoing_requests: float = 8.0
    max_ongoing_requests: int = 64
    cpus: float = 1.0
    tpus: int = 0
    gpus: float = 0.0
    graceful_shutdown_timeout_s: float = 30.0
    health_check_period_s: float = 10.0

    def __post_init__(self):
        def check(ok: bool, name: str, message: str) -> None:
            if not ok:
                raise ValueError(f"{name} {message}")

        check(self.num_replicas >= 1, "num_replicas", "must be >= 1")
        check(self.min_replicas >= 0, "min_replicas", "must be >= 0")
        if self.max_replicas is not None:
            check(self.max_replicas >= max(self.min_replicas, 1), "max_replicas", "must be >= min")
        check(self.target_ongoing_requests > 0, "target_ongoing_requests", "must be > 0")
        check(self.max_ongoing_requests >= 1, "max_ongoing_requests", "must be >= 1")
        check(self.cpus >= 0 and self.tpus >= 0 and self.gpus >= 0, "cpus/tpus/gpus", ">= 0")
        check(self.graceful_shutdown_timeout_s >= 0, "graceful_shutdown_timeout_s", "must be >= 0")

    def actor_options(self) -> dict[str, Any]:
        """``ray_actor_options``: CPUs, and the accelerators one replica's engine spans."""
        options: dict[str, Any] = {"num_cpus": self.cpus}
        if self.gpus:
            options["num_gpus"] = self.gpus
        if self.tpus:
            options["resources"] = {"TPU": self.tpus}
        return options

    def deployment_options(self) -> dict[str, Any]:
        """Keyword arguments of ``Deployment.options``."""
        options: dict[str, Any] = {
            "ray_actor_options": self.actor_options(),
            "max_ongoing_requests": self.max_ongoing_requests,
            "graceful_shutdown_timeout_s": self.graceful_shutdown_timeout_s,
            "health_check_period_s": self.health_check_period_s,
        }
        if self.max_replicas is None:
            options["num_replicas"] = self.num_replicas
        else:
            options["autoscaling_config"] = {
                "min_replicas": self.min_replicas,
                "initial_replicas": min(
                    max(self.num_replicas, self.min_replicas), self.max_replicas
                ),
                "max_replicas": self.max_replicas,
                "target_ongoing_requests": self.target_ongoing_requests,
            }
        return options


class ReplicaHeader:
    """ASGI middleware: adds ``x-jaxgen-replica: <replica id>`` to every HTTP response."""

    def __init__(self, app, replica_id: str):
        self.app = app
        self.header = (REPLICA_HEADER.encode(), replica_id.encode())

    def add_exception_handler(self, *args) -> None:  # Ray maps its overload errors to 503
        self.app.add_exception_handler(*args)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_header(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        await self.app(scope, receive, send_with_header)


def server_flags(args: dict[str, Any] | None) -> dict[str, Any]:
    """``jaxgen serve`` settings from a dict (the YAML's ``args``; ``max-model-len`` or
    ``max_model_len``); ``ValueError`` naming an unknown key."""
    flags = {str(key).replace("-", "_"): value for key, value in (args or {}).items()}
    unknown = sorted(set(flags) - set(FLAG_SETTINGS))
    if unknown:
        raise ValueError(f"unknown jaxgen serve setting(s) in args: {', '.join(unknown)}")
    return flags


@serve.ingress()
class JaxgenReplica:
    """One Ray Serve replica: an ``AsyncLLM`` and jaxgen's app around it."""

    async def __init__(self, flags: dict[str, Any]):
        self.replica_id = serve.get_replica_context().replica_tag
        self.settings = resolve_settings(flags, os.environ)
        check_engine_knobs(self.settings)
        self.llm = await asyncio.to_thread(build_llm, self.settings)  # the event loop stays free
        self.server_app = create_app(
            self.llm, self.settings, metric_labels={"replica": self.replica_id}
        )
        logger.info("replica %s ready (%s)", self.replica_id, self.settings.model_name)

    def __serve_build_asgi_app__(self):
        return ReplicaHeader(self.server_app, self.replica_id)

    async def check_health(self) -> None:
        """Ray's health check: raises once the engine cannot serve (Ray then replaces us)."""
        error = self.server_app.state.server.engine_error
        if error is not None:
            raise RuntimeError(f"jaxgen engine failed: {error}")

    def __del__(self):
        """Runs after the app's lifespan shutdown drained the requests: stops the engine."""
        llm = getattr(self, "llm", None)
        if llm is not None:
            llm.shutdown()


def build_deployment(flags: dict[str, Any], options: ReplicaOptions | None = None):
    """The bound Ray Serve application for ``jaxgen serve`` settings and replica options."""
    options = options or ReplicaOptions()
    settings = resolve_settings(flags, os.environ)  # fail here, not in every replica
    check_engine_knobs(settings)
    degree = settings.tensor_parallel_degree or 1
    accelerators = options.tpus or options.gpus
    if accelerators and degree > accelerators:
        raise ValueError(
            f"tensor_parallel_degree={degree} needs {degree} accelerators per replica; "
            f"the replica options reserve {accelerators}"
        )
    deployment = serve.deployment(JaxgenReplica, name=DEPLOYMENT_NAME)
    return deployment.options(**options.deployment_options()).bind(flags)


REPLICA_OPTION_KEYS = {field.name for field in dataclasses.fields(ReplicaOptions)}


def build_app(args: dict[str, Any]):
    """Application builder for ``serve run serving.ray_app:build_app key=value ...`` and the
    ``args`` of a Serve config file: replica options (``num_replicas``, ``cpus``, ``tpus``, ...)
    and ``jaxgen serve`` settings (``model``, ``max_model_len``, ...) in one dict. Deployment
    options given in the config file's ``deployments`` section override these."""
    args = {str(key).replace("-", "_"): value for key, value in (args or {}).items()}
    replica = {key: args.pop(key) for key in list(args) if key in REPLICA_OPTION_KEYS}
    types = {field.name: field.type for field in dataclasses.fields(ReplicaOptions)}
    parsed = {}
    for key, value in replica.items():  # ``serve run`` passes strings
        kind = int if types[key] in ("int", "int | None") else float
        try:
            parsed[key] = None if value is None else kind(value)
        except (TypeError, ValueError):
            raise ValueError(f"{key} must be a number, got {value!r}") from None
    return build_deployment(server_flags(args), ReplicaOptions(**parsed))


def run(flags: dict[str, Any], options: ReplicaOptions, *, host: str, port: int) -> int:
    """``jaxgen serve --ray``: connects to ``RAY_ADDRESS`` (or starts a local Ray instance),
    deploys the replicas behind Ray's HTTP proxy on ``host:port`` and blocks until interrupted
    (Ctrl-C or SIGTERM); then deletes the application (draining each replica) and disconnects."""
    import signal

    import ray

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    application = build_deployment(flags, options)
    signal.signal(signal.SIGTERM, interrupt)
    address = os.environ.get("RAY_ADDRESS")
    ray.init(address=address or None)  # None: a local instance on this machine
    logger.info("Ray at %s", address or "a new local instance")
    serve.start(http_options={"host": host, "port": port})
    try:
        serve.run(application, name="jaxgen", route_prefix="/", blocking=True)
    except KeyboardInterrupt:
        pass
    finally:
        serve.delete("jaxgen")
        ray.shutdown()
    return 0
