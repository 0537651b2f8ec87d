"""The repository's layout: first-party imports form layers without cycles, importing the core
package pulls in no optional dependency, and docs/configuration.md's knob table is the one
``EngineConfig`` declares."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Each package may import the ones after it, never one before it.
LAYERS = ("serving", "jaxgen", "pallas_kernels")


def first_party_modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the three packages."""
    modules = {}
    for package in LAYERS:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _under_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported_names(module: str, path: Path) -> list[tuple[str, int]]:
    """Every name ``module`` imports (at the top or inside functions), with its line; absolute
    and relative imports, ``from package import submodule`` as the submodule. Imports under
    ``if TYPE_CHECKING:`` never run and are left out; so are string imports, which would hide
    an edge from this test and are refused instead (see ``test_no_imports_by_string``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    skipped = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and _under_type_checking(node)
        for statement in node.body
        for inner in ast.walk(statement)
    }
    names = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            names += [(f"{base}.{alias.name}", node.lineno) for alias in node.names]
    return names


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {first-party module it imports: line}."""
    modules = first_party_modules()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in modules.items():
        edges = {}
        for name, line in imported_names(module, path):
            target = resolve(name)
            if target is not None and target != module:
                edges.setdefault(target, line)
        graph[module] = edges
    return graph


def find_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    index, low, on_stack, stack, cycles = {}, {}, set(), [], []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def _layer(module: str) -> int:
    return LAYERS.index(module.split(".")[0])


def test_graph_sees_imports_inside_functions():
    graph = import_graph()
    assert "jaxgen.llm" in graph["jaxgen"]  # the lazy ``LLM`` of jaxgen/__init__.py
    assert len(graph) > 80


def test_no_import_cycles():
    cycles = find_cycles(import_graph())
    assert cycles == [], "first-party import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_imports_flow_from_serving_to_jaxgen_to_pallas_kernels():
    graph = import_graph()
    modules = first_party_modules()
    upward = [
        f"{modules[module].relative_to(ROOT)}:{line} imports {target}"
        for module, edges in sorted(graph.items())
        for target, line in edges.items()
        if _layer(target) < _layer(module)
    ]
    assert upward == [], "imports against serving -> jaxgen -> pallas_kernels:\n" + "\n".join(
        upward
    )


def test_no_imports_by_string():
    """``importlib.import_module``/``__import__`` with a first-party name would hide an edge."""
    found = []
    for path in first_party_modules().values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            argument = node.args[0]
            if (
                name in ("import_module", "__import__", "run_module")
                and isinstance(argument, ast.Constant)
                and str(argument.value).split(".")[0] in LAYERS
            ):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


# Modules the core package must never import on its own: optional extras and the server.
# transformers (a second to import) and llguidance load when a tokenizer or a grammar is built.
FORBIDDEN_AT_IMPORT = ("matplotlib", "torch", "llama_cpp", "serving", "transformers", "llguidance")
IMPORT_PROBE = """
import sys
import {module}
{after}
loaded = {{name.split(".")[0] for name, mod in sys.modules.items() if mod is not None}}
bad = sorted(loaded & set({forbidden!r}))
torch_models = sorted(
    name for name in sys.modules
    if name.startswith("transformers.models.") and ".modeling_" in name
)
print(bad + torch_models)
"""


def _imported_by(module: str, after: str = "") -> str:
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    code = IMPORT_PROBE.format(module=module, after=after, forbidden=FORBIDDEN_AT_IMPORT)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


def test_importing_jaxgen_pulls_in_no_extra_and_no_server():
    assert _imported_by("jaxgen") == "[]"
    assert _imported_by("jaxgen.llm") == "[]"
    # The whole command line, every subcommand's parser built (bench's included).
    assert _imported_by("jaxgen.cli", "jaxgen.cli.build_parser()") == "[]"


def test_the_command_line_imports_no_pallas_kernel_and_no_benchmark_runner():
    """``jaxgen generate`` on a CPU needs neither Pallas nor the kernels written in it, nor
    what the bench and plan commands run: they load when used (about 0.4 s of a start-up)."""
    lazy = (
        "jax.experimental.pallas",
        "pallas_kernels.gpu",
        "pallas_kernels.tpu",
        "jaxgen.backends.pallas_gpu",
        "jaxgen.backends.pallas_tpu",
        "jaxgen.bench.commands",
        "jaxgen.planning.ahead_of_time",
        "jaxgen.async_llm",
    )
    code = (
        "import sys, jaxgen.cli\n"
        "jaxgen.cli.build_parser()\n"
        f"print(sorted(name for name in {lazy!r} if name in sys.modules))"
    )
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"
    import jaxgen.backends
    import pallas_kernels

    assert jaxgen.backends.PallasGPUBackend.__name__ == "PallasGPUBackend"  # on first use
    assert callable(pallas_kernels.ragged_paged_attention_gpu)


def test_the_default_models_tokenizer_imports_no_transformers():
    """``jaxgen generate --chat`` on the default GGUF: its tokenizer loads, encodes, renders the
    chat template and decodes without transformers or llguidance."""
    after = (
        "from jaxgen.loaders.default_model import default_model_path\n"
        "tokenizer = jaxgen.loaders.tokenizer.load_tokenizer(default_model_path())\n"
        "text = tokenizer.apply_chat_template([{'role': 'user', 'content': 'Hi'}], "
        "tokenize=False, add_generation_prompt=True)\n"
        "tokenizer.decode(tokenizer.encode(text))"
    )
    assert _imported_by("jaxgen.loaders.tokenizer", after) == "[]"


