"""The house rules of the package layout (docs/architecture.md, "Layout"): no import cycle even
through ``TYPE_CHECKING`` imports, the layer rules inside ``jaxgen``, a short top level, files
of one screenful's job, and no copied code between the kernels."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

from tests.test_layout import ROOT, find_cycles, first_party_modules

# (importer, imported, why): dotted prefixes matching whole parts.
RULES = [
    ("jaxgen.models", "jaxgen.backends", "models never import backends"),
    ("jaxgen.models", "pallas_kernels", "models never import kernels"),
    ("jaxgen.layers", "jaxgen.models", "layers never import models"),
    ("jaxgen.layers", "jaxgen.backends", "layers never import backends"),
    ("jaxgen.layers", "jaxgen.engine", "layers never import the engine"),
    ("jaxgen.backends", "jaxgen.models", "backends read the model contract in layers"),
    ("jaxgen.backends", "jaxgen.engine", "backends never import the engine"),
    ("jaxgen.families", "jaxgen.config", "a family's facts sit below the configuration"),
    ("jaxgen.families", "jaxgen.models", "a family's facts sit below the models"),
    ("jaxgen.families", "jaxgen.layers", "a family's facts sit below the layers"),
    ("jaxgen.families", "jaxgen.loaders", "a family's facts sit below the loaders"),
    ("jaxgen.config", "jaxgen.models", "configuration never imports models"),
    ("jaxgen.config", "jaxgen.backends", "configuration never imports backends"),
    ("jaxgen.config", "jaxgen.engine", "configuration never imports the engine"),
    ("jaxgen.models", "jaxgen.engine", "models never import the engine"),
    ("jaxgen.quantization", "jaxgen.engine", "quantisation never imports the engine"),
    ("jaxgen.lora", "jaxgen.engine", "adapters and their slots need no engine"),
    ("jaxgen.lora", "jaxgen.models", "adapters reach the models through jaxgen.layers.lora"),
    ("jaxgen.layers", "jaxgen.lora", "layers never import the adapters' bookkeeping"),
    ("jaxgen.structured_outputs", "jaxgen.engine", "a request's constraint needs no engine"),
    ("jaxgen.reasoning", "jaxgen.engine", "reading reasoning needs no engine"),
    ("jaxgen.engine", "jaxgen.parallel", "the engine never imports its parallel forms"),
    ("jaxgen.engine", "jaxgen.planning", "the engine never imports planning tools"),
    ("jaxgen.engine", "jaxgen.bench", "the engine never imports bench"),
    ("jaxgen.engine", "jaxgen.cli", "the engine never imports the command line"),
    ("jaxgen.engine", "jaxgen.llm", "the engine never imports the public API"),
    ("jaxgen.engine", "jaxgen.async_llm", "the engine never imports the public API"),
]
MAX_TOP_LEVEL_MODULES = 8  # jaxgen/*.py besides __init__ and __main__
MAX_LINES = 400
# Files over MAX_LINES today, each with its length: the list only shrinks (a file that grows
# past its figure, or a new long file, fails).
LONG_FILES: dict[str, int] = {}  # none left
SOURCE_SUFFIXES = (".py", ".h", ".cc", ".c", ".cpp")
RUN = 6  # lines two places must share to count as a copy
VENDORED = "third_party"  # others' files, kept as they ship (the XLA FFI headers)


def _matches(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _edges_with_type_checking() -> dict[str, dict[str, int]]:
    """module -> {first-party module it imports: line}, ``TYPE_CHECKING`` imports included."""
    modules = first_party_modules()
    graph = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        edges = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
                # ``from package import submodule`` is the submodule, as tests/test_layout.py reads it
                names = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                    for alias in node.names
                ]
            else:
                continue
            for name in names:
                while name and name not in modules:
                    name = name.rpartition(".")[0]
                if name and name != module:
                    edges.setdefault(name, node.lineno)
        graph[module] = edges
    return graph


@pytest.fixture(scope="module")
def graph():
    return _edges_with_type_checking()


def test_no_import_cycle_even_through_type_checking(graph):
    cycles = find_cycles(graph)
    assert cycles == [], "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_layer_rules(graph):
    broken = [
        f"{importer} imports {imported} (line {line}): {why}"
        for importer, edges in graph.items()
        for imported, line in edges.items()
        for (source, target, why) in RULES
        if _matches(importer, source) and _matches(imported, target)
    ]
    assert broken == []


def test_jaxgen_top_level_is_short():
    modules = sorted(
        path.name
        for path in (ROOT / "jaxgen").glob("*.py")
        if path.name not in ("__init__.py", "__main__.py")
    )
    assert len(modules) <= MAX_TOP_LEVEL_MODULES, modules


def _tracked(*folders: str) -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", *folders], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return [
        ROOT / name
        for name in listed
        if name.endswith(SOURCE_SUFFIXES) and VENDORED not in Path(name).parts
    ]


def test_no_file_grows_past_400_lines():
    too_long = {}
    for path in _tracked("jaxgen", "serving", "pallas_kernels", "tests"):
        if not path.exists():
            continue
        lines = len(path.read_text(encoding="utf-8", errors="replace").splitlines())
        name = path.relative_to(ROOT).as_posix()
        if lines > max(MAX_LINES, LONG_FILES.get(name, 0)):
            too_long[name] = lines
    assert too_long == {}, f"over {MAX_LINES} lines (split them): {too_long}"


def _code_lines(path: Path) -> list[str]:
    """The lines that count for copies: stripped, without blanks, comments, brackets alone and
    import statements."""
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text)
    imports = {
        line
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for line in range(node.lineno, node.end_lineno + 1)
    }
    return [
        line.strip()
        for number, line in enumerate(text.splitlines(), 1)
        if number not in imports
        and line.strip()
        and not line.strip().startswith("#")
        and not re.fullmatch(r"[\s()\[\]{}:,;.]*", line)
    ]


def test_no_copied_code_between_the_tpu_kernels():
    """No run of six code lines appears twice in pallas_kernels/tpu/ (float and 8-bit paths
    share their code)."""
    seen, copies = {}, []
    for path in _tracked("pallas_kernels/tpu"):
        lines = _code_lines(path)
        for start in range(len(lines) - RUN + 1):
            window = tuple(lines[start : start + RUN])
            place = f"{path.relative_to(ROOT).as_posix()}:{start}"
            if window in seen:
                copies.append(f"{seen[window]} ~ {place}")
            else:
                seen[window] = place
    assert copies == []
