"""Settings resolution for ``jaxgen serve``: flags > environment > serving.properties > defaults."""

from __future__ import annotations

import argparse
import types

import pytest

from jaxgen.config.byte_sizes import parse_kv_cache_memory
from serving.launch.cli import FLAG_SETTINGS, add_serve_arguments, settings_from_args
from serving.settings.parsers import SettingsError, read_properties
from serving.settings.resolve import ServerSettings, engine_knobs, resolve_settings
from serving.state import Limits

PROPERTIES = """\
# DJL / SageMaker LMI serving.properties
engine=Python
option.model_id=/models/from-file
option.tensor_parallel_degree=4
option.rolling_batch=lmi-dist
option.max_rolling_batch_size=32
option.max_rolling_batch_prefill_tokens=1024
option.dtype=bf16
batch_size=8
max_batch_delay=250
option.entryPoint=djl_python.huggingface
"""


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return parser.parse_args(argv)


@pytest.fixture
def properties_file(tmp_path):
    path = tmp_path / "serving.properties"
    path.write_text(PROPERTIES)
    return str(path)


def test_defaults():
    settings = resolve_settings({}, {})
    assert settings.host == "127.0.0.1" and settings.port == 8080
    assert settings.max_concurrent_requests == 128
    assert settings.drain_timeout == 30.0
    assert settings.dtype == "float32"
    assert settings.engine == {}
    assert settings.max_input_tokens is None and settings.max_total_tokens is None


def test_properties_file(properties_file):
    settings = resolve_settings({}, {}, properties_file)
    assert settings.model == "/models/from-file"
    assert settings.tensor_parallel_degree == 4
    assert settings.dtype == "bfloat16"
    assert settings.engine["batching"] == "paged"
    assert settings.engine["max_rolling_batch_size"] == 32
    assert settings.engine["max_rolling_batch_prefill_tokens"] == 1024
    assert settings.engine["batch_size"] == 8
    assert settings.engine["max_batch_delay"] == pytest.approx(0.25)  # milliseconds in LMI
    assert "engine" in settings.ignored and "option.entryPoint" in settings.ignored
    assert settings.sources["model"].startswith("properties file")


@pytest.mark.parametrize(
    ("rolling", "batch_size", "batching"),
    [
        ("auto", 1, "paged"),
        ("vllm", 1, "paged"),
        ("lmi-dist", 4, "paged"),
        ("disable", 8, "dynamic"),
        ("disable", 1, "static"),
    ],
)
def test_rolling_batch_modes(tmp_path, rolling, batch_size, batching):
    path = tmp_path / "p.properties"
    path.write_text(f"option.rolling_batch={rolling}\nbatch_size={batch_size}\n")
    assert resolve_settings({}, {}, str(path)).engine["batching"] == batching


def test_tgi_environment_overrides_file(properties_file):
    environ = {
        "MODEL_ID": "/models/from-env",
        "MAX_CONCURRENT_REQUESTS": "7",
        "MAX_INPUT_LENGTH": "100",
        "MAX_TOTAL_TOKENS": "200",
        "MAX_BATCH_PREFILL_TOKENS": "2048",
        "MAX_BATCH_TOTAL_TOKENS": "50000",
        "SM_NUM_GPUS": "2",
        "DTYPE": "float16",
        "MAX_BEST_OF": "4",
    }
    settings = resolve_settings({}, environ, properties_file)
    assert settings.model == "/models/from-env"
    assert settings.max_concurrent_requests == 7
    assert settings.max_best_of == 4
    assert settings.max_input_tokens == 100
    assert settings.max_total_tokens == 200
    assert settings.engine["max_rolling_batch_prefill_tokens"] == 2048
    assert settings.engine["max_rolling_batch_size"] == 32  # still from the file
    assert settings.engine["max_model_len"] == 200  # MAX_TOTAL_TOKENS sizes the context
    assert settings.kv_cache_tokens == 50000
    assert settings.tensor_parallel_degree == 2
    assert settings.dtype == "float16"
    assert settings.sources["max_concurrent_requests"] == "environment"


