"""Decoding beyond one token a step: speculative decoding (``speculative/``), beam search."""
