"""``jaxgen serve``: flags, and running the app under uvicorn with a draining SIGTERM."""

from __future__ import annotations

import argparse
import logging
import sys

from serving.app import create_app
from serving.launch.server import DrainingServer, uvicorn_config
from serving.model_loading import build_llm, fetch_model
from serving.settings.flags import (
    FLAG_SETTINGS,
    add_serve_arguments,
    check_engine_knobs,
    settings_from_args,
)

logger = logging.getLogger("serving")


def run_serve(args: argparse.Namespace, build=build_llm) -> int:
    """Starts the server; returns the exit code (0 after a SIGTERM drain, 1 if the model failed
    to load or the engine died). ``build(settings)`` makes its ``AsyncLLM``."""
    settings = settings_from_args(args)
    check_engine_knobs(settings)  # fail before the server starts, not in the loader thread
    settings = fetch_model(settings)  # a hub id's download too
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    for key in settings.ignored:
        logger.warning("properties: %s is not used by jaxgen; ignored", key)
    server: DrainingServer | None = None

    def fatal(error: BaseException) -> None:
        if server is not None:
            server.exit_code = 1
            server.should_exit = True

    app = create_app(lambda: build(settings), settings, on_fatal=fatal)
    config = uvicorn_config(
        app, settings, host=settings.host, port=settings.port, log_level=settings.log_level
    )
    server = DrainingServer(config, app.state.server, settings.drain_timeout)
    logger.info("serving %s on http://%s:%d", settings.model_name, settings.host, settings.port)
    server.run()
    return server.exit_code


def add_ray_arguments(parser: argparse.ArgumentParser) -> None:
    """``jaxgen serve --ray``'s flags: replicas on Ray Serve (the ``ray`` extra)."""
    ray = parser.add_argument_group(
        "Ray Serve replicas (pip install 'jaxgen[ray]'; RAY_ADDRESS connects to a cluster)"
    )
    add = ray.add_argument
    add("--ray", action="store_true", help="serve replicas on Ray Serve behind Ray's HTTP proxy")
    add("--num-replicas", type=int, default=1, help="replicas (fixed unless --max-replicas)")
    add("--min-replicas", type=int, default=1, help="autoscaling lower bound")
    add("--max-replicas", type=int, default=None, help="autoscale up to this many replicas")
    add(
        "--target-ongoing-requests",
        type=float,
        default=8.0,
        help="autoscaling target of requests in flight per replica",
    )
    add("--replica-cpus", type=float, default=1.0, help="CPUs each replica reserves")
    add("--replica-tpus", type=int, default=0, help="TPU chips each replica reserves")
    add("--replica-gpus", type=float, default=0.0, help="GPUs each replica reserves")
    add(
        "--graceful-shutdown-timeout",
        type=float,
        default=None,
        help="seconds Ray waits for a stopping replica's requests (default: --drain-timeout)",
    )
    add(
        "--ray-request-router",
        choices=["prefix", "default"],
        default="prefix",
        help="prefix: an ingress forwards each request to the replica whose prefix cache holds "
        "the longest prefix of its prompt (by load when that one is overloaded); default: Ray's "
        "own router (power of two choices), the replicas as the HTTP ingress",
    )
    add("--ray-ingress-replicas", type=int, default=1, help="ingress replicas (prefix router)")
    add(
        "--ray-router-imbalanced-threshold",
        type=float,
        default=8.0,
        help="prefix router: requests in flight beyond the least loaded replica past which the "
        "replica holding the prefix is passed over",
    )
    add(
        "--ray-router-match-rate-threshold",
        type=float,
        default=0.5,
        help="prefix router: the fraction of a prompt a replica must hold to be favoured (a "
        "replica that served an earlier turn of the conversation is, whatever the fraction)",
    )
    add(
        "--ray-router-max-chars-per-replica",
        type=int,
        default=1 << 20,
        help="prefix router: characters of prompts remembered per replica (least recently used "
        "dropped first)",
    )


def run_ray(args: argparse.Namespace) -> int:
    """``jaxgen serve --ray``: the same settings, served by Ray Serve replicas."""
    settings = settings_from_args(args)
    check_engine_knobs(settings)
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # Imported here: Ray is an optional dependency that only --ray needs.
    try:
        from serving import ray_app
    except ImportError as error:
        raise ValueError(f"--ray needs Ray Serve: pip install 'jaxgen[ray]' ({error})") from None
    options = ray_app.ReplicaOptions(
        num_replicas=args.num_replicas,
        min_replicas=args.min_replicas,
        max_replicas=args.max_replicas,
        target_ongoing_requests=args.target_ongoing_requests,
        max_ongoing_requests=settings.max_concurrent_requests,
        cpus=args.replica_cpus,
        tpus=args.replica_tpus,
        gpus=args.replica_gpus,
        graceful_shutdown_timeout_s=(
            settings.drain_timeout
            if args.graceful_shutdown_timeout is None
            else args.graceful_shutdown_timeout
        ),
        request_router=args.ray_request_router,
        ingress_replicas=args.ray_ingress_replicas,
        router_imbalanced_threshold=args.ray_router_imbalanced_threshold,
        router_match_rate_threshold=args.ray_router_match_rate_threshold,
        router_max_chars_per_replica=args.ray_router_max_chars_per_replica,
    )
    flags = {name: getattr(args, name, None) for name in FLAG_SETTINGS}
    flags = {name: value for name, value in flags.items() if value is not None}
    flags.pop("host", None)  # the proxy listens; replicas do not
    flags.pop("port", None)
    return ray_app.run(flags, options, host=settings.host, port=settings.port)


def main(argv: list[str] | None = None) -> int:
    """``jaxgen serve`` (which runs ``python -m serving``)."""
    parser = argparse.ArgumentParser(prog="jaxgen serve", description=__doc__)
    add_serve_arguments(parser)
    add_ray_arguments(parser)
    args = parser.parse_args(argv)
    try:
        if args.ray:
            return run_ray(args)
        return run_serve(args)
    except (ValueError, FileNotFoundError) as error:
        print(f"jaxgen serve: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