def test_environment_aliases():
    both = {
        "MAX_INPUT_TOKENS": "10",
        "MAX_INPUT_LENGTH": "20",
        "NUM_SHARD": "2",
        "SM_NUM_GPUS": "8",
    }
    settings = resolve_settings({}, both)
    assert settings.max_input_tokens == 10  # the newer TGI name wins
    assert settings.tensor_parallel_degree == 2
    lmi = resolve_settings({}, {"OPTION_ROLLING_BATCH": "disable", "OPTION_BATCH_SIZE": "4"})
    assert lmi.engine["batching"] == "dynamic" and lmi.engine["batch_size"] == 4
    hf = resolve_settings({}, {"HF_MODEL_ID": "/m"})
    assert hf.model == "/m"


def test_flags_override_everything(properties_file):
    environ = {"MAX_CONCURRENT_REQUESTS": "7", "MAX_BATCH_PREFILL_TOKENS": "2048"}
    args = parse(
        [
            "--model",
            "/models/from-flag",
            "--max-concurrent-requests",
            "3",
            "--max-rolling-batch-prefill-tokens",
            "64",
            "--batching",
            "continuous",
            "--max-batch-delay",
            "0.5",
            "--dtype",
            "fp32",
            "--port",
            "9000",
            "--kv-cache-memory",
            "64MiB",
            "--drain-timeout",
            "2.5",
            "--no-prefix-caching",
            "--no-precompile",
            "--async-scheduling",
            "--properties",
            properties_file,
        ]
    )
    settings = settings_from_args(args, environ)
    assert settings.model == "/models/from-flag"
    assert settings.max_concurrent_requests == 3
    assert settings.engine["max_rolling_batch_prefill_tokens"] == 64
    assert settings.engine["batching"] == "continuous"  # beats option.rolling_batch
    assert settings.engine["max_batch_delay"] == 0.5  # seconds on the command line
    assert settings.engine["kv_cache_memory"] == 64 << 20
    assert settings.engine["enable_prefix_caching"] is False
    assert settings.engine["precompile"] is False
    assert (
        settings.engine["async_scheduling"] is True
    )  # a knob off by default: its flag turns it on
    assert settings.dtype == "float32" and settings.port == 9000 and settings.drain_timeout == 2.5
    assert settings.engine["max_rolling_batch_size"] == 32  # untouched: from the file
    assert settings.sources["model"] == "flags"


def test_tool_call_parser_flag():
    assert resolve_settings({}, {}).tool_call_parser == "auto"
    assert settings_from_args(parse(["--tool-call-parser", "pythonic"]), {}).tool_call_parser == (
        "pythonic"
    )


def test_scheduling_policy_from_flag_environment_and_properties(tmp_path):
    path = tmp_path / "serving.properties"
    path.write_text("option.scheduling_policy=priority\n")
    assert resolve_settings({}, {}, str(path)).engine["scheduling_policy"] == "priority"
    assert resolve_settings({}, {"SCHEDULING_POLICY": "priority"}).engine["scheduling_policy"] == (
        "priority"
    )
    args = parse(["--scheduling-policy", "fcfs"])
    settings = settings_from_args(args, {"SCHEDULING_POLICY": "priority"})
    assert settings.engine["scheduling_policy"] == "fcfs"  # the flag wins
    with pytest.raises(SettingsError, match="scheduling_policy from flags must be one of fcfs"):
        settings_from_args(parse(["--scheduling-policy", "lifo"]), {})


