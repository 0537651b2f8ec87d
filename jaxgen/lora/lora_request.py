"""``LoRARequest``: which PEFT adapter a request runs with (vLLM's ``LoRARequest``)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class LoRARequest:
    """A PEFT LoRA adapter, named by the caller.

    Args:
        lora_name: the adapter's name (the OpenAI server's ``model`` for it).
        lora_int_id: a positive id, unique per adapter: requests with the same id share its
            device slot and prefix-cache entries.
        lora_path: a directory holding ``adapter_config.json`` and
            ``adapter_model.safetensors``.
    """

    lora_name: str
    lora_int_id: int
    lora_path: str

    def __post_init__(self):
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise ValueError(f"lora_name must be a non-empty string, got {self.lora_name!r}")
        if not isinstance(self.lora_int_id, int) or isinstance(self.lora_int_id, bool):
            raise ValueError(f"lora_int_id must be an integer >= 1, got {self.lora_int_id!r}")
        if self.lora_int_id < 1:
            raise ValueError(f"lora_int_id must be an integer >= 1, got {self.lora_int_id!r}")
        if not isinstance(self.lora_path, str) or not self.lora_path:
            raise ValueError(f"lora_path must be a directory path, got {self.lora_path!r}")
