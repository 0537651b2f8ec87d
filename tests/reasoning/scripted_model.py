"""A tiny model that thinks on cue: the SmolLM2 tokenizer with ``<think>`` and ``</think>`` as
added tokens (as Qwen3's and DeepSeek-R1's), a Qwen-style chat template with
``enable_thinking``, and a tiny random Llama whose greedy next token is a function of the current
one (a bigram "script"), so a prompt's last token starts a known chain of tokens.

The random checkpoint is made a bigram model by zeroing every block's output projections (the
residual stream stays the token's embedding), giving each scripted token a basis direction as
its embedding, and giving ``lm_head`` a row per successor: after a scripted token its successor
scores +8 x ``STRENGTH``, every other successor -8 x ``STRENGTH``, any other token 0. So when a
grammar's mask forbids the successor, the mask's own tokens win (by lowest id among equals),
never another scripted one.
"""

from __future__ import annotations

import os

from tests.family_models import save_tiny_model

THINK_TAGS = ["<think>", "</think>"]
# Qwen3's shape: <|im_start|>role\ncontent<|im_end|>\n; enable_thinking false closes an empty
# reasoning block in the prompt.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
    "{% endif %}{% endif %}"
)
STRENGTH = 4.0  # times sqrt(hidden): a scripted successor's logit


def reasoning_tokenizer(model_dir: str):
    """The tokenizer of ``model_dir`` with the tags as added (not special) tokens and the chat
    template."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    tokenizer.add_tokens(THINK_TAGS)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def one_token(tokenizer, text: str) -> int:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) == 1, (text, ids)
    return ids[0]


def save_scripted_model(path: str, tokenizer, chains: list[list[int]]) -> str:
    """A tiny Llama at ``path`` whose greedy output follows ``chains``: after token
    ``chain[i]`` comes ``chain[i + 1]`` (a token leads to one successor in all chains)."""
    import torch
    from safetensors.torch import load_file, save_file

    successors: dict[int, int] = {}
    for chain in chains:
        for token, following in zip(chain, chain[1:], strict=False):
            assert successors.setdefault(token, following) == following, (token, chains)
    save_tiny_model(path, tokenizer)
    weights = os.path.join(path, "model.safetensors")
    tensors = load_file(weights)
    for name, tensor in tensors.items():
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            tensor.zero_()
    # Each token on the script gets a basis direction of its own as its embedding (so, the
    # final norm's weight one, the last hidden state is sqrt(hidden) times it).
    sources = sorted(successors)
    embed = tensors["model.embed_tokens.weight"]  # [V, H]
    assert len(sources) <= embed.shape[1]
    for column, token in enumerate(sources):
        embed[token] = 0.0
        embed[token, column] = 1.0
    tensors["model.norm.weight"].fill_(1.0)
    head = torch.zeros_like(tensors["lm_head.weight"])  # [V, H]
    targets = sorted(set(successors.values()))
    columns = torch.arange(len(sources))
    head[torch.tensor(targets)[:, None], columns[None, :]] = -STRENGTH
    for column, token in enumerate(sources):
        head[successors[token], column] = STRENGTH
    tensors["lm_head.weight"] = head
    save_file(tensors, weights, metadata={"format": "pt"})
    return path


# The chats the tests send and what the scripted model answers them (greedy):
USER = [{"role": "user", "content": "What is 2 + 2?"}]
# A: a new turn: the model opens its reasoning with the added <think> token, closes it with the
# added </think> token, answers.
THINKING, ANSWER = " one two", " yes indeed"
# B: the assistant's message "Hmm" continued: reasoning without a start tag, closed by
# "</think>" spelled over three tokens, one step each.
CONTINUED = [*USER, {"role": "assistant", "content": "Hmm"}]
SPELLED_THINKING, SPELLED_ANSWER = " three four", " five"
# C: enable_thinking false (the template closes an empty reasoning block): an answer only.
PLAIN_ANSWER = " six seven"


def prompt_ids(tokenizer, messages, **template) -> list[int]:
    """The prompt the server and ``LLM.chat`` send for ``messages``."""
    from jaxgen.chat_template_options import ChatTemplateOptions
    from jaxgen.tool_calling import check_conversation, render_chat

    conversation = check_conversation(messages)
    options = ChatTemplateOptions.build(conversation, **template)
    text = render_chat(tokenizer, conversation, options=options)
    return tokenizer.encode(text, add_special_tokens=False)


def save_reasoning_model(path: str, base_dir: str):
    """The scripted reasoning model at ``path`` (the tokenizer of ``base_dir``, with the tags):
    returns ``(path, tokenizer)``."""
    tokenizer = reasoning_tokenizer(base_dir)
    think, end = (one_token(tokenizer, tag) for tag in THINK_TAGS)
    texts = (THINKING, ANSWER, SPELLED_THINKING, SPELLED_ANSWER, PLAIN_ANSWER)
    words = {text: [one_token(tokenizer, " " + word) for word in text.split()] for text in texts}
    spelled_end = [one_token(tokenizer, piece) for piece in ("</", "think", ">")]
    eos = tokenizer.eos_token_id
    entries = {
        "new": prompt_ids(tokenizer, USER)[-1],
        "continued": prompt_ids(
            tokenizer, CONTINUED, continue_final_message=True, add_generation_prompt=False
        )[-1],
        "plain": prompt_ids(tokenizer, USER, chat_template_kwargs={"enable_thinking": False})[-1],
    }
    assert len(set(entries.values())) == 3, entries
    chains = [
        [entries["new"], think, *words[THINKING], end, *words[ANSWER], eos],
        [
            entries["continued"],
            *words[SPELLED_THINKING],
            *spelled_end,
            *words[SPELLED_ANSWER],
            eos,
        ],
        [entries["plain"], *words[PLAIN_ANSWER], eos],
    ]
    return save_scripted_model(path, tokenizer, chains), tokenizer
