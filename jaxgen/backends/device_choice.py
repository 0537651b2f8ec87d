"""What ``attention_backend="auto"`` and ``dtype="auto"`` pick on a device, and which explicit
choices a device cannot run: pure functions of a :class:`DeviceDescription` (platform and, on
a CUDA GPU, compute capability), so every choice is tested on a host without the device.
:func:`local_device` describes jax's default device; ``jaxgen plan --target`` describes a
GPU or TPU from its datasheet (``jaxgen.planning.gpu_targets``) and asks the same functions.

Compute capability 8.0 (Ampere) is the line on a CUDA GPU, for two reasons:

- Triton, which compiles the ``pallas-gpu`` kernels, runs only from 8.0 (XLA's GPU compiler:
  "Triton support is only enabled for Ampere GPUs (compute capability 8.0) and up"). Below it
  attention goes through the ``reference`` backend: XLA's own fusions and cuBLAS, which
  compile for a T4 (sm_75) and a V100 (sm_70).
- bfloat16 arithmetic (bf16 tensor-core MMAs, cuBLAS's bf16 GEMMs) starts at 8.0 too; a T4 or
  V100 has float16 tensor cores only, and XLA would run a bfloat16 model in float32 emulation.
  ``auto`` takes float16 there, as vLLM does, except for the families whose activations
  overflow float16's range (Gemma 2 and 3: float32, as vLLM); an explicit ``bfloat16`` is a
  ``ValueError``. bfloat16 *storage* stays: the 8-bit KV pool's scales are bfloat16 bits, which
  XLA converts to float elementwise on any GPU.
"""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp

from jaxgen.families import family_of

# The first compute capability with Triton (pallas-gpu) and with bfloat16 arithmetic.
TRITON_MIN_CAPABILITY = (8, 0)
BFLOAT16_MIN_CAPABILITY = (8, 0)
_PLATFORMS = {"cuda": "gpu", "gpu": "gpu", "rocm": "gpu", "tpu": "tpu", "cpu": "cpu"}


@dataclasses.dataclass(frozen=True)
class DeviceDescription:
    """The facts about a device the automatic choices read.

    Attributes:
        platform: "cpu", "gpu" or "tpu" ("cuda" and "rocm" are read as "gpu").
        compute_capability: a CUDA GPU's (major, minor); None where unknown or not CUDA, which
            counts as a GPU with Triton and bfloat16 (every GPU this project has run on).
        name: what the device calls itself, for messages ("Tesla T4").
    """

    platform: str
    compute_capability: tuple[int, int] | None = None
    name: str = ""

    def __post_init__(self):
        # Another plugin's platform (none this project runs on) keeps its own name: no Pallas
        # kernels are chosen for it.
        platform = str(self.platform).lower()
        object.__setattr__(self, "platform", _PLATFORMS.get(platform, platform))

    @classmethod
    def from_jax_device(cls, device) -> DeviceDescription:
        """A jax device's description: its platform, and on CUDA its ``compute_capability``
        attribute ("7.5")."""
        capability = None
        if device.platform in ("gpu", "cuda"):
            capability = parse_compute_capability(getattr(device, "compute_capability", None))
        return cls(device.platform, capability, getattr(device, "device_kind", ""))

    @property
    def has_triton(self) -> bool:
        """Whether Triton (the pallas-gpu kernels) compiles for it: a GPU from 8.0."""
        return self.platform == "gpu" and not self._below(TRITON_MIN_CAPABILITY)

    @property
    def has_bfloat16(self) -> bool:
        """Whether it computes in bfloat16 natively (a CPU: XLA's bfloat16 runs, slowly)."""
        return not (self.platform == "gpu" and self._below(BFLOAT16_MIN_CAPABILITY))

    def _below(self, capability: tuple[int, int]) -> bool:
        return self.compute_capability is not None and self.compute_capability < capability

    def label(self) -> str:
        """ "Tesla T4 (compute capability 7.5)", for messages."""
        name = self.name or f"this {self.platform.upper()}"
        if self.compute_capability is None:
            return name
        return f"{name} (compute capability {'.'.join(map(str, self.compute_capability))})"