def test_the_program_ends_generate_with_its_output_flushed_and_its_exit_code(tiny_model_dir):
    """``jaxgen generate`` (``python -m jaxgen``: ``jaxgen.cli.run``) ends the process without
    the interpreter's teardown: the answer still arrives whole through a pipe, and the exit
    code is the command's (2 for bad input)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    base = [sys.executable, "-m", "jaxgen", "generate", "--model", tiny_model_dir]
    answered = subprocess.run(
        [*base, "--max-tokens", "3", "Hello", "Bonjour"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert answered.returncode == 0, answered.stderr[-3000:]
    assert answered.stdout.count("--- ") == 2  # both prompts' headers: nothing lost unflushed
    missing = os.path.join(tiny_model_dir, "no-such-model")
    refused = subprocess.run(
        [*base[:4], "--model", missing, "Hello"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert refused.returncode == 2 and "jaxgen: error" in refused.stderr, refused.stderr[-3000:]


def test_command_line_pauses_garbage_collection_only_while_it_sets_up():
    """Importing ``jaxgen.cli`` leaves the collector as it was; ``setting_up`` pauses it for
    its block and resumes it after (the start-up's objects frozen)."""
    import gc

    from jaxgen.cli import setting_up

    assert gc.isenabled()
    try:
        with setting_up():
            assert not gc.isenabled()
        assert gc.isenabled() and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.enable()


def test_jaxgen_serve_runs_the_server_command_line():
    """``jaxgen serve`` hands its flags to ``python -m serving`` (jaxgen never imports serving)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    result = subprocess.run(
        [sys.executable, "-m", "jaxgen.cli", "serve", "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("usage: jaxgen serve")
    assert "--max-rolling-batch-size" in result.stdout and "--properties" in result.stdout


# -- engine knobs: declared once on EngineConfig, everything else derived --------------------------
def test_knob_table_in_the_docs_is_the_declared_one():
    from jaxgen.config.knob_table import knob_table, table_in
    from jaxgen.config.knobs import undeclared_fields

    assert undeclared_fields() == [], "declare these EngineConfig fields with knob(...)"

    text = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert table_in(text) == knob_table(), (
        "docs/configuration.md's knob table differs from EngineConfig's declarations: "
        "python -m jaxgen.config.knob_table --write docs/configuration.md"
    )


def test_command_lines_take_the_declared_knobs_with_their_defaults():
    import argparse

    from jaxgen.cli import build_parser
    from jaxgen.config.knobs import engine_kwargs, knob_fields
    from serving.launch.cli import add_serve_arguments

    fields = knob_fields()
    generate = build_parser().parse_args(["generate"])
    expected = {f.name: f.default for f in fields if f.flag and not f.knob.serve_only}
    # Unset, generate's most sequences at once is its number of prompts (cmd_generate).
    assert engine_kwargs(generate) == {
        "dtype": "float32",
        **expected,
        "max_rolling_batch_size": None,
    }
    offline = build_parser().parse_args(["bench", "offline"])
    assert engine_kwargs(offline) == {**engine_kwargs(generate), "max_rolling_batch_size": 64}

    serve = argparse.ArgumentParser()
    add_serve_arguments(serve)
    flags = {option for action in serve._actions for option in action.option_strings}
    assert {f.flag for f in fields if f.flag} <= flags
    assert all(getattr(serve.parse_args([]), f.name) is None for f in fields if f.flag)


def as_read_from(settings, source: str):
    """``settings`` as resolved from ``source`` instead of flags."""
    import dataclasses

    return dataclasses.replace(
        settings, sources={name: source for name in settings.sources}, ignored=[]
    )


def test_server_reads_the_declared_environment_and_properties(tmp_path):
    from jaxgen.config.knobs import knob_fields
    from serving.settings.resolve import resolve_settings

    values = {"int": "3", "float": "0.5", "bool": "false", "str": "x", "memory": "64MiB"}
    values["json"] = '{"method": "ngram", "num_speculative_tokens": 2}'
    for field in knob_fields():
        value = field.knob.choices[-1] if field.knob.choices else values[field.kind]
        expected = resolve_settings({field.name: value}, {})
        for env in field.knob.env:
            assert resolve_settings({}, {env: value}) == as_read_from(expected, "environment")
        for key in field.knob.properties:
            path = tmp_path / "serving.properties"
            path.write_text(f"{key}={value}\n")
            from_file = resolve_settings({}, {}, str(path))
            assert (from_file.engine, from_file.tensor_parallel_degree) == (
                expected.engine,
                expected.tensor_parallel_degree,
            ), key


def test_ray_is_imported_only_by_the_ray_app():
    """Ray Serve is the optional ``ray`` extra: the Ray app and its two Ray-facing routing
    modules (the router and the ingress deployment) import it, and the server (its command line
    included, ``--ray`` parsed lazily) starts without it."""
    importers = sorted(
        str(path.relative_to(ROOT))
        for module, path in first_party_modules().items()
        if any(name.split(".")[0] == "ray" for name, _ in imported_names(module, path))
    )
    assert importers == [
        "serving/ray_app.py",
        "serving/ray_routing/ingress_deployment.py",
        "serving/ray_routing/prefix_router.py",
    ]
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    code = (
        "import sys, serving.launch.cli, serving.app, serving.pod\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'ray'}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"
