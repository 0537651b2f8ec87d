"""Model definitions (Llama family) and weight conversion."""

from jaxgen.models.llama import LlamaForCausalLM

__all__ = ["LlamaForCausalLM"]
