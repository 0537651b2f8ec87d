"""Model definitions (every supported family through one decoder stack) and weight conversion."""

from jaxgen.models.causal_lm import BLOCKS, CausalLM

LlamaForCausalLM = CausalLM  # the stack's name before it served other families

__all__ = ["BLOCKS", "CausalLM", "LlamaForCausalLM"]
