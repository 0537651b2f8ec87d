"""Beam search (``LLM.beam_search``) on a tiny random Llama (fp32): the same beams and scores as
a plain reference beam search over transformers' full-forward logits and as transformers' own
``generate(num_beams=k)`` (where the two are defined to agree), and beams sharing pages."""

from __future__ import annotations

import pytest

from jaxgen import LLM, BeamSearchParams
from jaxgen.beam_search_params import beam_search_score

PAGE = 8
SMALL = dict(
    max_model_len=128,
    max_rolling_batch_prefill_tokens=64,
    max_rolling_batch_size=16,
    page_size=PAGE,
)


@pytest.fixture(scope="module")
def llm(tiny_loaded):
    return LLM(tiny_loaded, **SMALL)


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    import torch
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, dtype=torch.float32
    ).eval()


def reference_beam_search(model, prompt, width, max_tokens, length_penalty, eos, ignore_eos):
    """vLLM's beam search, each step a full forward of every beam's whole sequence."""
    import torch

    def score(tokens, cum):
        return beam_search_score(tokens, cum, eos, length_penalty)

    beams, completed = [(list(prompt), 0.0)], []
    for _ in range(max_tokens):
        candidates = []
        for tokens, cum in beams:
            with torch.no_grad():
                logits = model(torch.tensor([tokens])).logits[0, -1]
            logprobs = torch.log_softmax(logits.float(), -1)
            top = torch.topk(logprobs, 2 * width)
            for logprob, token in zip(top.values.tolist(), top.indices.tolist(), strict=True):
                candidate = (tokens + [token], cum + logprob)
                if token in eos and not ignore_eos:
                    completed.append(candidate)
                else:
                    candidates.append(candidate)
        beams = sorted(candidates, key=lambda c: score(*c), reverse=True)[:width]
    completed += beams
    return sorted(completed, key=lambda c: score(*c), reverse=True)[:width]


@pytest.mark.parametrize(
    "width,length_penalty,ignore_eos", [(2, 1.0, False), (4, 0.5, True), (8, 2.0, False)]
)
def test_matches_reference_beam_search(
    llm, hf_model, smollm2_tokenizer, width, length_penalty, ignore_eos
):
    prompts = [
        smollm2_tokenizer.encode("The quick brown fox jumps over", add_special_tokens=True),
        smollm2_tokenizer.encode(
            "Once upon a time, in a land far away, there", add_special_tokens=True
        ),
    ]
    prompts = prompts[:1] if width == 8 else prompts  # 8 beams: one prompt is enough
    params = BeamSearchParams(
        beam_width=width, max_tokens=5, length_penalty=length_penalty, ignore_eos=ignore_eos
    )
    outputs = llm.beam_search(prompts, params)
    eos = set(llm.loaded.config.eos_token_ids)
    assert len(outputs) == len(prompts)
    for prompt, output in zip(prompts, outputs, strict=True):
        expected = reference_beam_search(
            hf_model, prompt, width, 5, length_penalty, eos, ignore_eos
        )
        assert [s.tokens for s in output.sequences] == [tokens for tokens, _ in expected]
        for sequence, (_, cum) in zip(output.sequences, expected, strict=True):
            assert sequence.cum_logprob == pytest.approx(cum, abs=1e-4)
            assert sequence.tokens[: len(prompt)] == prompt
            assert len(sequence.logprobs) == len(sequence.output_token_ids)
            assert sequence.text == llm.get_tokenizer().decode(sequence.tokens)
    assert not llm.engine.has_unfinished()
    assert llm.engine.scheduler.allocator.num_used_pages == 0  # every beam's pages returned


def hf_beam_search(model, prompt, width, max_tokens, length_penalty):
    """transformers' own beam search (``generate(num_beams=width)``), ``width`` sequences best
    first and their ``sequences_scores``. ``eos_token_id=[-1]`` (an id no token has) is
    ``ignore_eos``: EOS an ordinary token, so every beam runs ``max_tokens`` tokens."""
    import torch

    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=False,
            num_beams=width,
            num_return_sequences=width,
            length_penalty=length_penalty,
            max_new_tokens=max_tokens,
            eos_token_id=[-1],
            pad_token_id=0,
            output_scores=True,
            return_dict_in_generate=True,
        )
    return out.sequences.tolist(), out.sequences_scores.tolist()


