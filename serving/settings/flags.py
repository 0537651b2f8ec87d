"""``jaxgen serve``'s flags and the settings they give (shared by the plain server and the
Ray Serve replicas)."""

from __future__ import annotations

import argparse
import os

from jaxgen.config.engine_config import EngineConfig
from jaxgen.config.knobs import add_engine_flags
from jaxgen.structured_outputs.limits import StructuredOutputLimits
from serving.settings.resolve import engine_knobs, resolve_settings


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds ``jaxgen serve``'s flags (precedence: flags > environment > --properties file).
    Every flag defaults to None, so one not given falls through to the environment and file."""
    add_engine_flags(parser, serve=True)
    add = parser.add_argument
    add(
        "--served-model-name",
        nargs="+",
        help="model name shown to clients (default: --model), then aliases; once given, "
        "OpenAI requests naming another model get 404",
    )
    add(
        "--lora-modules",
        nargs="+",
        help="LoRA adapters offered as models, name=path each (needs --enable-lora)",
    )
    add("--host", help="address to listen on (default 127.0.0.1)")
    add("--port", type=int, help="port (default 8080; env PORT)")
    add(
        "--max-batch-total-tokens",
        dest="kv_cache_tokens",
        type=int,
        help="KV pool in tokens instead of bytes (env MAX_BATCH_TOTAL_TOKENS)",
    )
    add(
        "--max-concurrent-requests",
        type=int,
        help="requests in flight (default 128; env MAX_CONCURRENT_REQUESTS); more wait",
    )
    add(
        "--max-waiting-requests",
        type=int,
        help="requests waiting for a slot, first come first served, before 429 (default 1024; "
        "0: refuse at once past --max-concurrent-requests)",
    )
    add("--max-input-tokens", type=int, help="longest prompt (env MAX_INPUT_TOKENS)")
    add("--max-total-tokens", type=int, help="prompt + new tokens limit (env MAX_TOTAL_TOKENS)")
    add(
        "--max-stop-sequences",
        type=int,
        help="most stop sequences per request (default 4; env MAX_STOP_SEQUENCES)",
    )
    add(
        "--max-best-of",
        type=int,
        help="largest TGI `best_of`: sequences sampled per /generate request (default 2; "
        "env MAX_BEST_OF)",
    )
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
    add(
        "--max-header-bytes",
        type=int,
        help="largest request line + headers; larger gets 431 (default 16384)",
    )
    add(
        "--max-logit-bias",
        type=int,
        help="most logit_bias entries per request (default: the whole vocabulary)",
    )
    add(
        "--responses-store-size",
        type=int,
        help="Responses kept for GET and previous_response_id (store: true); 0 stores none "
        "(default 1000)",
    )
    add(
        "--responses-store-ttl",
        type=float,
        help="seconds a finished stored Response is kept; 0 until newer ones evict it "
        "(default 3600)",
    )
    limits = StructuredOutputLimits()
    structured = {
        "max_constraint_bytes": "largest structured-output constraint (a grammar, regex, the "
        "choices, a JSON Schema as JSON), in bytes",
        "max_grammar_rules": "most rules in a grammar (GBNF or Lark)",
        "max_constraint_depth": "deepest nesting in a constraint: subschemas, grammar or regex "
        "groups, chains of grammar rules each referring to the next",
        "max_schema_properties": "most properties over a JSON Schema",
        "max_enum_values": "most enum and const values over a JSON Schema; most choices",
    }
    for name, meaning in structured.items():
        add(
            f"--{name.replace('_', '-')}",
            type=int,
            help=f"{meaning} (default {getattr(limits, name)})",
        )
    add(
        "--grammar-compile-workers",
        type=int,
        help="threads compiling structured-output grammars over 4 KiB (default: one per 4 CPU "
        "cores, 1 to 4; smaller grammars have a thread of their own)",
    )
    add(
        "--max-queued-grammar-compiles",
        type=int,
        help="grammar compiles running or waiting, per queue, before 429 (default 16)",
    )
    add(
        "--tool-call-parser",
        help="how chat output is read for tool calls: auto (from the chat template), hermes, "
        "llama3_json, mistral or pythonic (default auto)",
    )
    add(
        "--reasoning-parser",
        help="how a reasoning model's chat output is read: its thinking apart from its answer "
        "(message.reasoning_content, the Responses API's reasoning items), the answer alone "
        "constrained and read for tool calls: deepseek_r1, deepseek_v3 or qwen3 "
        "(default: none, the output is the answer; env OPTION_REASONING_PARSER)",
    )
    add(
        "--api-key",
        help="Bearer token required on every route but /health, /ping and "
        "/metrics (env JAXGEN_API_KEY or VLLM_API_KEY)",
    )
    add("--allowed-origins", nargs="+", help="CORS allowed origins (default *; a JSON list too)")
    add("--allowed-methods", nargs="+", help="CORS allowed methods (default *)")
    add("--allowed-headers", nargs="+", help="CORS allowed headers (default *)")
    add(
        "--allow-credentials",
        action="store_const",
        const=True,
        help="CORS: allow credentials (default off)",
    )
    add("--properties", help="an LMI serving.properties file")
    add("--log-level", choices=["critical", "error", "warning", "info", "debug"])


def _setting_flags() -> tuple[str, ...]:
    parser = argparse.ArgumentParser(add_help=False)
    add_serve_arguments(parser)
    defaults = vars(parser.parse_args([]))  # every flag's is None; set_defaults' entries not
    return tuple(name for name, value in defaults.items() if value is None and name != "properties")


# Every flag's dest, which is the name of the setting it gives (``--properties`` names the file).
FLAG_SETTINGS = _setting_flags()


def settings_from_args(args: argparse.Namespace, environ=None):
    flags = {name: getattr(args, name, None) for name in FLAG_SETTINGS}
    return resolve_settings(
        flags, os.environ if environ is None else environ, getattr(args, "properties", None)
    )


def check_engine_knobs(settings) -> None:
    """Raises ``ValueError`` for engine knobs ``EngineConfig`` refuses."""
    EngineConfig(**engine_knobs(settings, set(EngineConfig.__dataclass_fields__)))
