"""jaxgen replicas on Ray Serve: each replica is jaxgen's own server around its own engine.

Every replica (a Ray actor) loads the model into an ``AsyncLLM`` and runs the same Starlette app
as ``jaxgen serve`` (TGI and OpenAI routes, ``/health``, ``/metrics``). How requests reach it is
``ReplicaOptions.request_router``:

- ``prefix`` (the default): an ingress deployment (``serving.ray_routing``) takes HTTP, reads
  each body and forwards the request through a ``DeploymentHandle`` to a ``RoutedReplica``'s
  ``forward``; the engine deployment's request router (``PrefixRouter``) sends it to the replica
  that holds the longest prefix of its prompt, or by load when that one is overloaded.
- ``default``: the replicas (``JaxgenReplica``) are the HTTP ingress (``serve.ingress``) and
  Ray's proxy places requests with Ray's default router (power of two choices on ongoing
  requests).

Either way each response carries the replica's id in ``x-jaxgen-replica``, and every metric
sample a ``replica`` label. Ray's health check calls ``check_health``, which fails once the
engine has died, so Ray replaces the replica. On shutdown Ray stops routing to the replica,
waits up to ``graceful_shutdown_timeout_s`` for its requests, then runs the app's lifespan
shutdown (which drains what is left, up to the server's ``drain_timeout``) and stops the engine.

Entry points: ``jaxgen serve --ray --num-replicas N ...`` (:func:`run`), ``serve run
serving.ray_app:build_app model=...`` and ``serve deploy deploy/ray/serve_config.yaml``
(:func:`build_app` takes the YAML's ``args``). Ray is imported only here and in
``serving.ray_routing``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from typing import Any

from ray import serve
from ray.serve.config import RequestRouterConfig

from serving.app import create_app
from serving.model_loading import build_llm
from serving.ray_routing.ingress_deployment import INGRESS_NAME, JaxgenIngress
from serving.ray_routing.prefix_router import PrefixRouter
from serving.ray_routing.replica_bridge import ForwardedRequest, serve_forwarded
from serving.settings.flags import FLAG_SETTINGS, check_engine_knobs
from serving.settings.resolve import resolve_settings

logger = logging.getLogger("serving")

REPLICA_HEADER = "x-jaxgen-replica"
DEPLOYMENT_NAME = "jaxgen"
REQUEST_ROUTERS = ("prefix", "default")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReplicaOptions:
    """How many replicas and what each one holds (Ray's side of a deployment).

    ``num_replicas`` is fixed unless ``max_replicas`` is set: then Ray autoscales between
    ``min_replicas`` and ``max_replicas`` to keep ``target_ongoing_requests`` per replica.
    ``tpus`` / ``gpus`` are the accelerators each replica reserves; the engine's
    ``tensor_parallel_degree`` must fit in them. ``request_router`` is ``prefix`` (an ingress
    of ``ingress_replicas`` replicas in front, and ``PrefixRouter`` with the three ``router_*``
    settings, which are ``PrefixPolicy``'s) or ``default`` (Ray's own router, no ingress).
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
    request_router: str = "prefix"
    ingress_replicas: int = 1
    router_imbalanced_threshold: float = 8.0
    router_match_rate_threshold: float = 0.5
    router_max_chars_per_replica: int = 1 << 20

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
        check(
            self.request_router in REQUEST_ROUTERS,
            "request_router",
            f"must be one of {', '.join(REQUEST_ROUTERS)}, got {self.request_router!r}",
        )
        check(self.ingress_replicas >= 1, "ingress_replicas", "must be >= 1")
        check(self.router_imbalanced_threshold >= 0, "router_imbalanced_threshold", "must be >= 0")
        check(
            0 <= self.router_match_rate_threshold <= 1,
            "router_match_rate_threshold",
            "must be between 0 and 1",
        )
        check(
            self.router_max_chars_per_replica >= 1, "router_max_chars_per_replica", "must be >= 1"
        )

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
        if self.request_router == "prefix":
            options["request_router_config"] = RequestRouterConfig(
                request_router_class=PrefixRouter,
                request_router_kwargs={
                    "imbalanced_threshold": self.router_imbalanced_threshold,
                    "match_rate_threshold": self.router_match_rate_threshold,
                    "max_chars_per_replica": self.router_max_chars_per_replica,
                },
            )
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

    def ingress_options(self) -> dict[str, Any]:
        """``Deployment.options`` of the ingress (``prefix``): no accelerators, no CPU reserved
        (it only forwards), room for every engine replica's requests."""
        most_replicas = self.max_replicas or self.num_replicas
        return {
            "num_replicas": self.ingress_replicas,
            "ray_actor_options": {"num_cpus": 0},
            "max_ongoing_requests": self.max_ongoing_requests * most_replicas,
            "graceful_shutdown_timeout_s": self.graceful_shutdown_timeout_s,
            "health_check_period_s": self.health_check_period_s,
        }


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


class EngineReplica:
    """One Ray Serve replica: an ``AsyncLLM`` and jaxgen's app around it (the app's lifespan is
    run by Ray for ``JaxgenReplica``, by the replica itself for ``RoutedReplica``)."""

    async def __init__(self, flags: dict[str, Any]):
        self.replica_id = serve.get_replica_context().replica_tag
        self.settings = resolve_settings(flags, os.environ)
        check_engine_knobs(self.settings)
        self.llm = await asyncio.to_thread(build_llm, self.settings)  # the event loop stays free
        self.server_app = create_app(
            self.llm, self.settings, metric_labels={"replica": self.replica_id}
        )
        self.asgi_app = ReplicaHeader(self.server_app, self.replica_id)
        logger.info("replica %s ready (%s)", self.replica_id, self.settings.model_name)

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


@serve.ingress()
class JaxgenReplica(EngineReplica):
    """A replica that is the application's HTTP ingress (``default``): Ray's proxy calls it
    with each request's ASGI scope and runs the app's lifespan."""

    def __serve_build_asgi_app__(self):
        return self.asgi_app


class RoutedReplica(EngineReplica):
    """A replica behind the ingress (``prefix``): serves the requests it forwards (Ray allows
    one ``serve.ingress`` deployment per application, so this one runs the app's lifespan)."""

    async def __init__(self, flags: dict[str, Any]):
        await super().__init__(flags)
        self.lifespan = contextlib.AsyncExitStack()
        app = self.server_app
        await self.lifespan.enter_async_context(app.router.lifespan_context(app))

    async def forward(self, request: ForwardedRequest):
        """A request the ingress forwarded: the app's ASGI messages, in batches (streamed)."""
        async for batch in serve_forwarded(self.asgi_app, request):
            yield batch

    async def __del__(self):
        """The app's lifespan shutdown (the drain), then the engine stops."""
        lifespan = getattr(self, "lifespan", None)
        if lifespan is not None:
            await lifespan.aclose()
        super().__del__()


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
    replica = JaxgenReplica if options.request_router == "default" else RoutedReplica
    deployment = serve.deployment(replica, name=DEPLOYMENT_NAME)
    engine = deployment.options(**options.deployment_options()).bind(flags)
    if options.request_router == "default":
        return engine
    ingress = serve.deployment(JaxgenIngress, name=INGRESS_NAME)
    return ingress.options(**options.ingress_options()).bind(
        engine, settings.max_body_bytes, settings.body_read_timeout
    )


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
        if types[key] == "str":
            parsed[key] = str(value)
            continue
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
