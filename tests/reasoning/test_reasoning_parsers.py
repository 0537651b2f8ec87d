"""The reasoning parsers without a model: each format's tags and switch, where a prompt leaves
the output (inside the reasoning, before it, past it), whole outputs split into reasoning and
content, and streams whose pieces add up to the whole answer however the text is cut (a tag
split over pieces included); reasoning tokens counted from token texts."""

from __future__ import annotations

import random

import pytest

from jaxgen.reasoning import (
    IN_REASONING,
    MAY_OPEN,
    NO_REASONING,
    REASONING_PARSERS,
    ReasoningRequest,
    ReasoningStream,
    get_reasoning_format,
    split_reasoning,
)

QWEN_PROMPT = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_the_parsers_vllm_names():
    assert set(REASONING_PARSERS) >= {"deepseek_r1", "qwen3"}
    for name in REASONING_PARSERS:
        fmt = get_reasoning_format(name)
        assert (fmt.start, fmt.end) == ("<think>", "</think>")


def test_an_unknown_parser_is_a_value_error_naming_the_known_ones():
    with pytest.raises(ValueError, match="reasoning_parser") as caught:
        get_reasoning_format("deepseek")
    assert all(name in str(caught.value) for name in REASONING_PARSERS)
    with pytest.raises(ValueError, match="reasoning_parser"):
        ReasoningRequest.build("nope", QWEN_PROMPT)


@pytest.mark.parametrize(
    "parser,prompt,kwargs,state",
    [
        ("deepseek_r1", QWEN_PROMPT, None, IN_REASONING),  # the start tag optional
        ("deepseek_r1", QWEN_PROMPT + "<think>\n", None, IN_REASONING),  # the template opened it
        ("deepseek_r1", QWEN_PROMPT + "<think>\n\n</think>\n\n", None, NO_REASONING),  # closed
        ("deepseek_r1", QWEN_PROMPT, {"enable_thinking": False}, IN_REASONING),  # no switch
        ("qwen3", QWEN_PROMPT, None, MAY_OPEN),  # reasoning only if the output opens it
        ("qwen3", QWEN_PROMPT + "<think>\n", None, IN_REASONING),
        ("qwen3", QWEN_PROMPT, {"enable_thinking": False}, NO_REASONING),
        ("qwen3", QWEN_PROMPT, {"enable_thinking": True}, MAY_OPEN),
        ("qwen3", QWEN_PROMPT + "<think>\n\n</think>\n\n", None, NO_REASONING),
        ("deepseek_v3", QWEN_PROMPT, None, NO_REASONING),  # thinking off unless asked
        ("deepseek_v3", QWEN_PROMPT + "<think>", {"thinking": True}, IN_REASONING),
        ("deepseek_v3", QWEN_PROMPT, {"thinking": True}, IN_REASONING),
    ],
)
def test_where_the_output_starts(parser, prompt, kwargs, state):
    request = ReasoningRequest.build(parser, prompt, chat_template_kwargs=kwargs)
    assert request.state == state
    assert request.expects_reasoning == (state != NO_REASONING)


def test_an_earlier_turns_closed_reasoning_does_not_end_this_one():
    history = "<|im_start|>assistant\n<think>\nold\n</think>\n\nold answer<|im_end|>\n"
    prompt = history + "<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n"
    assert ReasoningRequest.build("deepseek_r1", prompt).state == IN_REASONING
    assert ReasoningRequest.build("qwen3", prompt).state == MAY_OPEN


# (where the output starts, output, reasoning, content)
CASES = [
    (IN_REASONING, "Let me see.\n</think>\n\nIt is 4.", "Let me see.\n", "\n\nIt is 4."),
    (IN_REASONING, "<think>\nLet me see.</think>It is 4.", "\nLet me see.", "It is 4."),
    (IN_REASONING, "\n<think>Hmm</think>4", "Hmm", "4"),  # the model's own tag, after space
    (IN_REASONING, "Still thinking when cut", "Still thinking when cut", None),
    (IN_REASONING, "Thinking</think>", "Thinking", None),
    (IN_REASONING, "</think>Only an answer", None, "Only an answer"),
    (IN_REASONING, "a <think> inside</think>b", "a <think> inside", "b"),
    (IN_REASONING, "cut at </thi", "cut at </thi", None),  # a partial tag at the end is text
    (MAY_OPEN, "<think>Hmm</think>4", "Hmm", "4"),
    (MAY_OPEN, "<think>cut", "cut", None),
    (MAY_OPEN, "No thinking here.", None, "No thinking here."),
    (MAY_OPEN, "4</think>5", None, "4</think>5"),  # no start: all content
    (MAY_OPEN, " <think>x</think>y", None, " <think>x</think>y"),  # the tag must come first
    (MAY_OPEN, "<thi", None, "<thi"),
    (MAY_OPEN, "", None, None),
    (NO_REASONING, "<think>x</think>y", None, "<think>x</think>y"),
]