def check_matches_transformers(llm, model, prompt, width, max_tokens, length_penalty):
    """``LLM.beam_search(..., ignore_eos=True)`` against ``hf_beam_search``: where no beam ends
    early the two are defined to agree. Each step both keep the ``width`` candidates of the
    highest cumulative logprob (all of one length), so the sequences and their order are the
    same; the scores differ only in the length each divides by: transformers'
    ``sequences_scores`` is ``cum_logprob / generated ** lp``, jaxgen's (vLLM's)
    ``beam_search_score`` is ``cum_logprob / (prompt + generated) ** lp``."""
    params = BeamSearchParams(
        beam_width=width, max_tokens=max_tokens, length_penalty=length_penalty, ignore_eos=True
    )
    (output,) = llm.beam_search([prompt], params)
    eos = set(llm.loaded.config.eos_token_ids)
    sequences, scores = hf_beam_search(model, prompt, width, max_tokens, length_penalty)
    assert [s.tokens for s in output.sequences] == sequences
    for sequence, hf_score in zip(output.sequences, scores, strict=True):
        generated = len(sequence.output_token_ids)
        assert generated == max_tokens
        assert sequence.cum_logprob / generated**length_penalty == pytest.approx(hf_score, abs=1e-4)
        score = beam_search_score(sequence.tokens, sequence.cum_logprob, eos, length_penalty)
        if sequence.tokens[-1] not in eos:  # (a final EOS is not counted in jaxgen's length)
            ratio = (len(sequence.tokens) / generated) ** length_penalty
            assert score * ratio == pytest.approx(hf_score, abs=1e-4)


@pytest.mark.parametrize("length_penalty", [1.0, 2.0])
@pytest.mark.parametrize("width", [2, 4, 8])
def test_matches_transformers_generate(llm, hf_model, smollm2_tokenizer, width, length_penalty):
    prompt = smollm2_tokenizer.encode("The quick brown fox jumps over", add_special_tokens=True)
    check_matches_transformers(llm, hf_model, prompt, width, 5, length_penalty)


@pytest.mark.slow
def test_default_model_matches_transformers_generate(smollm2_loaded, smollm2_hf, smollm2_tokenizer):
    """The same on the default model (fp32; transformers' weights dequantised from the GGUF),
    whose beams do pick EOS tokens past their end here (8 beams)."""
    llm = LLM(smollm2_loaded, **SMALL)
    prompt = smollm2_tokenizer.encode("The capital of France is", add_special_tokens=True)
    for width in (2, 4, 8):
        check_matches_transformers(llm, smollm2_hf, prompt, width, 8, 1.0)


def test_beams_share_pages(tiny_loaded):
    """Four beams over a 5-page prompt hold the prompt once: at peak no more than the prompt's
    pages plus, per beam, its output pages and one, against 4 x each sequence's own need."""
    llm = LLM(tiny_loaded, **SMALL, enable_prefix_caching=False)
    prompt = list(range(100, 140))  # 40 tokens: 5 pages
    width, max_tokens = 4, 24
    llm.beam_search([prompt], BeamSearchParams(beam_width=width, max_tokens=max_tokens))
    peak = llm.engine.scheduler.allocator.peak_used
    prompt_pages = len(prompt) // PAGE
    output_pages = -(-max_tokens // PAGE)
    unshared = width * -(-(len(prompt) + max_tokens) // PAGE)
    assert peak <= prompt_pages + width * (output_pages + 1) < unshared
    assert llm.engine.scheduler.allocator.num_used_pages == 0


def test_width_one_is_greedy(llm):
    from jaxgen import SamplingParams

    prompt = list(range(200, 220))
    greedy = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    beam = llm.beam_search([prompt], BeamSearchParams(beam_width=1, max_tokens=8, ignore_eos=True))
    assert beam[0].sequences[0].output_token_ids == greedy[0].outputs[0].token_ids


@pytest.mark.parametrize(
    "fields,name",
    [
        (dict(beam_width=0, max_tokens=4), "beam_width"),
        (dict(beam_width=11, max_tokens=4), "beam_width"),
        (dict(beam_width=2, max_tokens=0), "max_tokens"),
        (dict(beam_width=2, max_tokens=4, temperature=0.7), "temperature"),
        (dict(beam_width=2, max_tokens=4, length_penalty="x"), "length_penalty"),
        (dict(beam_width=2, max_tokens=4, length_penalty=1e308), "length_penalty"),
    ],
)
def test_bad_params(fields, name):
    with pytest.raises(ValueError, match=name):
        BeamSearchParams(**fields)


def test_bad_prompt(llm):
    with pytest.raises(ValueError, match="max_model_len"):
        llm.beam_search([list(range(1, 200))], BeamSearchParams(beam_width=2, max_tokens=2))
    with pytest.raises(ValueError, match="prompt"):
        llm.beam_search([[]], BeamSearchParams(beam_width=2, max_tokens=2))