def test_unset_flags_fall_through():
    args = parse([])
    assert all(getattr(args, dest) is None for dest in FLAG_SETTINGS)
    settings = settings_from_args(args, {"PORT": "1234"})
    assert settings.port == 1234


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("64MiB", 64 << 20),
        ("2GiB", 2 << 30),
        ("1048576", 1 << 20),
        ("0.5", 0.5),
        ("1", 1.0),
        ("512k", 512 << 10),
        ("1.5g", int(1.5 * (1 << 30))),
    ],
)
def test_kv_cache_memory_units(text, value):
    assert parse_kv_cache_memory(text, "test") == value


@pytest.mark.parametrize(
    ("flags", "environ", "message"),
    [
        ({"max_concurrent_requests": "0"}, {}, "max_concurrent_requests from flags"),
        ({}, {"MAX_CONCURRENT_REQUESTS": "lots"}, "max_concurrent_requests from environment"),
        ({}, {"DTYPE": "int3"}, "dtype from environment"),
        ({"kv_cache_memory": "lots"}, {}, "kv_cache_memory"),
        ({"port": 70000}, {}, "port"),
        ({"drain_timeout": -1}, {}, "drain_timeout"),
        ({}, {"MAX_BEST_OF": "0"}, "max_best_of from environment"),
        ({"max_input_tokens": 10, "max_total_tokens": 10}, {}, "max_input_tokens"),
        ({"enable_prefix_caching": "maybe"}, {}, "enable_prefix_caching"),
        ({}, {"OPTION_PRECOMPILE": "sometimes"}, "precompile from environment"),
        ({"tool_call_parser": "xml"}, {}, "tool_call_parser from flags"),
        ({"scheduling_policy": "lifo"}, {}, "scheduling_policy from flags must be one of"),
        ({}, {"SCHEDULING_POLICY": "sjf"}, "scheduling_policy from environment"),
    ],
)
def test_bad_values_name_their_source(flags, environ, message):
    with pytest.raises(SettingsError, match=message):
        resolve_settings(flags, environ)


def test_bad_rolling_batch(tmp_path):
    path = tmp_path / "p.properties"
    path.write_text("option.rolling_batch=turbo\n")
    with pytest.raises(SettingsError, match="rolling_batch from properties file"):
        resolve_settings({}, {}, str(path))


def test_missing_properties_file(tmp_path):
    with pytest.raises(SettingsError, match="cannot read properties file"):
        resolve_settings({}, {}, str(tmp_path / "nope.properties"))


def test_properties_syntax(tmp_path):
    path = tmp_path / "p.properties"
    path.write_text("! comment\n# comment\n\na=1\nb : 2\nc 3\nd=x=y\n  e = spaced  \n")
    assert read_properties(str(path)) == {"a": "1", "b": "2", "c": "3", "d": "x=y", "e": "spaced"}


def test_engine_knobs_only_known_fields():
    settings = ServerSettings(
        engine={"batching": "paged", "page_size": 8}, tensor_parallel_degree=2
    )
    assert engine_knobs(settings, {"batching", "page_size"}) == {
        "batching": "paged",
        "page_size": 8,
    }
    knobs = engine_knobs(settings, {"batching", "page_size", "tensor_parallel_degree"})
    assert knobs["tensor_parallel_degree"] == 2


def fake_llm(max_model_len=256, vocab_size=100):
    """Just what ``Limits.resolve`` reads from an ``AsyncLLM``."""
    return types.SimpleNamespace(
        max_model_len=max_model_len,
        model_config=types.SimpleNamespace(vocab_size=vocab_size),
        tokenizer=[None] * vocab_size,
    )


def test_limits_default_to_engine_context():
    limits = Limits.resolve(ServerSettings(), fake_llm(256))
    assert (limits.max_total_tokens, limits.max_input_tokens) == (256, 255)
    limits = Limits.resolve(
        ServerSettings(max_total_tokens=128, max_input_tokens=100), fake_llm(256)
    )
    assert (limits.max_total_tokens, limits.max_input_tokens) == (128, 100)
    with pytest.raises(SettingsError, match="exceeds the engine's max_model_len"):
        Limits.resolve(ServerSettings(max_total_tokens=512), fake_llm(256))
