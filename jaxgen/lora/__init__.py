"""Multi-LoRA: PEFT adapters per request, mixed in one step (``LoRARequest``; the device slots
``LoRASlots``; the engine's bookkeeping ``LoRAManager``; the layer hook is
``jaxgen.layers.lora``)."""

from jaxgen.lora.lora_manager import LoRAManager
from jaxgen.lora.lora_request import LoRARequest
from jaxgen.lora.lora_slots import LoRASlots, LoRAStacks, adapter_shardings
from jaxgen.lora.peft_adapter import PeftAdapter, read_peft_adapter

__all__ = [
    "LoRAManager",
    "LoRARequest",
    "LoRASlots",
    "LoRAStacks",
    "PeftAdapter",
    "adapter_shardings",
    "read_peft_adapter",
]
