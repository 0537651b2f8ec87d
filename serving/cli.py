"""``jaxgen serve``: flags, and running the app under uvicorn with a draining SIGTERM."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from jaxgen.backends import BACKENDS

logger = logging.getLogger("serving")

# flag dest -> setting name (all flags default to None so unset ones fall through to env/file).
FLAG_SETTINGS = {
    "model": "model",
    "served_model_name": "served_model_name",
    "host": "host",
    "port": "port",
    "dtype": "dtype",
    "batching": "batching",
    "max_rolling_batch_size": "max_rolling_batch_size",
    "max_rolling_batch_prefill_tokens": "max_rolling_batch_prefill_tokens",
    "batch_size": "batch_size",
    "max_batch_delay": "max_batch_delay",
    "page_size": "page_size",
    "max_model_len": "max_model_len",
    "kv_cache_memory": "kv_cache_memory",
    "attention_backend": "attention_backend",
    "quantization": "quantization",
    "kv_cache_dtype": "kv_cache_dtype",
    "enable_prefix_caching": "enable_prefix_caching",
    "precompile": "precompile",
    "seed": "seed",
    "tensor_parallel_degree": "tensor_parallel_degree",
    "max_concurrent_requests": "max_concurrent_requests",
    "max_input_tokens": "max_input_tokens",
    "max_total_tokens": "max_total_tokens",
    "max_batch_total_tokens": "kv_cache_tokens",
    "max_stop_sequences": "max_stop_sequences",
    "max_body_bytes": "max_body_bytes",
    "drain_timeout": "drain_timeout",
    "body_read_timeout": "body_read_timeout",
    "header_read_timeout": "header_read_timeout",
    "keep_alive_timeout": "keep_alive_timeout",
    "max_connections": "max_connections",
    "log_level": "log_level",
}


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds ``jaxgen serve``'s flags (precedence: flags > environment > --properties file)."""
    add = parser.add_argument
    add("--model", help="alias, HF directory, .gguf file or converted dir (env MODEL_ID)")
    add(
        "--served-model-name",
        nargs="+",
        help="model name shown to clients (default: --model), then aliases; once given, "
        "OpenAI requests naming another model get 404",
    )
    add("--host", help="address to listen on (default 127.0.0.1)")
    add("--port", type=int, help="port (default 8080; env PORT)")
    add("--dtype", help="float32/fp32, bfloat16/bf16, float16/fp16 or auto (env DTYPE)")
    add("--batching", choices=["none", "static", "dynamic", "continuous", "paged"])
    add("--max-rolling-batch-size", type=int, help="most running sequences (env MAX_BATCH_SIZE)")
    add(
        "--max-rolling-batch-prefill-tokens",
        type=int,
        help="token budget per step (env MAX_BATCH_PREFILL_TOKENS)",
    )
    add("--batch-size", type=int, help="batch size for static/dynamic batching")
    add("--max-batch-delay", type=float, help="seconds dynamic batching waits to fill a batch")
    add("--page-size", type=int, help="tokens per KV page")
    add("--max-model-len", type=int, help="longest sequence (prompt + output)")
    add("--kv-cache-memory", help="KV pool: bytes (e.g. 64MiB, 2GiB) or a fraction of free memory")
    add(
        "--max-batch-total-tokens",
        type=int,
        help="KV pool in tokens instead of bytes (env MAX_BATCH_TOTAL_TOKENS)",
    )
    add("--attention-backend", choices=BACKENDS)
    add(
        "--quantization",
        help="weights: auto (a GGUF stays quantised), none, int8, int4 or fp8; TGI's eetq / "
        "bitsandbytes mean int8 (env QUANTIZE, option.quantize)",
    )
    add("--kv-cache-dtype", help="KV pool values: auto, int8 or fp8 (e4m3)")
    add(
        "--no-prefix-caching",
        dest="enable_prefix_caching",
        action="store_const",
        const=False,
        help="do not reuse cached prompt pages between requests",
    )
    add(
        "--no-precompile",
        dest="precompile",
        action="store_const",
        const=False,
        help="do not compile every step shape at start (first requests then wait on compiles)",
    )
    add("--seed", type=int, help="engine base seed for requests without one")
    add("--tensor-parallel-degree", type=int, help="devices per model (env NUM_SHARD)")
    add(
        "--max-concurrent-requests",
        type=int,
        help="requests in flight before 429 (default 128; env MAX_CONCURRENT_REQUESTS)",
    )
    add("--max-input-tokens", type=int, help="longest prompt (env MAX_INPUT_TOKENS)")
    add("--max-total-tokens", type=int, help="prompt + new tokens limit (env MAX_TOTAL_TOKENS)")
    add("--max-stop-sequences", type=int, help="most stop sequences per request (default 4)")
    add("--max-body-bytes", type=int, help="largest request body (default 4 MiB)")
    add("--drain-timeout", type=float, help="seconds SIGTERM waits for requests (default 30)")
    add("--body-read-timeout", type=float, help="seconds to read a request body (default 30)")
    add(
        "--header-read-timeout",
        type=float,
        help="seconds to read a request's headers from connecting or the previous response "
        "(default 10)",
    )
    add("--keep-alive-timeout", type=float, help="seconds an idle connection stays (default 5)")
    add("--max-connections", type=int, help="open connections before 503 (default 1024)")
    add("--properties", help="an LMI serving.properties file")
    add("--log-level", choices=["critical", "error", "warning", "info", "debug"])


def settings_from_args(args: argparse.Namespace, environ=None):
    from serving.settings import resolve_settings

    flags = {name: getattr(args, dest, None) for dest, name in FLAG_SETTINGS.items()}
    return resolve_settings(
        flags, os.environ if environ is None else environ, getattr(args, "properties", None)
    )


def check_engine_knobs(settings) -> None:
    """Raises ``ValueError`` for engine knobs ``EngineConfig`` refuses."""
    from jaxgen.engine.engine_config import EngineConfig
    from serving.settings import engine_knobs

    EngineConfig(**engine_knobs(settings, set(EngineConfig.__dataclass_fields__)))


def run_serve(args: argparse.Namespace) -> int:
    """Starts the server; returns the exit code (0 after a SIGTERM drain, 1 if the model failed
    to load or the engine died)."""
    from serving.app import create_app
    from serving.loader import build_llm
    from serving.server import DrainingServer, uvicorn_config

    settings = settings_from_args(args)
    check_engine_knobs(settings)  # fail before the server starts, not in the loader thread
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

    app = create_app(lambda: build_llm(settings), settings, on_fatal=fatal)
    config = uvicorn_config(
        app, settings, host=settings.host, port=settings.port, log_level=settings.log_level
    )
    server = DrainingServer(config, app.state.server, settings.drain_timeout)
    logger.info("serving %s on http://%s:%d", settings.model_name, settings.host, settings.port)
    server.run()
    return server.exit_code


def main(argv: list[str] | None = None) -> int:
    """``python -m serving`` / ``python -m serving.cli``."""
    parser = argparse.ArgumentParser(prog="python -m serving", description=__doc__)
    add_serve_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_serve(args)
    except (ValueError, FileNotFoundError) as error:
        print(f"jaxgen serve: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