def parse_compute_capability(text) -> tuple[int, int] | None:
    """``"8.9"`` -> ``(8, 9)``; None for anything else (a ROCm device's ``gfx90a``, None)."""
    match = re.fullmatch(r"(\d+)\.(\d+)", str(text).strip()) if text is not None else None
    return (int(match.group(1)), int(match.group(2))) if match else None


def local_device() -> DeviceDescription:
    """jax's default device, described (a CUDA GPU with its compute capability)."""
    return DeviceDescription.from_jax_device(jax.devices()[0])


def auto_dtype(device: DeviceDescription, model_type: str | None = None):
    """The dtype ``dtype="auto"`` loads a model in on ``device``: float32 on a CPU, bfloat16 on
    a TPU and on a GPU from compute capability 8.0; float16 below it, float32 for a family
    float16 overflows (its ``float16_stable``, ``jaxgen.families``: vLLM refuses float16 for
    Gemma, "numerical instability"; ``model_type``: the config's)."""
    if device.platform == "cpu":
        return jnp.float32
    if device.has_bfloat16:
        return jnp.bfloat16
    if model_type is not None and not family_of(model_type).float16_stable:
        return jnp.float32
    return jnp.float16


def check_dtype(device: DeviceDescription, dtype) -> None:
    """``ValueError`` naming ``dtype`` for a dtype ``device`` cannot compute in (bfloat16
    below compute capability 8.0)."""
    if dtype is None or (isinstance(dtype, str) and dtype == "auto"):
        return
    try:
        bfloat16 = jnp.dtype(dtype) == jnp.bfloat16
    except TypeError:  # not a dtype: the loader's check names it
        return
    if bfloat16 and not device.has_bfloat16:
        raise ValueError(
            f"dtype='bfloat16': a {device.label()} has no bfloat16 arithmetic (it starts at "
            "compute capability 8.0; XLA would emulate it in float32); use dtype='float16', "
            "'float32' or 'auto' (float16 there)"
        )


def auto_attention_backend(
    device: DeviceDescription, *, dtype=jnp.float32, sharded: bool = False, cpu_kernels: bool
) -> str:
    """The backend ``attention_backend="auto"`` runs on ``device``: ``pallas-tpu`` on a TPU,
    ``pallas-gpu`` on a GPU with Triton and ``reference`` (XLA) on one without; on a CPU
    ``cpu`` for an unsharded float32 pool where the native kernels build (``cpu_kernels``),
    else ``reference``."""
    if device.platform == "tpu":
        return "pallas-tpu"
    if device.platform == "gpu":
        return "pallas-gpu" if device.has_triton else "reference"
    usable = jnp.dtype(dtype) == jnp.float32 and not sharded and cpu_kernels
    return "cpu" if usable else "reference"


def check_attention_backend(device: DeviceDescription, name: str) -> None:
    """``ValueError`` naming ``attention_backend`` for a backend whose kernels do not compile
    for ``device`` (``pallas-gpu``, or ``pallas`` on a GPU, below compute capability 8.0)."""
    pallas_gpu = name == "pallas-gpu" or (name == "pallas" and device.platform == "gpu")
    if pallas_gpu and device.platform == "gpu" and not device.has_triton:
        raise ValueError(
            f"attention_backend={name!r}: its Triton kernels compile only for compute capability "
            f"8.0 and up, not for a {device.label()}; use attention_backend='auto' (reference "
            "there: XLA's attention) or 'reference'"
        )


def check_device_support(device: DeviceDescription, *, dtype, attention_backend: str) -> None:
    """Both checks, for an engine about to load on ``device`` (before any weights load)."""
    check_dtype(device, dtype)
    check_attention_backend(device, attention_backend)
