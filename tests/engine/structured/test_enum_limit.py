"""``max_enum_values`` refuses only what costs (50,000 by default,
``benchmarks/enum_limit.py``), its message gives a schema's real count, and a choice compiles as
one lexeme, as an enum does, so thousands of choices compile in milliseconds."""

from __future__ import annotations

import pytest

from jaxgen.engine.structured.grammar_masks import GrammarCompiler
from jaxgen.structured_outputs import StructuredOutputsParams
from jaxgen.structured_outputs.limits import (
    ConstraintTooLarge,
    StructuredOutputLimits,
    check_constraint,
)

# The issue's schema: 20 enums, 1,061 values in all (past the former limit of 1,000).
ENUMS = {
    "type": "object",
    "properties": {
        f"field{i}": {"enum": [f"v{i}_{j}" for j in range(53 + (i == 0))]} for i in range(20)
    },
}


@pytest.fixture(scope="module")
def compiler(smollm2_tokenizer):
    tokenizer = smollm2_tokenizer
    return GrammarCompiler(tokenizer, len(tokenizer), [tokenizer.eos_token_id])


def test_message_counts_the_whole_schema():
    params = StructuredOutputsParams(json=ENUMS)
    with pytest.raises(ConstraintTooLarge, match=r"^json: 1061 enum values or choices; at most"):
        check_constraint(params, StructuredOutputLimits(max_enum_values=1000))
    check_constraint(params, StructuredOutputLimits())


def test_the_schema_of_the_issue_compiles(compiler):
    matcher = compiler.compile(StructuredOutputsParams(json=ENUMS)).deep_copy()
    text = '{"field0":"v0_53","field1":"v1_0"}'
    for token in compiler.tokenizer.encode(text, add_special_tokens=False):
        assert matcher.consume_token(token)


def test_thousands_of_choices_are_one_lexeme(compiler):
    choices = [f"option{i}" for i in range(5000)]  # over llguidance's 2,000 items in a row
    pristine = compiler.compile(StructuredOutputsParams(choice=choices))
    matcher = pristine.deep_copy()
    for token in compiler.tokenizer.encode("option4321", add_special_tokens=False):
        assert matcher.consume_token(token)
    assert matcher.is_accepting()
    refused = compiler.tokenizer.encode("option5000", add_special_tokens=False)
    assert pristine.validate_tokens(refused) < len(refused)
