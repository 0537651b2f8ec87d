"""What ``LLM.generate`` and its siblings take as prompts and per-prompt arguments, checked and
made lists: strings, token-id lists, vLLM's prompt dicts; one ``SamplingParams`` or one a
prompt. Plain Python."""

from __future__ import annotations

from collections.abc import Sequence as Seq

from jaxgen.sampling_params import SamplingParams


def normalize_prompts(prompts) -> list:
    """Strings and token-id lists, from a str, a token-id list, vLLM's prompt dicts
    (``{"prompt": str}``, ``{"prompt_token_ids": [...]}``: ``TextPrompt`` / ``TokensPrompt``),
    or a list of any of them."""
    if isinstance(prompts, (str, dict)):
        prompts = [prompts]
    if not isinstance(prompts, Seq) or not prompts:
        raise ValueError(
            "prompts must be a str, a non-empty list of str, or a list of token-id lists"
        )
    if all(isinstance(p, int) and not isinstance(p, bool) for p in prompts):
        return [list(prompts)]
    items = []
    for index, prompt in enumerate(prompts):
        if isinstance(prompt, dict):
            prompt = prompt_dict(prompt, index)
        if isinstance(prompt, Seq) and not isinstance(prompt, str):
            prompt = list(prompt)
            if not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
                prompt = None
        if not isinstance(prompt, (str, list)):
            raise ValueError(
                "prompts must be a str, a list of str, of token-id lists, or of prompt dicts "
                f"({{'prompt': str}} or {{'prompt_token_ids': [...]}}); prompts[{index}] is not"
            )
        items.append(prompt)
    return items


def prompt_dict(prompt: dict, index: int):
    """A ``TextPrompt`` / ``TokensPrompt`` dict's prompt: its token ids, else its text."""
    if "prompt_token_ids" in prompt:
        return prompt["prompt_token_ids"]
    if isinstance(prompt.get("prompt"), str):
        return prompt["prompt"]
    raise ValueError(f"prompts[{index}] must have 'prompt' (a str) or 'prompt_token_ids'")


def normalize_params(params, count: int) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * count
    if isinstance(params, SamplingParams):
        return [params] * count
    if isinstance(params, Seq) and all(isinstance(p, SamplingParams) for p in params):
        if len(params) != count:
            raise ValueError(f"sampling_params has {len(params)} entries for {count} prompts")
        return list(params)
    raise ValueError("sampling_params must be a SamplingParams or a list of them")


def per_prompt(value, count: int, name: str) -> list:
    """``value`` for each of ``count`` prompts: one for all, or a list of one each."""
    if not isinstance(value, (list, tuple)):
        return [value] * count
    if len(value) != count:
        raise ValueError(f"{name}: {len(value)} given for {count} prompts")
    return list(value)
