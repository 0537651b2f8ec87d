"""Logprobs in the OpenAI shapes: the completions ``logprobs`` object (of generated tokens or an
echoed prompt) and vLLM's ``prompt_logprobs`` list; plus the request fields that ask for them and
``logit_bias``."""

from __future__ import annotations

from serving.generation import TokenTexts, finite, token_logprob, top_logprobs
from serving.validation import Fields, RequestError

MAX_PROMPT_LOGPROBS = 20


def prompt_logprobs_field(fields: Fields) -> int | None:
    """vLLM's ``prompt_logprobs``: how many top logprobs per prompt token (None: off)."""
    return fields.integer("prompt_logprobs", minimum=0, maximum=MAX_PROMPT_LOGPROBS)


def logit_bias_field(fields: Fields, vocab_size: int, max_entries: int) -> dict[int, float] | None:
    """OpenAI's ``logit_bias``: ``{"token id": bias}`` with biases in [-100, 100], at most
    ``max_entries`` of them (``--max-logit-bias``)."""
    value = fields.data.get("logit_bias")
    if value is None or value == {}:
        return None
    if not isinstance(value, dict):
        raise fields.error("logit_bias", "must be an object mapping token ids to biases")
    if len(value) > max_entries:
        raise RequestError(
            f"`logit_bias` has {len(value)} entries; at most {max_entries} (--max-logit-bias)",
            param="logit_bias",
        )
    bias = {}
    for key, number in value.items():
        token = int(key) if isinstance(key, str) and key.isascii() and key.isdigit() else None
        if token is None or token >= vocab_size:
            raise RequestError(
                f"`logit_bias` keys must be token ids in [0, {vocab_size}), got {key!r}"[:200],
                param="logit_bias",
            )
        if (
            not isinstance(number, (int, float))
            or isinstance(number, bool)
            or not -100 <= number <= 100
        ):
            raise RequestError(
                f"`logit_bias` values must be numbers in [-100, 100], got {number!r}"[:200],
                param="logit_bias",
            )
        bias[token] = float(number)
    return bias


def token_label(texts: TokenTexts, token_id: int, as_ids: bool) -> str:
    """A token as logprobs name it: its text, or vLLM's ``token_id:N`` with
    ``return_tokens_as_token_ids``."""
    return f"token_id:{token_id}" if as_ids else texts.text(token_id)


def completion_logprobs(
    texts: TokenTexts,
    token_ids: list[int],
    entries: list | None,
    count: int,
    *,
    offset: int = 0,
    as_ids: bool = False,
) -> dict:
    """The completions ``logprobs`` object (``tokens``, ``token_logprobs``, ``top_logprobs``,
    ``text_offset``) of ``token_ids``, whose text starts at character ``offset``. A position's
    ``top_logprobs`` holds the ``count`` most likely tokens and the chosen one (up to
    ``count + 1`` entries, as vLLM and OpenAI's legacy API); null for a token without an entry
    (an echoed prompt's first). ``as_ids``: tokens named ``token_id:N``."""
    tokens, token_logprobs, tops, offsets = [], [], [], []
    for token_id, entry in zip(token_ids, entries or [None] * len(token_ids), strict=True):
        chosen = token_logprob(entry, token_id)
        tokens.append(token_label(texts, token_id, as_ids))
        token_logprobs.append(chosen)
        top = None
        if entry:
            top = {token_label(texts, t, as_ids): lp for t, lp in top_logprobs(entry, count)}
            if token_id in entry:
                top.setdefault(token_label(texts, token_id, as_ids), chosen)
        tops.append(top)
        offsets.append(offset)
        offset += len(texts.text(token_id))
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": tops,
        "text_offset": offsets,
    }


def join_logprobs(first: dict, second: dict | None) -> dict:
    """Two completions ``logprobs`` objects, one after the other."""
    if second is None:
        return first
    return {key: first[key] + second[key] for key in first}


def vllm_prompt_logprobs(
    texts: TokenTexts, prompt_ids: list[int], entries: list | None, count: int
) -> list | None:
    """vLLM's ``prompt_logprobs``: per prompt token null (the first) or
    ``{"token id": {"logprob", "rank", "decoded_token"}}`` for the prompt token and the top
    ``count``. ``rank`` is the place among the top tokens; null for a prompt token outside them."""
    if entries is None:
        return None
    result = []
    for token_id, entry in zip(prompt_ids, entries, strict=True):
        if entry is None:
            result.append(None)
            continue
        ranked = [t for t, _ in top_logprobs(entry, len(entry))]
        outside = len(entry) > count  # the prompt token is not among the top ``count``
        if outside:
            ranked.remove(token_id)
        result.append(
            {
                str(t): {
                    "logprob": finite(lp),
                    "rank": None if outside and t == token_id else ranked.index(t) + 1,
                    "decoded_token": texts.text(t),
                }
                for t, lp in entry.items()
            }
        )
    return result
