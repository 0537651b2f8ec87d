"""Model definitions (every supported family through one decoder stack) and weight conversion."""

from jaxgen.models.causal_lm import FAMILY_BLOCKS, CausalLM

LlamaForCausalLM = CausalLM  # the stack's name before it served other families

__all__ = ["FAMILY_BLOCKS", "CausalLM", "LlamaForCausalLM"]
