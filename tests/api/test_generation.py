"""Generation on the real default model against HF transformers' greedy ``generate``."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from jaxgen import SamplingParams

PROMPTS = [
    "Explain, in a few sentences, why the sky appears blue during the day and red at sunset, "
    "and what role the atmosphere plays in scattering light of different wavelengths.",
    "Write a short story about a robot who learns to paint. The robot lives in a small town "
    "by the sea and spends its evenings watching the fishing boats come back to the harbour.",
    "List three practical tips for someone who is learning to program in Python for the very "
    "first time, and explain briefly why each of them matters for beginners who have never "
    "written a line of code before in their lives.",
]


def test_prompts_are_long(smollm2_tokenizer):
    assert all(len(smollm2_tokenizer.encode(p)) >= 32 for p in PROMPTS)


def test_greedy_matches_transformers_generate(smollm2_llm, smollm2_hf, smollm2_tokenizer):
    params = SamplingParams(max_tokens=24, temperature=0.0, logprobs=2)
    outs = smollm2_llm.generate(PROMPTS, params, use_tqdm=False)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        ids = smollm2_tokenizer.encode(prompt)
        assert out.prompt_token_ids == ids
        with torch.no_grad():
            ref = smollm2_hf.generate(
                torch.tensor([ids]),
                max_new_tokens=24,
                do_sample=False,
                output_scores=True,
                return_dict_in_generate=True,
                pad_token_id=2,
            )
        ref_tokens = ref.sequences[0, len(ids) :].tolist()
        assert out.token_ids == ref_tokens
        for step, (token, entry) in enumerate(zip(out.token_ids, out.logprobs, strict=True)):
            ref_logprobs = torch.log_softmax(ref.scores[step][0].float(), -1)
            assert abs(entry[token] - ref_logprobs[token].item()) <= 1e-3
            assert len(entry) >= 2 and all(math.isfinite(v) for v in entry.values())
            top = sorted(entry.items(), key=lambda kv: -kv[1])[0][0]
            assert top == token  # greedy: the sampled token is the most likely one
        assert out.finish_reason in ("length", "stop")


def test_text_equals_decode_of_tokens(smollm2_llm, smollm2_tokenizer):
    out = smollm2_llm.generate(
        PROMPTS[0], SamplingParams(max_tokens=20, temperature=0.0), use_tqdm=False
    )[0]
    assert out.text == smollm2_tokenizer.decode(out.token_ids, skip_special_tokens=True)


def test_chat_uses_template_and_stops_at_eos(smollm2_llm):
    out = smollm2_llm.chat(
        [{"role": "user", "content": "What is the capital of France?"}],
        SamplingParams(max_tokens=48, temperature=0.0),
        use_tqdm=False,
    )[0]
    assert "<|im_start|>assistant" in out.prompt
    assert "Paris" in out.text
    assert out.finish_reason == "stop"
    assert out.token_ids[-1] == 2  # <|im_end|> is the EOS token


def test_stats_report_pool(smollm2_llm):
    stats = smollm2_llm.stats()
    for key in (
        "kv_pages_total",
        "kv_pages_used",
        "kv_pages_peak",
        "kv_tokens_peak",
        "page_size",
        "num_running",
        "num_waiting",
        "preemptions",
        "steps",
        "compiles",
    ):
        assert key in stats
    assert stats["kv_pages_used"] == 0 and stats["num_running"] == 0


def test_bad_inputs_raise_value_errors(smollm2_llm):
    with pytest.raises(ValueError, match="prompts"):
        smollm2_llm.generate(123)
    with pytest.raises(ValueError, match="sampling_params"):
        smollm2_llm.generate(["a", "b"], [SamplingParams()])
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="prompt_token_ids"):
        smollm2_llm.generate([[1, 2, 10**9]], use_tqdm=False)
    with pytest.raises(ValueError, match="max_model_len"):
        smollm2_llm.generate([[1] * 600], use_tqdm=False)
    # The engine still works after rejected requests.
    out = smollm2_llm.generate("Hello", SamplingParams(max_tokens=3, temperature=0), use_tqdm=False)
    assert len(out[0].token_ids) == 3
    assert np.isfinite(len(out[0].text))


def test_vllm_prompt_dicts(smollm2_llm, smollm2_tokenizer):
    """vLLM's ``TextPrompt`` / ``TokensPrompt`` dicts, alone, listed, or mixed with strings and
    token-id lists, run as their text or tokens; a dict with neither is refused naming it."""
    params = SamplingParams(max_tokens=4, temperature=0)
    ids = smollm2_tokenizer.encode("The sea is", add_special_tokens=True)
    want = [o.token_ids for o in smollm2_llm.generate(["Hello", ids], params, use_tqdm=False)]
    mixed = [{"prompt": "Hello"}, {"prompt_token_ids": ids}]
    assert [o.token_ids for o in smollm2_llm.generate(mixed, params, use_tqdm=False)] == want
    alone = smollm2_llm.generate({"prompt_token_ids": ids}, params, use_tqdm=False)
    assert [o.token_ids for o in alone] == want[1:]
    assert alone[0].prompt_token_ids == ids
    assert [o.token_ids for o in smollm2_llm.generate(["Hello", {"prompt": "Hello"}], params)] == [
        want[0],
        want[0],
    ]
    with pytest.raises(ValueError, match=r"prompts\[1\]"):
        smollm2_llm.generate(["Hello", {"text": "Hello"}], params)
    with pytest.raises(ValueError, match=r"prompts\[0\]"):
        smollm2_llm.generate([{"prompt_token_ids": ["a"]}], params)
