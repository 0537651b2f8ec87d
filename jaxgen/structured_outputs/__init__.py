"""Structured outputs: the request's constraint (``StructuredOutputsParams``), strict JSON
schemas, and the limits a constraint is checked against before it is compiled (the
grammar masks that compile it are the engine's: ``jaxgen.engine.structured.grammar_masks``)."""

from jaxgen.structured_outputs.params import StructuredOutputsParams

__all__ = ["StructuredOutputsParams"]
