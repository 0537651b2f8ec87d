"""Reasoning models: the thinking they write between tags, read apart from the answer.

- ``formats``: the parsers (``deepseek_r1``, ``deepseek_v3``, ``qwen3``; vLLM's
  ``--reasoning-parser`` names), their tags, and where a request's output starts (inside the
  reasoning, before it, or with none) from its prompt and ``chat_template_kwargs``;
- ``stream``: the splitter of output text into reasoning and content, whole or as it streams;
- ``grammar_gate``: a structured-output grammar that starts where the reasoning ends;
- ``token_texts``: the token texts the gate watches for tags.

``ReasoningRequest`` ties them together for one request (used by ``LLM.chat`` and the server).
"""

from __future__ import annotations

from jaxgen.reasoning.formats import (
    IN_REASONING,
    MAY_OPEN,
    NO_REASONING,
    REASONING_PARSERS,
    ReasoningFormat,
    get_reasoning_format,
)
from jaxgen.reasoning.grammar_gate import ReasoningGate, ReasoningSpan, gate_grammar
from jaxgen.reasoning.requests import ReasoningRequest
from jaxgen.reasoning.stream import ReasoningStream, Split, split_reasoning

__all__ = [
    "IN_REASONING",
    "MAY_OPEN",
    "NO_REASONING",
    "REASONING_PARSERS",
    "ReasoningFormat",
    "ReasoningGate",
    "ReasoningRequest",
    "ReasoningSpan",
    "ReasoningStream",
    "Split",
    "gate_grammar",
    "get_reasoning_format",
    "split_reasoning",
]
