"""``LLM``: the offline Python API (vLLM-style ``generate`` and ``chat``)."""

from __future__ import annotations

import dataclasses
import itertools
import time

from jaxgen.beam_search_params import BeamSearchOutput, BeamSearchParams
from jaxgen.chat_template_options import ChatTemplateOptions
from jaxgen.config.engine_config import EngineConfig
from jaxgen.create_engine import create_engine
from jaxgen.engine.decoding.beam_search import run_beam_search
from jaxgen.engine.pooling import PoolingParams, classify_outputs, embed_outputs, score_outputs
from jaxgen.engine.scheduling.policy import check_priority
from jaxgen.engine.scheduling.prompt_inputs import normalize_params, normalize_prompts, per_prompt
from jaxgen.loaders.checkpoint_weights import read_checkpoint_weights
from jaxgen.loaders.pooling_model import open_pooling_engine, pooling_beside
from jaxgen.outputs import RequestOutput
from jaxgen.quantization.stats import weight_stats
from jaxgen.reasoning import ReasoningRequest, get_reasoning_format
from jaxgen.sampling_params import RequestOutputKind, SamplingParams
from jaxgen.tool_calling import ToolRequest, chat_template_of, check_conversation, render_chat


class LLM:
    """Loads a model and generates with continuous batching over a paged KV pool (by default).

    Args:
        model: None or "smollm2" (the embedded default), an HF checkpoint directory, a ``.gguf``
            file, a directory written by ``jaxgen convert``, a hub id (``"org/name"``: its
            config, tokenizer and safetensors are downloaded into the hub's cache; or
            ``"org/name:Q4_K_M"``: the GGUF file carrying that quantisation tag), or an
            already loaded ``LoadedModel`` (several engines can share one set of weights). An
            existing local path always wins over a hub id.
        dtype: "float32" (default), "bfloat16", "float16" or "auto".
        revision: a hub id's branch, tag or commit (default: its main branch).
        gguf_file: the GGUF file of a hub repository (or of a local directory) to load.
        reasoning_parser: how ``chat`` reads a reasoning model's thinking apart from its
            answer: "deepseek_r1", "deepseek_v3" or "qwen3" (``jaxgen.reasoning``; vLLM's
            names); each completion then has ``reasoning_content`` and ``content``, and a
            constraint (or a tool call) applies to the answer only. None (default): the
            output is read as it is.
        **engine_knobs: ``EngineConfig`` fields: batching, max_rolling_batch_size,
            max_rolling_batch_prefill_tokens, batch_size, max_batch_delay, page_size,
            max_model_len, kv_cache_memory, attention_backend, enable_prefix_caching, seed,
            tensor_parallel_degree, data_parallel_size (see docs/sharding.md), precompile,
            quantization ("auto": a GGUF stays quantised, a float checkpoint float; "none";
            "int8" / "int4" / "fp8": quantise at load; "w8a8": int8 weights and int8
            activations; "w4a8": int4 weights (a GGUF's kept) and int8 activations, llama.cpp's
            CPU numbers; see ``jaxgen.quantization``),
            kv_cache_dtype ("auto", "int8", "fp8").
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        dtype: str = "float32",
        revision: str | None = None,
        gguf_file: str | None = None,
        reasoning_parser: str | None = None,
        **engine_knobs,
    ):
        unknown = set(engine_knobs) - set(EngineConfig.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown LLM argument(s): {', '.join(sorted(unknown))}")
        config = EngineConfig(**engine_knobs)  # validate knobs before the slow load
        if reasoning_parser is not None:
            get_reasoning_format(reasoning_parser)  # a ValueError naming the known parsers
        self.reasoning_parser = reasoning_parser
        source = dict(dtype=dtype, config=config, revision=revision, gguf_file=gguf_file)
        self.pooling = open_pooling_engine(model, **source)  # None: a generation model
        self.engine = None if self.pooling else create_engine(model, **source)  # TP, replicas
        self._config = config
        self._ids = itertools.count()

    @property
    def loaded(self):
        """The ``LoadedModel``: config, tokenizer, graph and the weights as they are now."""
        return (self.engine or self.pooling).loaded

    @property
    def params(self):
        """The placed parameter pytree (an ``nnx.State``) — inspect shapes and shardings here."""
        return (self.engine or self.pooling).params

    # -- weights that change, and sleep mode (vLLM's and SGLang's names; docs/rl.md) -------------
    def update_weights(self, params) -> None:
        """Swaps in new weights between generate calls: ``params`` in the model's naming (an
        ``nnx.State`` like ``params``, a nested or dotted-name dict), each of the model's dtype
        and shape; ``ValueError`` naming the first that does not fit (the old weights stay).
        No compile; arrays already on the engine's devices and shardings are held, not copied.
        The prefix cache is emptied. ``jaxgen.engine.weights``."""
        self._generator().update_weights(params)

    def update_weights_from_path(self, path: str) -> None:
        """``update_weights`` from an HF checkpoint directory (safetensors) or a ``jaxgen
        convert`` (orbax) directory, read in the model's dtype and quantisation."""
        self.update_weights(read_checkpoint_weights(path, self._generator().loaded))

    def sleep(self, level: int = 1) -> None:
        """Frees the device memory (vLLM's sleep mode): level 1 keeps the weights on the
        host, level 2 discards them (``update_weights`` brings new ones); generation raises
        ``EngineSleepingError`` until ``wake_up``."""
        self._generator().sleep(level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Takes back what ``sleep`` freed: ``tags`` "weights", "kv_cache" (None: both)."""
        self._generator().wake_up(tags)

    def is_sleeping(self) -> bool:
        return self._generator().is_sleeping()

    def embed(self, prompts, pooling_params: PoolingParams | None = None, *, use_tqdm=False):
        """Each prompt's embedding (``EmbeddingRequestOutput``, ``.outputs.embedding``); see
        docs/api.md, "Pooling". ``use_tqdm`` is accepted for compatibility."""
        return embed_outputs(self._pooler(), prompts, pooling_params, self._new_id)

    def classify(self, prompts, pooling_params: PoolingParams | None = None, *, use_tqdm=False):
        """A sequence classifier's probabilities per prompt (``.outputs.probs``)."""
        return classify_outputs(self._pooler(), prompts, pooling_params, self._new_id)

    def score(self, text_1, text_2, pooling_params: PoolingParams | None = None, *, use_tqdm=False):
        """Scores of text pairs (one text_1 against each text_2, or the lists zipped): a
        cross-encoder's probability, or an embedding model's cosine (``.outputs.score``)."""
        return score_outputs(self._pooler(), text_1, text_2, pooling_params, self._new_id)

    def _pooler(self):
        if self.pooling is None:
            self.pooling = pooling_beside(self.loaded, self._config)
        if self.pooling is None:
            raise ValueError(
                "this model has no pooling defined (no sentence-transformers modules.json): "
                "load it with task='embed' to embed with it"
            )
        return self.pooling

    def _new_id(self) -> str:
        return str(next(self._ids))

    def _generator(self):
        if self.engine is None:
            raise ValueError(
                f"this model was loaded for pooling (task {self._config.task!r}): it embeds, "
                "classifies and scores; generation needs a decoder with task 'generate'"
            )
        return self.engine

    def get_tokenizer(self):
        return self.loaded.tokenizer

    def stats(self) -> dict:
        """The engine's counters, plus the weights' form: ``quantization`` (as loaded),
        ``weight_dtypes`` (parameter count per stored kind), ``parameter_bytes`` and
        ``kv_cache_dtype``."""
        return {
            **(self.engine or self.pooling).stats(),
            **weight_stats(self.loaded),
            "kv_cache_dtype": self._config.kv_cache_dtype,
        }

    def precompile(self, sampling_params: SamplingParams | list[SamplingParams] | None = None):
        """Compiles the engine step for every batch shape and the sampler for every row bucket,
        so later ``generate`` calls compile nothing, whatever their sampling parameters (they
        share these executables; ``sampling_params`` is accepted for compatibility and changes
        nothing); returns the compiles. ``LLM(..., precompile=True)`` does it at start."""
        if isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params]
        return self._generator().precompile(sampling_params)

    def generate(
        self,
        prompts,
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        *,
        use_tqdm: bool = True,
        lora_request=None,
        priority: list[int] | int | None = None,
    ) -> list[RequestOutput]:
        """Generates for each prompt (a str, a token-id list, vLLM's ``{"prompt": ...}`` or
        ``{"prompt_token_ids": ...}`` dict, or a list of them). The
        engine reports each request once, finished (``RequestOutputKind.FINAL_ONLY``).
        ``lora_request``: a ``jaxgen.lora.LoRARequest`` for every prompt, or a list of one (or
        None: the base model) per prompt; needs ``enable_lora=True``. ``priority``: a list of
        one int per prompt (vLLM's; or one int for all), lower first; non-zero ones need
        ``scheduling_policy="priority"``. A bad item refuses the whole call (``ValueError``),
        nothing of it queued."""
        items = normalize_prompts(prompts)
        params_list = _final_only(normalize_params(sampling_params, len(items)))
        policy = self._generator().config.scheduling_policy
        loras = per_prompt(lora_request, len(items), "lora_request")
        priorities = per_prompt(0 if priority is None else priority, len(items), "priority")
        priorities = [check_priority(rank, policy) for rank in priorities]
        tokenizer = self.loaded.tokenizer
        order = []
        try:
            for item, params, lora, rank in zip(items, params_list, loras, priorities, strict=True):
                if isinstance(item, str):
                    token_ids, text = tokenizer.encode(item, add_special_tokens=True), item
                else:
                    token_ids, text = item, None
                request_id = str(next(self._ids))
                self.engine.add_request(
                    request_id, text, token_ids, params, lora_request=lora, priority=rank
                )
                order.append(request_id)
        except BaseException:  # all or nothing: an item refused leaves none of the batch queued
            for request_id in order:
                self.engine.abort(request_id)
            raise
        return self._run(order, use_tqdm)

    def beam_search(
        self, prompts, params: BeamSearchParams, *, use_tqdm: bool = False
    ) -> list[BeamSearchOutput]:
        """Beam search (vLLM's ``LLM.beam_search``): for each prompt (a str, a token-id list,
        or a dict with ``"prompt"`` or ``"prompt_token_ids"``) the best ``params.beam_width``
        sequences, best first. Beams share the prompt's KV pages and every full page they
        have in common (``jaxgen.engine.decoding.beam_search``). ``use_tqdm`` is accepted for
        compatibility."""
        if not isinstance(params, BeamSearchParams):
            raise ValueError("params must be a BeamSearchParams")
        tokenizer = self.loaded.tokenizer
        token_lists = [
            tokenizer.encode(item, add_special_tokens=True) if isinstance(item, str) else item
            for item in normalize_prompts(prompts)
        ]
        engine = getattr(self._generator(), "engines", [self.engine])[0]  # data parallel: first
        for tokens in token_lists:
            engine.check_prompt(tokens)
        sequences = run_beam_search(engine, token_lists, params)
        return [BeamSearchOutput(sequences=best) for best in sequences]

    def chat(
        self,
        messages,
        sampling_params=None,
        *,
        use_tqdm: bool = True,
        add_generation_prompt: bool | None = None,
        continue_final_message: bool = False,
        chat_template_kwargs: dict | None = None,
        chat_template: str | None = None,
        tools: list[dict] | None = None,
        tool_choice: str | dict | None = None,
        parallel_tool_calls: bool | None = None,
        tool_call_parser: str = "auto",
    ):
        """Applies the chat template to one conversation or a list of them, then generates.

        With ``tools`` (OpenAI function tools) the template offers them and each completion's
        ``tool_calls`` holds the calls read from its text (``tool_choice`` "auto", the default;
        "required" and a named function ``{"type": "function", "function": {"name": ...}}``
        constrain the output to calls; "none" offers the tools but reads no calls). Messages may
        hold assistant ``tool_calls`` and ``tool`` results. ``tool_call_parser``: "auto" (from
        the chat template), "hermes", "llama3_json", "mistral" or "pythonic".
        With ``LLM(..., reasoning_parser=...)`` each completion's ``reasoning_content`` and
        ``content`` hold the thinking and the answer (the calls are read from the answer; a
        constraint applies to it: the thinking is free).
        ``add_generation_prompt`` (default: true unless ``continue_final_message``),
        ``continue_final_message`` (continue the final assistant message rather than start a
        new turn) and ``chat_template_kwargs`` (extra template variables) are vLLM's
        controls (``jaxgen.chat_template_options``). See docs/api.md.
        """
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        if not conversations or not all(isinstance(c, list) and c for c in conversations):
            raise ValueError("messages must be a conversation (list of dicts) or a list of them")
        tokenizer = self.loaded.tokenizer
        request = ToolRequest.build(
            tools,
            tool_choice,
            parallel_tool_calls=parallel_tool_calls,
            tool_call_parser=tool_call_parser,
            chat_template=chat_template_of(tokenizer, chat_template),
        )
        prompts, reasonings = [], []
        for conversation in conversations:
            conversation = check_conversation(conversation)
            options = ChatTemplateOptions.build(
                conversation,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                chat_template_kwargs=chat_template_kwargs,
            )
            prompts.append(
                render_chat(
                    tokenizer,
                    conversation,
                    tools=request.tools,
                    chat_template=chat_template,
                    options=options,
                )
            )
            reasonings.append(
                ReasoningRequest.build(
                    self.reasoning_parser,
                    prompts[-1],
                    chat_template_kwargs=chat_template_kwargs,
                    tokenizer=tokenizer,
                )
            )
        params = normalize_params(sampling_params, len(prompts))
        if request.parses_output:
            params = [_with_tools(p, request) for p in params]
        if self.reasoning_parser is not None:  # a constraint applies after the thinking
            params = [r.constrain(p) for p, r in zip(params, reasonings, strict=True)]
        token_lists = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
        outs = self.generate(token_lists, params, use_tqdm=use_tqdm)
        for out, prompt, reasoning in zip(outs, prompts, reasonings, strict=True):
            out.prompt = prompt
            for completion in out.outputs:
                answer = completion.text if reasoning is None else reasoning.fill(completion)
                if request.parses_output:
                    completion.tool_calls = request.parse(answer)[1]
        return outs

    def _run(self, order: list[str], use_tqdm: bool) -> list[RequestOutput]:
        pending = set(order)
        done: dict[str, RequestOutput] = {}
        bar = None
        if use_tqdm and len(order) > 1:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(order), desc="generate", unit="req")
        try:
            while pending:
                steps = self.engine.num_steps
                outputs = self.engine.step()
                if self.engine.num_steps == steps and self.engine.has_unfinished():
                    # No step ran (dynamic batching waiting for its batch to fill). A step that
                    # ran without outputs (FINAL_ONLY requests) goes straight on.
                    time.sleep(0.001)
                for out in outputs:
                    if out.finished and out.request_id in pending:
                        pending.discard(out.request_id)
                        done[out.request_id] = out
                        if bar is not None:
                            bar.update(1)
        except BaseException:
            for request_id in pending:
                self.engine.abort(request_id)
            raise
        finally:
            if bar is not None:
                bar.close()
        return [done[r] for r in order]


def _with_tools(params: SamplingParams, request: ToolRequest) -> SamplingParams:
    """``params`` with the constraint a "required"/named ``tool_choice`` puts on the output, and
    special tokens kept when the parser's markers are special tokens."""
    constraint = request.constraint
    if constraint is not None and params.structured_outputs is not None:
        raise ValueError(
            "tool_choice 'required' or a named function cannot be combined with "
            "sampling_params.structured_outputs"
        )
    return dataclasses.replace(
        params,
        structured_outputs=constraint or params.structured_outputs,
        skip_special_tokens=params.skip_special_tokens and not request.needs_special_tokens,
    )


def _final_only(params_list: list[SamplingParams]) -> list[SamplingParams]:
    """``params_list`` asking for final outputs only (a copy of each distinct object)."""
    copies: dict[int, SamplingParams] = {}
    for params in params_list:
        if id(params) not in copies:
            copies[id(params)] = dataclasses.replace(
                params, output_kind=RequestOutputKind.FINAL_ONLY
            )
    return [copies[id(params)] for params in params_list]
