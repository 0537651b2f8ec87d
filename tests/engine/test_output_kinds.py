"""What an engine step reports of a running request (``SamplingParams.output_kind``, vLLM's
``RequestOutputKind``): everything so far, what is new, or nothing until it finishes."""

from __future__ import annotations

import pytest

import jaxgen.llm
from jaxgen import LLM, RequestOutputKind, SamplingParams

PROMPTS = [[5, 9, 14, 3, 7], [11, 12, 13]]


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return LLM(tiny_model_dir, max_model_len=64, max_rolling_batch_size=4)


def _run(llm, kind: RequestOutputKind) -> dict[str, list]:
    """request id -> the outputs engine steps returned for it, in order."""
    params = SamplingParams(
        n=2, temperature=0.9, seed=3, max_tokens=12, logprobs=2, prompt_logprobs=1,
        ignore_eos=True, output_kind=kind,
    )  # fmt: skip
    engine = llm.engine
    ids = [f"{kind.name}-{i}" for i in range(len(PROMPTS))]
    for request_id, prompt in zip(ids, PROMPTS, strict=True):
        engine.add_request(request_id, None, prompt, params)
    reported = {request_id: [] for request_id in ids}
    while engine.has_unfinished():
        for out in engine.step():
            reported[out.request_id].append(out)
    return reported


def test_delta_outputs_add_up_to_the_cumulative_one(llm):
    cumulative = _run(llm, RequestOutputKind.CUMULATIVE)
    delta = _run(llm, RequestOutputKind.DELTA)
    for (_, full), (_, pieces) in zip(cumulative.items(), delta.items(), strict=True):
        final = full[-1]
        assert len(pieces) > 2 and pieces[-1].finished and not pieces[0].finished
        for index, sample in enumerate(final.outputs):
            parts = [piece.outputs[index] for piece in pieces]
            assert "".join(part.text for part in parts) == sample.text
            assert [t for part in parts for t in part.token_ids] == sample.token_ids
            assert [lp for part in parts for lp in part.logprobs] == sample.logprobs
            assert parts[-1].finish_reason == sample.finish_reason == "length"
        sent = [piece.prompt_logprobs for piece in pieces if piece.prompt_logprobs is not None]
        assert sent == [final.prompt_logprobs]  # once, complete


def test_final_only_reports_each_request_once_finished(llm):
    cumulative = _run(llm, RequestOutputKind.CUMULATIVE)
    final = _run(llm, RequestOutputKind.FINAL_ONLY)
    for (_, full), (_, once) in zip(cumulative.items(), final.items(), strict=True):
        assert len(full) > 1 and len(once) == 1 and once[0].finished
        assert [o.token_ids for o in once[0].outputs] == [o.token_ids for o in full[-1].outputs]
        assert [o.text for o in once[0].outputs] == [o.text for o in full[-1].outputs]


def test_generate_waits_only_when_no_step_ran(llm, monkeypatch):
    """``LLM.generate`` asks for FINAL_ONLY outputs, so most steps return nothing: it must go
    straight on to the next step, not wait as for a batch to fill (a millisecond a step)."""
    waits = []
    monkeypatch.setattr(jaxgen.llm.time, "sleep", waits.append)
    steps = llm.engine.num_steps
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    outs = llm.generate([PROMPTS[0]], params, use_tqdm=False)
    assert len(outs[0].outputs[0].token_ids) == 12
    assert llm.engine.num_steps - steps >= 12 and waits == []


@pytest.mark.parametrize("kind", [3, -1, "delta", True])
def test_output_kind_must_be_one_of_the_three(kind):
    with pytest.raises(ValueError, match="output_kind"):
        SamplingParams(output_kind=kind)
