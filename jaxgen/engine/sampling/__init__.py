"""Sampling on the device: the sampler, its tensors and shapes, cut-offs, logit processors, prompt logprobs."""
