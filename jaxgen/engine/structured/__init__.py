"""Constrained decoding on the host: llguidance matchers and their token masks, the threads filling them."""
