"""The grammar gate on a real tokenizer and llguidance matcher: every token allowed and the
grammar fed nothing inside the reasoning; the grammar's own mask from the end tag on (one added
token, or spelled over several tokens, with text after it in the same token); a start tag that
may open the output (Qwen3); rollback, draft validation and copies, as the engine uses them."""

from __future__ import annotations

import numpy as np
import pytest

from jaxgen.engine.structured.grammar_masks import GrammarCompiler, GrammarMasks
from jaxgen.reasoning import ReasoningGate, ReasoningSpan, gate_grammar
from jaxgen.reasoning.token_texts import token_texts
from jaxgen.structured_outputs import StructuredOutputsParams
from tests.reasoning.scripted_model import one_token

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}},
    "required": ["answer"],
    "additionalProperties": False,
}
END = ReasoningSpan(end="</think>")
MAY_OPEN = ReasoningSpan(end="</think>", start="<think>")


@pytest.fixture(scope="module")
def tokenizer(reasoning_model):
    return reasoning_model[1]


@pytest.fixture(scope="module")
def compiler(tokenizer):
    return GrammarCompiler(tokenizer, len(tokenizer), [tokenizer.eos_token_id])


def compiled(compiler, **constraint):
    return compiler.compile(StructuredOutputsParams(**(constraint or {"json": SCHEMA})))


def mask_of(compiler, matcher) -> np.ndarray:
    mask = np.zeros(compiler.mask_width, np.int32)
    matcher.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
    return mask


def allowed(mask: np.ndarray, token: int) -> bool:
    return bool((int(mask.view(np.uint32)[token >> 5]) >> (token & 31)) & 1)


def first_allowed(mask: np.ndarray) -> int:
    bits = np.unpackbits(mask.view(np.uint8), bitorder="little")
    return int(np.flatnonzero(bits)[0])


def ids(tokenizer, *texts) -> list[int]:
    return [one_token(tokenizer, text) for text in texts]


def test_inside_the_reasoning_every_token_is_allowed_and_the_grammar_waits(compiler, tokenizer):
    pristine = compiled(compiler)
    gate = gate_grammar(pristine, END, tokenizer).deep_copy()
    for token in ids(tokenizer, "Hello", " world", ".", "<think>"):  # no JSON at all
        assert (mask_of(compiler, gate) == -1).all()
        assert gate.consume_token(token) and not gate.is_stopped()
    assert gate.consume_token(one_token(tokenizer, "</think>"))  # the added end tag
    np.testing.assert_array_equal(mask_of(compiler, gate), mask_of(compiler, pristine))
    hello = one_token(tokenizer, "Hello")
    assert not allowed(mask_of(compiler, gate), hello)
    assert not gate.consume_token(hello) and gate.is_error()


def test_an_end_tag_spelled_over_several_tokens_closes_the_reasoning(compiler, tokenizer):
    pristine = compiled(compiler)
    gate = gate_grammar(pristine, END, tokenizer).deep_copy()
    spelled = ids(tokenizer, "</", "think", ">")
    for token in [one_token(tokenizer, " so"), *spelled[:2]]:
        assert gate.consume_token(token)
        assert (mask_of(compiler, gate) == -1).all()
    assert gate.consume_token(spelled[2])
    np.testing.assert_array_equal(mask_of(compiler, gate), mask_of(compiler, pristine))
    # A false start (</b>) is thinking all the same.
    other = gate_grammar(pristine, END, tokenizer).deep_copy()
    for token in ids(tokenizer, "</", "b", ">"):
        assert other.consume_token(token)
    assert (mask_of(compiler, other) == -1).all()


def test_text_after_the_tag_in_the_same_token_is_the_answers(compiler, tokenizer):
    """A token that completes the tag and goes on: its rest is fed to the grammar (re-tokenised,
    leading whitespace left out), or refused like any token the grammar refuses."""
    texts = {token: tokenizer.decode([token]) for token in range(len(tokenizer))}
    tails = [
        t
        for t, text in texts.items()
        if text.startswith(">")
        and text[1:]
        and not any(c.isspace() or c.isdigit() or c == "<" for c in text[1:])
    ]
    assert tails, "a token of '>' and more punctuation"
    token = tails[0]
    tail = texts[token][1:].strip()
    head = ids(tokenizer, "</", "think")
    accepting = compiled(compiler, regex=tail + "[a-z ]*")
    gate = gate_grammar(accepting, END, tokenizer).deep_copy()
    assert all(gate.consume_token(t) for t in [*head, token])
    probe = accepting.deep_copy()
    assert probe.consume_tokens(tokenizer.encode(tail, add_special_tokens=False))
    np.testing.assert_array_equal(mask_of(compiler, gate), mask_of(compiler, probe))
    refusing = gate_grammar(compiled(compiler, regex="[0-9]+"), END, tokenizer).deep_copy()
    assert all(refusing.consume_token(t) for t in head)
    assert not refusing.consume_token(token)
    assert refusing.is_error() and "after '</think>'" in refusing.get_error()


