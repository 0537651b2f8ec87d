"""Server settings from flags, TGI/LMI environment variables and an LMI ``serving.properties`` file.

Precedence: command-line flags > environment > properties file > defaults. Every value is
parsed and checked here (by ``serving.settings.parsers``), so a bad setting fails at startup
with a message naming its source.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

from jaxgen.config.knobs import KnobField, environment_variables, knob_fields, property_keys
from jaxgen.reasoning import REASONING_PARSERS
from jaxgen.structured_outputs.limits import StructuredOutputLimits
from jaxgen.tool_calling.formats import TOOL_CALL_PARSERS
from serving.lora_adapters import parse_lora_modules
from serving.settings.parsers import (
    SettingsError,
    parse_bool,
    parse_choice,
    parse_dtype,
    parse_float,
    parse_int,
    parse_memory,
    parse_quantization,
    parse_string_list,
    read_properties,
)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
DEFAULT_MAX_CONCURRENT_REQUESTS = 128
DEFAULT_MAX_WAITING_REQUESTS = 1024  # requests queued for a slot before 429
DEFAULT_DRAIN_TIMEOUT = 30.0
DEFAULT_MAX_STOP_SEQUENCES = 4
DEFAULT_MAX_BEST_OF = 2  # TGI's default
DEFAULT_MAX_BODY_BYTES = 4 << 20
DEFAULT_BODY_READ_TIMEOUT = 30.0
DEFAULT_HEADER_READ_TIMEOUT = 10.0
DEFAULT_KEEP_ALIVE_TIMEOUT = 5.0
DEFAULT_MAX_CONNECTIONS = 1024
DEFAULT_MAX_HEADER_BYTES = 16 << 10  # request line + headers (llhttp's and h11's default)
# One compile thread per 4 CPU cores (1 to 4): compiles must leave the engine its cores.
DEFAULT_GRAMMAR_COMPILE_WORKERS = max(1, min(4, (os.cpu_count() or 1) // 4))
DEFAULT_MAX_QUEUED_GRAMMAR_COMPILES = 16
DEFAULT_MAX_LOGIT_BIAS = None  # entries per request: None = the vocabulary (vLLM has no cap)
# StructuredOutputLimits' fields: each is a setting (and a flag) of the same name.
STRUCTURED_OUTPUT_LIMITS = tuple(field.name for field in dataclasses.fields(StructuredOutputLimits))

ROLLING_BATCH_PAGED = ("auto", "vllm", "lmi-dist", "lmi_dist", "scheduler", "paged", "true")
# TGI / SageMaker environment variables -> setting names (the engine knobs' are declared on
# ``EngineConfig``; among aliases of one setting the first listed wins).
ENV_VARS = {
    "MODEL_ID": "model",
    "HF_MODEL_ID": "model",
    "REVISION": "revision",
    "HF_MODEL_REVISION": "revision",
    "PORT": "port",
    "DTYPE": "dtype",
    "MAX_CONCURRENT_REQUESTS": "max_concurrent_requests",
    "MAX_BEST_OF": "max_best_of",
    "MAX_STOP_SEQUENCES": "max_stop_sequences",
    "MAX_INPUT_TOKENS": "max_input_tokens",
    "MAX_INPUT_LENGTH": "max_input_tokens",
    "MAX_TOTAL_TOKENS": "max_total_tokens",
    "MAX_BATCH_TOTAL_TOKENS": "kv_cache_tokens",
    "JAXGEN_API_KEY": "api_key",
    "VLLM_API_KEY": "api_key",
    **environment_variables(),
}
# serving.properties keys (also read from OPTION_* environment variables, as LMI does); LMI's own
# spellings of two knobs are translated in ``_apply_engine``.
PROPERTY_KEYS = {
    "option.model_id": "model",
    "option.revision": "revision",
    "option.dtype": "dtype",
    "option.max_input_len": "max_input_tokens",
    "option.max_concurrent_requests": "max_concurrent_requests",
    "option.rolling_batch": "rolling_batch",  # -> batching
    "max_batch_delay": "max_batch_delay_ms",  # -> max_batch_delay, in milliseconds
    "option.max_batch_delay": "max_batch_delay_ms",
    "option.reasoning_parser": "reasoning_parser",
    **property_keys(),
}


# ``model`` values that mean "whatever this server serves": huggingface_hub's InferenceClient built
# from a URL sends "dummy", and TGI's documentation tells OpenAI clients to send "tgi".
PLACEHOLDER_MODEL_NAMES = ("dummy", "tgi")


@dataclasses.dataclass
class ServerSettings:
    """Everything ``jaxgen serve`` needs: where to listen, which model, limits and engine knobs.

    ``None`` limits are derived from the engine once it is loaded (see ``Limits``).
    """

    model: str | None = None
    revision: str | None = None  # a hub id's branch, tag or commit
    gguf_file: str | None = None  # the GGUF file of a hub repository (or local directory)
    # The local checkpoint ``model`` resolved to (a hub id's download), once resolved.
    model_path: str | None = None
    served_model_name: str | None = None
    model_aliases: tuple[str, ...] = ()  # more names clients may use (``served_model_name`` set)
    lora_modules: tuple[tuple[str, str], ...] = ()  # (name, path): adapters offered as models
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    dtype: str = "float32"
    engine: dict[str, Any] = dataclasses.field(default_factory=dict)
    kv_cache_tokens: int | None = None
    tensor_parallel_degree: int | None = None
    max_concurrent_requests: int = DEFAULT_MAX_CONCURRENT_REQUESTS
    max_waiting_requests: int = DEFAULT_MAX_WAITING_REQUESTS
    max_input_tokens: int | None = None
    max_total_tokens: int | None = None
    max_stop_sequences: int = DEFAULT_MAX_STOP_SEQUENCES
    max_best_of: int = DEFAULT_MAX_BEST_OF  # TGI's ``best_of``: sequences per request
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT
    body_read_timeout: float = DEFAULT_BODY_READ_TIMEOUT
    header_read_timeout: float = DEFAULT_HEADER_READ_TIMEOUT
    keep_alive_timeout: float = DEFAULT_KEEP_ALIVE_TIMEOUT
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    max_logit_bias: int | None = DEFAULT_MAX_LOGIT_BIAS
    responses_store_size: int = 1000  # stored Responses (0: none); a finished one kept ttl s
    responses_store_ttl: float = 3600.0
    # Structured output: what a constraint may hold, and how many compile at once.
    structured_output_limits: StructuredOutputLimits = dataclasses.field(
        default_factory=StructuredOutputLimits
    )
    grammar_compile_workers: int = DEFAULT_GRAMMAR_COMPILE_WORKERS
    max_queued_grammar_compiles: int = DEFAULT_MAX_QUEUED_GRAMMAR_COMPILES
    log_level: str = "info"
    tool_call_parser: str = "auto"  # how chat output is read for tool calls (jaxgen.tool_calling)
    reasoning_parser: str | None = None  # how chat output's thinking is read (jaxgen.reasoning)
    api_key: str | None = None  # Bearer token every route but /health, /ping, /metrics needs
    # CORS (vLLM's flags and defaults): origins, methods and headers allowed, credentials
    allowed_origins: tuple[str, ...] = ("*",)
    allowed_methods: tuple[str, ...] = ("*",)
    allowed_headers: tuple[str, ...] = ("*",)
    allow_credentials: bool = False
    sources: dict[str, str] = dataclasses.field(default_factory=dict)
    ignored: list[str] = dataclasses.field(default_factory=list)

    @property
    def model_name(self) -> str:
        """The name clients see in ``/info`` and ``/v1/models``."""
        return self.served_model_name or self.model or "smollm2"

    def serves_model(self, name: str | None) -> bool:
        """Whether a request's ``model`` names this server's model (as vLLM: the served name,
        which defaults to the model argument, or an alias). Omitted is fine, and so are the
        placeholders TGI clients send for "the server's model" (see ``PLACEHOLDER_MODEL_NAMES``)."""
        return (
            name is None
            or name in PLACEHOLDER_MODEL_NAMES
            or name == self.model_name
            or name in self.model_aliases
        )


# -- resolution -------------------------------------------------------------------------------------
def resolve_settings(
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    properties_path: str | None = None,
) -> ServerSettings:
    """Merges defaults < properties file < environment < flags into checked ``ServerSettings``.

    Args:
        flags: setting names to values for flags given on the command line (None = not given).
        environ: the environment (``os.environ`` by default).
        properties_path: an LMI ``serving.properties`` file.
    """
    environ = os.environ if environ is None else environ
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    layers: list[tuple[str, dict[str, Any]]] = []
    ignored: list[str] = []
    if properties_path:
        properties = read_properties(properties_path)
        layers.append((f"properties file {properties_path}", _from_properties(properties, ignored)))
    layers.append(("environment", _from_environment(environ)))
    layers.append(("flags", flags))

    raw: dict[str, tuple[Any, str]] = {}
    for source, values in layers:
        for name, value in values.items():
            raw[name] = (value, source)
    settings = ServerSettings(ignored=ignored)
    _apply(settings, raw)
    return settings


def _from_properties(properties: Mapping[str, str], ignored: list[str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for key, value in properties.items():
        name = PROPERTY_KEYS.get(key)
        if name is None:
            ignored.append(key)
        elif value != "":
            values[name] = value
    return values


def _from_environment(environ: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    # LMI style OPTION_<KEY> first, then TGI names (which win); among aliases the first listed wins.
    for key, name in PROPERTY_KEYS.items():
        env_name = "OPTION_" + key.removeprefix("option.").upper()
        if environ.get(env_name, "") != "":
            values[name] = environ[env_name]
    for env_name, name in reversed(ENV_VARS.items()):
        if environ.get(env_name, "") != "":
            values[name] = environ[env_name]
    return values


def _apply(settings: ServerSettings, raw: dict[str, tuple[Any, str]]) -> None:
    def take(name: str):
        value, source = raw.get(name, (None, "defaults"))
        if value is not None:
            settings.sources[name] = source
        return value, source

    value, source = take("model")
    settings.model = str(value) if value is not None else None
    for name in ("revision", "gguf_file"):
        value, _ = take(name)
        if value is not None and str(value) != "":
            setattr(settings, name, str(value))
    value, _ = take("served_model_name")
    names = [value] if isinstance(value, str) else list(value or [])
    names = [n.strip() for name in names for n in str(name).split(",") if n.strip()]
    if names:  # vLLM's ``--served-model-name NAME [ALIAS ...]``: the first is shown
        settings.served_model_name, settings.model_aliases = names[0], tuple(names[1:])
    value, source = take("lora_modules")
    settings.lora_modules = parse_lora_modules(value, source)
    value, source = take("host")
    if value is not None:
        settings.host = str(value)
    value, source = take("port")
    if value is not None:
        settings.port = parse_int(value, "port", source, minimum=0)
        if settings.port > 65535:
            raise SettingsError(f"port from {source} must be <= 65535, got {value!r}")
    value, source = take("dtype")
    if value is not None:
        settings.dtype = parse_dtype(value, source)
    for name, minimum in (
        ("max_concurrent_requests", 1),
        ("max_waiting_requests", 0),
        ("max_input_tokens", 1),
        ("max_total_tokens", 2),
        ("kv_cache_tokens", 1),
        ("max_stop_sequences", 0),
        ("max_best_of", 1),
        ("max_body_bytes", 1024),
        ("max_connections", 1),
        ("max_header_bytes", 1024),
        ("max_logit_bias", 0),
        ("grammar_compile_workers", 1),
        ("max_queued_grammar_compiles", 1),
        ("responses_store_size", 0),
    ):
        value, source = take(name)
        if value is not None:
            setattr(settings, name, parse_int(value, name, source, minimum=minimum))
    limits = {}
    for name in STRUCTURED_OUTPUT_LIMITS:
        value, source = take(name)
        if value is not None:
            limits[name] = parse_int(value, name, source, minimum=1)
    settings.structured_output_limits = StructuredOutputLimits(**limits)
    timeouts = ("drain_timeout", "body_read_timeout", "header_read_timeout", "keep_alive_timeout")
    for name in (*timeouts, "responses_store_ttl"):
        value, source = take(name)
        if value is not None:
            setattr(settings, name, parse_float(value, name, source))
    value, _ = take("log_level")
    if value is not None:
        settings.log_level = str(value).lower()
    value, source = take("tool_call_parser")
    if value is not None:
        choices = ("auto", *TOOL_CALL_PARSERS)
        settings.tool_call_parser = parse_choice(value, "tool_call_parser", source, choices)
    value, source = take("reasoning_parser")
    if value is not None and str(value) != "":
        settings.reasoning_parser = parse_choice(
            value, "reasoning_parser", source, REASONING_PARSERS
        )
    value, _ = take("api_key")
    if value is not None and str(value) != "":
        settings.api_key = str(value)
    for name in ("allowed_origins", "allowed_methods", "allowed_headers"):
        value, source = take(name)
        if value is not None:
            setattr(settings, name, parse_string_list(value, name, source))
    value, source = take("allow_credentials")
    if value is not None:
        settings.allow_credentials = parse_bool(value, "allow_credentials", source)
    _apply_engine(settings, raw, take)
    if settings.max_input_tokens is not None and settings.max_total_tokens is not None:
        if settings.max_input_tokens >= settings.max_total_tokens:
            raise SettingsError(
                f"max_input_tokens ({settings.max_input_tokens}) must be < max_total_tokens "
                f"({settings.max_total_tokens})"
            )


def _apply_engine(settings: ServerSettings, raw, take) -> None:
    engine = settings.engine
    for field in knob_fields():
        value, source = take(field.name)
        if value is not None:
            engine[field.name] = _parse_knob(field, value, source)
    # LMI's spellings: max_batch_delay in milliseconds, option.rolling_batch for batching.
    value, source = take("max_batch_delay")
    delay_ms, ms_source = take("max_batch_delay_ms")
    if delay_ms is not None and (value is None or _rank(ms_source) > _rank(source)):
        engine["max_batch_delay"] = parse_float(delay_ms, "max_batch_delay (ms)", ms_source) / 1000
    batching, batching_source = take("batching")
    rolling, rolling_source = take("rolling_batch")
    if rolling is not None and (batching is None or _rank(rolling_source) > _rank(batching_source)):
        engine["batching"] = _batching_from_rolling(rolling, rolling_source, engine)
    # The server keeps the degree itself (a KV budget in tokens is for single-device engines).
    settings.tensor_parallel_degree = engine.pop("tensor_parallel_degree", None)
    if settings.max_total_tokens is not None and "max_model_len" not in engine:
        engine["max_model_len"] = settings.max_total_tokens


def _parse_knob(field: KnobField, value: Any, source: str):
    if field.name == "quantization":  # TGI's and LMI's spellings too
        return parse_quantization(value, source)
    choices = field.knob.choices
    if choices is not None and field.kind == "str" and str(value) not in choices:
        raise SettingsError(
            f"{field.name} from {source} must be one of {', '.join(choices)}, got {value!r}"
        )
    if field.kind == "int":
        return parse_int(value, field.name, source, minimum=field.knob.minimum)
    if field.kind == "float":
        return parse_float(value, field.name, source)
    if field.kind == "bool":
        return parse_bool(value, field.name, source)
    if field.kind == "memory":
        return parse_memory(value, source)
    if field.kind == "json":  # speculative_config: a JSON object (the flag's parser read it)
        return _parse_json_object(value, field.name, source)
    return str(value)


def _parse_json_object(value: Any, name: str, source: str) -> dict:
    if isinstance(value, dict):
        return value
    try:
        parsed = json.loads(str(value))
    except json.JSONDecodeError as error:
        raise SettingsError(f"{name} from {source} must be a JSON object: {error}") from None
    if not isinstance(parsed, dict):
        raise SettingsError(f"{name} from {source} must be a JSON object, got {value!r}")
    return parsed


def _batching_from_rolling(value: Any, source: str, engine: dict) -> str:
    mode = str(value).strip().lower()
    if mode in ROLLING_BATCH_PAGED:
        return "paged"
    if mode in ("disable", "disabled", "false", "none", "off"):
        return "dynamic" if engine.get("batch_size", 1) > 1 else "static"
    raise SettingsError(
        f"rolling_batch from {source} must be auto, vllm, lmi-dist or disable, got {value!r}"
    )


def _rank(source: str) -> int:
    if source == "flags":
        return 3
    if source == "environment":
        return 2
    if source.startswith("properties"):
        return 1
    return 0


def engine_knobs(settings: ServerSettings, engine_fields: set[str]) -> dict[str, Any]:
    """Keyword arguments for ``EngineConfig``: the knobs that were set and that it knows."""
    knobs = {k: v for k, v in settings.engine.items() if k in engine_fields}
    if settings.tensor_parallel_degree is not None and "tensor_parallel_degree" in engine_fields:
        knobs["tensor_parallel_degree"] = settings.tensor_parallel_degree
    return knobs