@pytest.mark.parametrize("state,output,reasoning,content", CASES)
def test_whole_outputs(state, output, reasoning, content):
    assert split_reasoning(output, "<think>", "</think>", state) == (reasoning, content)


@pytest.mark.parametrize("state,output,reasoning,content", CASES)
def test_streams_add_up_to_the_whole_output_however_cut(state, output, reasoning, content):
    rng = random.Random(len(output))
    for trial in range(20):
        stream = ReasoningStream("<think>", "</think>", state)
        pieces, position = [], 0
        while position < len(output):
            size = 1 if trial == 0 else rng.randint(1, 6)  # one character at a time, then random
            pieces.append(stream.feed(output[position : position + size]))
            position += size
        pieces.append(stream.finish())
        assert ("".join(p.reasoning for p in pieces) or None) == reasoning
        assert ("".join(p.content for p in pieces) or None) == content
        assert (stream.reasoning, stream.content) == (reasoning, content)


def test_a_partial_tag_is_held_until_settled():
    stream = ReasoningStream("<think>", "</think>", IN_REASONING)
    first, second = stream.feed("ab</"), stream.feed("thi")
    assert (first.reasoning, second.reasoning) == ("ab", "") and not stream.ended
    split = stream.feed("nk>c")
    assert (split.reasoning, split.content) == ("", "c") and stream.ended
    stream = ReasoningStream("<think>", "</think>", IN_REASONING)
    stream.feed("ab</")
    split = stream.feed("b>")  # not the tag after all: sent as reasoning
    assert split.reasoning == "</b>" and not stream.ended


def test_the_start_of_a_may_open_output_is_held_until_it_is_or_is_not_the_tag():
    stream = ReasoningStream("<think>", "</think>", MAY_OPEN)
    first, second = stream.feed("<th"), stream.feed("ink>")
    assert (first.content, first.reasoning, second.content, second.reasoning) == ("",) * 4
    assert stream.feed("x").reasoning == "x" and stream.reasoning_start == len("<think>")
    stream = ReasoningStream("<think>", "</think>", MAY_OPEN)
    stream.feed("<th")
    assert stream.feed("e end").content == "<the end"


@pytest.mark.parametrize(
    "state,texts,count",
    [
        # one added token per tag: the tags are not counted
        (MAY_OPEN, ["<think>", "a", "b", "c", "</think>", "x", "y"], 3),
        (IN_REASONING, ["a", "b", "</think>", "x"], 2),
        (IN_REASONING, ["a", "b", "c"], 3),  # cut inside the reasoning
        # tags spelled over several tokens
        (IN_REASONING, ["a", "b", "</", "think", ">", "x"], 2),
        (MAY_OPEN, ["<", "think", ">", "a", "</", "think", ">\n", "x"], 1),
        # a step's text on its last token: the tokens before it share its place
        (IN_REASONING, ["a", "", "b", "", "</think>x"], 4),
        (MAY_OPEN, ["No", " thinking"], 0),
        (NO_REASONING, ["<think>", "a", "</think>"], 0),
    ],
)
def test_reasoning_tokens(state, texts, count):
    request = ReasoningRequest(get_reasoning_format("deepseek_r1"), state)
    assert request.count_tokens(texts) == count


def test_the_grammar_span_follows_where_the_output_starts():
    r1 = ReasoningRequest.build("deepseek_r1", QWEN_PROMPT)
    assert (r1.span.start, r1.span.end) == (None, "</think>")
    qwen = ReasoningRequest.build("qwen3", QWEN_PROMPT)
    assert (qwen.span.start, qwen.span.end) == ("<think>", "</think>")
    off = ReasoningRequest.build("qwen3", QWEN_PROMPT, chat_template_kwargs={"enable_thinking": 0})
    assert off.span is None