def test_a_start_tag_may_open_the_output(compiler, tokenizer):
    pristine = compiled(compiler)
    think = one_token(tokenizer, "<think>")
    first = mask_of(compiler, gate_grammar(pristine, MAY_OPEN, tokenizer))
    grammar_first = mask_of(compiler, pristine)
    # The tag is an added token: that token opens it ("<" does not: it would commit to the tag).
    assert {think, one_token(tokenizer, "<")} <= {
        t for t, _ in token_texts(tokenizer).pieces("<think>")[0]
    }
    assert not allowed(grammar_first, think)
    np.testing.assert_array_equal(first & ~grammar_first, _only(compiler, [think]))
    # Opened: thinking, then the grammar.
    gate = gate_grammar(pristine, MAY_OPEN, tokenizer).deep_copy()
    assert gate.consume_token(think) and (mask_of(compiler, gate) == -1).all()
    assert gate.consume_token(one_token(tokenizer, "</think>"))
    np.testing.assert_array_equal(mask_of(compiler, gate), grammar_first)
    # Not opened: the grammar from the first token.
    gate = gate_grammar(pristine, MAY_OPEN, tokenizer).deep_copy()
    brace = first_allowed(grammar_first)
    assert gate.consume_token(brace)
    probe = pristine.deep_copy()
    probe.consume_token(brace)
    np.testing.assert_array_equal(mask_of(compiler, gate), mask_of(compiler, probe))


def test_a_start_tag_spelled_over_tokens_commits_to_it(tiny_model_dir):
    """A tokenizer without the tags as tokens (the tiny model's own): the tokens of the tag's
    first characters may open it, and the next ones may only go on writing it."""
    import transformers

    plain = transformers.AutoTokenizer.from_pretrained(tiny_model_dir)
    compiler = GrammarCompiler(plain, len(plain), [plain.eos_token_id])
    gate = gate_grammar(compiled(compiler), MAY_OPEN, plain).deep_copy()
    lt, think, gt = ids(plain, "<", "think", ">")
    assert allowed(mask_of(compiler, gate), lt)
    assert gate.consume_token(lt)
    after = mask_of(compiler, gate)
    assert allowed(after, think) and not allowed(after, one_token(plain, "{"))
    assert gate.consume_token(think) and gate.consume_token(gt)
    assert (mask_of(compiler, gate) == -1).all()
    assert gate.consume_token(one_token(plain, " so"))
    assert gate.consume_token(ids(plain, "</")[0]) and gate.consume_token(think)
    assert gate.consume_token(gt) and not (mask_of(compiler, gate) == -1).all()


def _only(compiler, tokens: list[int]) -> np.ndarray:
    mask = np.zeros(compiler.mask_width, np.uint32)
    for token in tokens:
        mask[token >> 5] |= np.uint32(1 << (token & 31))
    return mask.view(np.int32)


def test_rollback_and_validation_cross_the_end_tag(compiler, tokenizer):
    pristine = compiled(compiler)
    gate = gate_grammar(pristine, END, tokenizer).deep_copy()
    grammar_first = mask_of(compiler, pristine)
    brace = first_allowed(grammar_first)
    draft = [one_token(tokenizer, "Hello"), one_token(tokenizer, "</think>"), brace]
    assert gate.validate_tokens(draft) == 3
    assert gate.validate_tokens([*draft[:2], one_token(tokenizer, "Hello")]) == 2
    assert (mask_of(compiler, gate) == -1).all()  # validating moved nothing
    assert all(gate.consume_token(t) for t in draft)
    assert gate.rollback(2)
    assert (mask_of(compiler, gate) == -1).all()
    assert gate.consume_token(draft[1])
    np.testing.assert_array_equal(mask_of(compiler, gate), grammar_first)
    assert not gate.rollback(1000)


def test_the_engines_masks_take_the_gate(compiler, tokenizer):
    """``GrammarMasks`` copies a gate per sequence and drafts through it as through a matcher."""
    masks = GrammarMasks(compiler)
    pristine = compiled(compiler)
    masks.add([7, 8], gate_grammar(pristine, END, tokenizer))
    assert all(isinstance(m, ReasoningGate) for m in masks.matchers.values())
    end = one_token(tokenizer, "</think>")
    rows = masks.draft_masks(7, [one_token(tokenizer, "Hi"), end])
    assert rows.shape == (3, compiler.mask_width)
    assert (rows[:2] == -1).all()
    np.testing.assert_array_equal(rows[2], mask_of(compiler, pristine))
    assert masks.advance(7, end) is None  # seq 7 leaves its reasoning; 8 is still inside
    assert (mask_of(compiler, masks.matchers[8]) == -1).all()
    assert not (mask_of(compiler, masks.matchers[7]) == -1).all()
    assert gate_grammar(pristine, None, tokenizer) is pristine
