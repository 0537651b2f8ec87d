"""The native CPU kernels built at ``pip install``: ``installed_library`` takes the installed
library only while it matches (sources, flags, CPU, FFI API), and ``load_library`` prefers it,
falling back to the build on first use when it is absent, stale or does not load."""

from __future__ import annotations

import ctypes
import json
import shutil
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import jax
import pytest

from jaxgen.backends.cpu_kernels import build
from jaxgen.backends.cpu_kernels import compile as kernel_compile

REPO = Path(__file__).resolve().parents[2]
RUNTIME_FFI = kernel_compile.ffi_api_version(Path(jax.ffi.include_dir()))


def _install(directory: Path, **changes) -> Path:
    """Writes a library file and a manifest as ``build_installed`` does, with ``changes``."""
    directory.mkdir(parents=True, exist_ok=True)
    library = directory / kernel_compile.INSTALLED_LIBRARY
    library.write_bytes(b"\x7fELF")
    manifest = {**kernel_compile._manifest(), **changes}
    (directory / kernel_compile.INSTALLED_MANIFEST).write_text(json.dumps(manifest))
    return library


def test_vendored_headers_are_served_by_this_jaxlib():
    built = kernel_compile.ffi_api_version(kernel_compile.VENDORED_INCLUDE)
    assert built is not None and RUNTIME_FFI is not None
    assert built[0] == RUNTIME_FFI[0] and built[1] <= RUNTIME_FFI[1], (built, RUNTIME_FFI)


def test_matching_install_is_found(tmp_path):
    library = _install(tmp_path)
    assert kernel_compile.installed_library(RUNTIME_FFI, tmp_path) == library
    newer_jaxlib = (RUNTIME_FFI[0], RUNTIME_FFI[1] + 1)
    assert kernel_compile.installed_library(newer_jaxlib, tmp_path) == library


@pytest.mark.parametrize(
    "changes",
    [
        {"sources": "0" * 64},  # an editable checkout edited since its install
        {"flags": ["-O2"]},
        {"cpu": "another machine"},  # a wheel built elsewhere with -march=native
        {"ffi_api": [0, 99]},  # headers newer than the running jaxlib
        {"ffi_api": [1, 0]},
        {"ffi_api": []},
    ],
    ids=["sources", "flags", "cpu", "ffi-minor", "ffi-major", "ffi-missing"],
)
def test_stale_install_is_not_taken(tmp_path, changes):
    _install(tmp_path, **changes)
    assert kernel_compile.installed_library(RUNTIME_FFI, tmp_path) is None


def test_absent_or_broken_install_is_not_taken(tmp_path):
    assert kernel_compile.installed_library(RUNTIME_FFI, tmp_path) is None
    library = _install(tmp_path)
    library.unlink()
    assert kernel_compile.installed_library(RUNTIME_FFI, tmp_path) is None
    _install(tmp_path)
    (tmp_path / kernel_compile.INSTALLED_MANIFEST).write_text("{not json")
    assert kernel_compile.installed_library(RUNTIME_FFI, tmp_path) is None
    assert kernel_compile.installed_library(None, tmp_path) is None


@pytest.fixture
def fresh_loader(monkeypatch, tmp_path):
    """``_load_library`` uncached, loading records paths instead of opening them, the build
    on first use stubbed to a path in ``tmp_path``; the real library is reloaded after."""
    loaded, built = [], tmp_path / "cache" / "built.so"
    monkeypatch.delenv("JAXGEN_DISABLE_CPU_KERNELS", raising=False)
    monkeypatch.setattr(build, "_build", lambda compiler: built)
    monkeypatch.setattr(build, "find_compiler", lambda: "c++")

    def load(path):
        if "broken" in path:
            raise OSError(f"{path}: invalid ELF header")
        loaded.append(Path(path))
        return Path(path)

    monkeypatch.setattr(build.ctypes.cdll, "LoadLibrary", load)
    build._load_library.cache_clear()
    yield loaded, built
    build._load_library.cache_clear()


def test_loader_prefers_the_install(fresh_loader, monkeypatch, tmp_path):
    loaded, _ = fresh_loader
    installed = tmp_path / "installed.so"
    monkeypatch.setattr(build, "installed_library", lambda runtime_ffi: installed)
    assert build._load_library() == installed
    assert loaded == [installed]


def test_loader_builds_without_an_install(fresh_loader, monkeypatch):
    loaded, built = fresh_loader
    monkeypatch.setattr(build, "installed_library", lambda runtime_ffi: None)
    assert build._load_library() == built
    assert loaded == [built]


def test_loader_builds_when_the_install_does_not_load(fresh_loader, monkeypatch, tmp_path):
    loaded, built = fresh_loader
    monkeypatch.setattr(build, "installed_library", lambda runtime_ffi: tmp_path / "broken.so")
    with pytest.warns(UserWarning, match="installed native CPU kernels do not load"):
        assert build._load_library() == built
    assert loaded == [built]


def test_no_compiler_keeps_the_pure_jax_path(fresh_loader, monkeypatch):
    loaded, _ = fresh_loader
    monkeypatch.setattr(build, "installed_library", lambda runtime_ffi: None)
    monkeypatch.setattr(build, "find_compiler", lambda: None)
    with pytest.warns(UserWarning, match="no C\\+\\+ compiler"):
        assert build._load_library() is None
    assert loaded == []


@pytest.mark.slow
def test_wheel_ships_the_kernels(tmp_path):
    """``pip wheel`` (what ``pip install .`` runs) compiles the kernels into the wheel, and the
    library it holds is the one a run on this machine takes."""
    source = tmp_path / "src"
    source.mkdir()
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "_native", "*.pyc")
    shutil.copytree(REPO / "jaxgen", source / "jaxgen", ignore=ignore)
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    result = subprocess.run(
        [*command, "-w", str(tmp_path / "dist"), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("jaxgen-*.whl")
    assert not wheel.name.endswith("-none-any.whl"), wheel.name  # a platform wheel
    installed = tmp_path / "installed"
    with zipfile.ZipFile(wheel) as archive:
        for name in (kernel_compile.INSTALLED_LIBRARY, kernel_compile.INSTALLED_MANIFEST):
            installed.joinpath(name).parent.mkdir(parents=True, exist_ok=True)
            member = f"jaxgen/backends/cpu_kernels/_native/{name}"
            installed.joinpath(name).write_bytes(archive.read(member))
    library = kernel_compile.installed_library(RUNTIME_FFI, installed)
    assert library == installed / kernel_compile.INSTALLED_LIBRARY
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        handle = ctypes.CDLL(str(library))
    check = handle.JaxgenMatmulHasSimd
    check.restype = ctypes.c_bool
    assert isinstance(check(), bool)
