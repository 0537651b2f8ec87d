"""The draft-model proposer (method "draft_model"): a second engine, over a smaller model with
the target's vocabulary, drafts k tokens for every speculating sequence at once.

Each step the drafting sequences' tokens go to the draft engine as requests for k tokens. Its
prefix cache holds every full page a sequence had the step before, so a request recomputes only
its last partial page and the tokens added since, all sequences in one ragged prefill step (more
when they exceed the token budget), then k - 1 decode steps; finished requests leave their pages
cached for the next. (Persistent draft sequences, rolled back like the target's, would save that
recompute, at the cost of a second copy of the scheduler's bookkeeping.)

A greedy row's draft is the draft model's argmax. A sampled row's draft is sampled from the
draft model's distribution q under the request's own temperature, top-k, top-p, min-p, logit
bias and penalties, with the draw's key the verify step uses at the same position: the
request's seed (an unseeded row: ``Candidate.seed``) folded with the token's output position
(``Request.outputs_in_prompt`` makes the draft engine count the sequence's output so far as
output). Both samplers draw by Gumbel-max, so the draft's token and the target's at a position
share their Gumbel noise: they agree whenever the noise picks the same token under q and p
(for one Gumbel-max over the vocabulary, with probability at least (1 - TV) / (1 + TV) for
total variation TV between them; always when q = p), where an independent draw agrees with
probability sum_x q(x) p(x). The verify step keeps the draft while it equals the target's own
draws (``verify_sampling``), so the draft decides how many tokens a step gains, never which:
the output is the target's distribution whatever q is (for a seeded request, its output
without speculation). A draft engine that fails only stops proposing.
"""

from __future__ import annotations

import dataclasses
import logging

from jaxgen.backends import select_backend
from jaxgen.config.engine_config import EngineConfig
from jaxgen.config.speculative_config import SpeculativeConfig
from jaxgen.engine.decoding.speculative.speculator import Candidate
from jaxgen.engine.sampling.sampling_tensors import is_greedy
from jaxgen.sampling_params import DISTRIBUTION_FIELDS, RequestOutputKind, SamplingParams

logger = logging.getLogger(__name__)
PROBE_TEXT = "The draft model's tokenizer: 123 + 4.5 = ?\n\tdef f(x): return x"


@dataclasses.dataclass(frozen=True, kw_only=True)
class TargetShape:
    """What the draft engine is sized to: the target engine's limits."""

    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    num_pages: int  # the target's pool, page 0 included
    page_size: int


def load_draft(speculative: SpeculativeConfig, target):
    """The draft ``LoadedModel``: ``speculative.model`` loaded (in the target's dtype, with its
    ``quantization``) or as given; ``ValueError`` naming ``speculative_config.model`` when its
    vocabulary or tokenizer differ from the target's."""
    from jaxgen.loaders import LoadedModel, load_model

    model = speculative.model
    if not isinstance(model, LoadedModel):  # a path or an alias (SpeculativeConfig checked)
        model = load_model(model, dtype=target.dtype, quantization=speculative.quantization)
    check_vocabulary(model, target)
    return model


def check_vocabulary(draft, target) -> None:
    """``ValueError`` naming ``speculative_config.model`` unless the draft scores the target's
    token ids: the same vocabulary size and a tokenizer that encodes the same."""
    if draft.config.vocab_size != target.config.vocab_size:
        raise ValueError(
            f"speculative_config.model: the draft's vocabulary ({draft.config.vocab_size}) "
            f"differs from the target's ({target.config.vocab_size})"
        )
    mine = draft.tokenizer.encode(PROBE_TEXT, add_special_tokens=False)
    theirs = target.tokenizer.encode(PROBE_TEXT, add_special_tokens=False)
    if list(mine) != list(theirs):
        raise ValueError(
            "speculative_config.model: the draft's tokenizer differs from the target's (the "
            "same text encodes to other token ids)"
        )


def draft_params(params: SamplingParams, k: int, seed: int | None) -> SamplingParams:
    """The draft engine's parameters for ``k`` tokens of a row sampled under ``params``: greedy
    for a greedy row, else its sampling filters, logit bias and penalties, seeded with ``seed``
    (``Candidate.seed``) or the row's own seed."""
    fixed = dict(max_tokens=k, ignore_eos=True, output_kind=RequestOutputKind.FINAL_ONLY)
    if is_greedy(params):
        return SamplingParams(temperature=0.0, **fixed)
    shaping = {name: getattr(params, name) for name in DISTRIBUTION_FIELDS}
    return SamplingParams(**shaping, seed=params.seed if seed is None else seed, **fixed)


class DraftModelProposer:
    """The speculator's proposer for method "draft_model" (``Speculator.proposer``)."""

    samples_drafts = True  # sampled rows' drafts are drawn: unseeded ones need a seed

    def __init__(self, draft, config: EngineConfig, target: TargetShape, engine_class):
        """``engine_class``: the engine the draft runs in (``LLMEngine``)."""
        backend = select_backend(
            config.attention_backend, dtype=draft.dtype, kv_cache_dtype=config.kv_cache_dtype
        )
        page_bytes = backend.kv_bytes_per_page(draft.config, target.page_size, draft.dtype)
        # As many pages as the target's pool: the draft holds no more than the target's running
        # sequences and their drafts do (a draft of the target's shape shares its executables).
        pages = target.num_pages - 1
        draft_config = EngineConfig(
            batching="paged",
            max_rolling_batch_size=target.max_num_seqs,
            max_rolling_batch_prefill_tokens=target.max_num_batched_tokens,
            page_size=target.page_size,
            max_model_len=target.max_model_len,
            kv_cache_memory=pages * page_bytes,
            attention_backend=config.attention_backend,
            attention_kernel_options=config.attention_kernel_options,
            enable_prefix_caching=True,
            seed=config.seed,
            precompile=False,  # the target's ``precompile`` compiles the draft's steps too
            compile_cache=config.compile_cache,
            kv_cache_dtype=config.kv_cache_dtype,
        )
        self.engine = engine_class(draft, draft_config)
        self.num_steps = 0  # the draft engine's steps, all proposals together
        self.failed = False  # the draft engine failed: nothing is proposed any more

    def propose(self, candidates: list[Candidate], token_budget: int) -> list[list[int]]:
        """k draft tokens for each ``Candidate`` (sequence, k, seed), in order, as long as
        their k fit ``token_budget`` together (the last one cut to fit; the rest get [])."""
        requests, proposals = {}, [[] for _ in candidates]
        if self.failed:
            return proposals
        try:
            for index, (seq, k, seed) in enumerate(candidates):
                k = min(k, token_budget)
                if k < 1:
                    break
                token_budget -= k
                params = draft_params(seq.params, k, seed)
                request_id = f"draft-{seq.seq_id}"
                request = self.engine.add_request(request_id, None, list(seq.token_ids), params)
                request.outputs_in_prompt = len(seq.output_token_ids)
                requests[request_id] = index
            while self.engine.has_unfinished():
                for output in self.engine.step():
                    if output.finished and output.request_id in requests:
                        proposals[requests[output.request_id]] = list(output.outputs[0].token_ids)
                self.num_steps += 1
        except Exception:  # the target decodes on, without drafts
            logger.exception("the draft model's engine failed; speculation stops")
            self.failed = True
            for request_id in requests:
                self.engine.abort(request_id)
            return [[] for _ in candidates]
        return proposals
