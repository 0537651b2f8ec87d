"""Compiles the native kernels under ``native/`` into one shared library: the flags, the
sources' digest and the compiler commands, shared by ``pip install`` (``setup.py``, which loads
this file by path: it imports neither jax nor jaxgen) and the build on first use (``build``).

``pip install`` compiles against the vendored XLA FFI headers (``native/third_party``: jaxlib is
not installed yet) into ``_native/``, beside a manifest of what it was built from: the sources,
the flags, this CPU's instruction sets (``-march=native``) and the FFI API version of the
headers. ``installed_library`` returns that library only where all of these still hold.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

PACKAGE_DIR = Path(__file__).parent
SOURCE_DIR = PACKAGE_DIR / "native"
VENDORED_INCLUDE = SOURCE_DIR / "third_party"
INSTALLED_DIR = PACKAGE_DIR / "_native"
INSTALLED_LIBRARY = "jaxgen_cpu_kernels.so"
INSTALLED_MANIFEST = "jaxgen_cpu_kernels.json"
# Reassociation lets the compiler vectorise reductions; nothing else is relaxed.
CXX_FLAGS = (
    "-O3",
    "-march=native",
    "-std=c++17",
    "-shared",
    "-fPIC",
    "-pthread",
    "-fno-math-errno",
    "-fassociative-math",
    "-fno-signed-zeros",
    "-fno-trapping-math",
)


def find_compiler() -> str | None:
    """``$CXX``, else ``g++`` or ``c++`` on the PATH; None without one."""
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def source_digest() -> str:
    """SHA-256 over every ``native/*.cc`` and ``native/*.h`` (names and contents)."""
    digest = hashlib.sha256()
    for path in [*sorted(SOURCE_DIR.glob("*.cc")), *sorted(SOURCE_DIR.glob("*.h"))]:
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()


def cpu_signature() -> str:
    """What ``-march=native`` compiles for: a digest of this CPU's instruction-set flags
    (``/proc/cpuinfo``), or its architecture and name where there is no such file."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith(("flags", "Features")):
                    flags = " ".join(sorted(line.partition(":")[2].split()))
                    return hashlib.sha256(flags.encode()).hexdigest()[:16]
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()}"


def ffi_api_version(include_dir: Path) -> tuple[int, int] | None:
    """The XLA FFI API (major, minor) of the headers under ``include_dir``; None if unreadable."""
    try:
        text = (include_dir / "xla" / "ffi" / "api" / "c_api.h").read_text()
    except OSError:
        return None
    major = re.search(r"#define XLA_FFI_API_MAJOR (\d+)", text)
    minor = re.search(r"#define XLA_FFI_API_MINOR (\d+)", text)
    if major is None or minor is None:
        return None
    return int(major.group(1)), int(minor.group(1))


def compile_library(compiler: str, include_dir: Path, library: Path) -> None:
    """Compiles every ``native/*.cc`` (one process per file, at once) against the XLA FFI headers
    under ``include_dir`` and links them into ``library``, replaced atomically (concurrent
    builders never see half a file). Raises ``CalledProcessError`` or ``OSError``."""
    sources = sorted(SOURCE_DIR.glob("*.cc"))
    library.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=library.parent) as tmp:
        partial = Path(tmp) / library.name
        include = [f"-I{include_dir}", f"-I{SOURCE_DIR}"]
        objects = [Path(tmp) / f"{source.stem}.o" for source in sources]
        _compile_at_once(
            [
                [compiler, *CXX_FLAGS, *include, "-c", str(source), "-o", str(obj)]
                for source, obj in zip(sources, objects, strict=True)
            ]
        )
        command = [compiler, *CXX_FLAGS, *map(str, objects), "-o", str(partial)]
        subprocess.run(command, check=True, capture_output=True, text=True)
        os.replace(partial, library)


def _compile_at_once(commands: list[list[str]]) -> None:
    """Runs the compiler commands (one per translation unit) concurrently: one process per unit
    uses every core. Raises ``CalledProcessError`` for the first that fails (after all ended)."""
    processes = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for command in commands
    ]
    failures = []
    for process in processes:
        out, err = process.communicate()
        if process.returncode != 0:
            failures.append(
                subprocess.CalledProcessError(process.returncode, process.args, out, err)
            )
    if failures:
        raise failures[0]


def _manifest() -> dict:
    return {
        "sources": source_digest(),
        "flags": list(CXX_FLAGS),
        "cpu": cpu_signature(),
        "ffi_api": list(ffi_api_version(VENDORED_INCLUDE) or ()),
    }


def build_installed(compiler: str, directory: Path = INSTALLED_DIR) -> Path:
    """What ``pip install`` runs: compiles the library against the vendored FFI headers into
    ``directory`` and writes its manifest beside it. Returns the library's path."""
    library = directory / INSTALLED_LIBRARY
    compile_library(compiler, VENDORED_INCLUDE, library)
    partial = directory / f".{INSTALLED_MANIFEST}.{os.getpid()}"
    partial.write_text(json.dumps(_manifest(), indent=1))
    os.replace(partial, directory / INSTALLED_MANIFEST)
    return library


def installed_library(
    runtime_ffi_api: tuple[int, int] | None, directory: Path = INSTALLED_DIR
) -> Path | None:
    """The library ``pip install`` built, if it is there and still holds: built from these
    sources with these flags for a CPU with this one's instruction sets, and its FFI API served
    by the running jaxlib's (``runtime_ffi_api``: the same major version, a minor version at
    least the library's). None otherwise: absent, stale (an editable checkout edited since its
    install), built on another machine, or for a newer jaxlib."""
    library = directory / INSTALLED_LIBRARY
    try:
        manifest = json.loads((directory / INSTALLED_MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if not library.is_file() or not isinstance(manifest, dict):
        return None
    expected = _manifest()
    if any(manifest.get(key) != expected[key] for key in ("sources", "flags", "cpu")):
        return None
    built = manifest.get("ffi_api")
    if runtime_ffi_api is None or not isinstance(built, list) or len(built) != 2:
        return None
    if built[0] != runtime_ffi_api[0] or built[1] > runtime_ffi_api[1]:
        return None
    return library
