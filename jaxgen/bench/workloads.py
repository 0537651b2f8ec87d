"""Benchmark workloads: prompts as token ids plus exact output lengths, and arrival times."""

from __future__ import annotations

import dataclasses
import json
import os
import random

from jaxgen.loaders import resolve_model
from jaxgen.loaders.tokenizer import load_tokenizer
from jaxgen.sampling_params import SamplingParams

CHAT_TEMPLATES = (
    "What is {}?",
    "Explain {} in two sentences.",
    "Give me three facts about {}.",
    "Why does {} matter?",
    "Write a short poem about {}.",
    "How would you describe {} to a child?",
    "What are common misconceptions about {}?",
    "Summarize the history of {}.",
)
CHAT_TOPICS = (
    "photosynthesis",
    "the moon",
    "compound interest",
    "black holes",
    "the Roman empire",
    "machine learning",
    "volcanoes",
    "the water cycle",
    "jazz music",
    "prime numbers",
    "honey bees",
    "the internet",
    "electric cars",
    "coffee",
    "the Pacific ocean",
    "chess",
    "vaccines",
    "solar panels",
    "the French revolution",
    "rainbows",
    "DNA",
    "glaciers",
    "bicycles",
    "the printing press",
)
MIXED_OUTPUT_LENGTHS = (64, 128, 256)


@dataclasses.dataclass
class BenchRequest:
    """One prompt (token ids) and the exact number of tokens to generate for it."""

    prompt_token_ids: list[int]
    output_len: int
    text: str | None = None


@dataclasses.dataclass
class Workload:
    """A named list of requests; outputs have exact lengths (``ignore_eos``)."""

    name: str
    requests: list[BenchRequest]

    @property
    def input_tokens(self) -> int:
        return sum(len(r.prompt_token_ids) for r in self.requests)

    @property
    def output_tokens(self) -> int:
        return sum(r.output_len for r in self.requests)

    @property
    def max_total_len(self) -> int:
        return max(len(r.prompt_token_ids) + r.output_len for r in self.requests)

    def prompts(self) -> list[list[int]]:
        return [list(r.prompt_token_ids) for r in self.requests]

    def sampling_params(self) -> list[SamplingParams]:
        return [sampling_params(r.output_len) for r in self.requests]

    def describe(self) -> dict:
        count = len(self.requests)
        return {
            "workload": self.name,
            "num_prompts": count,
            "mean_input_len": round(self.input_tokens / max(count, 1), 1),
            "mean_output_len": round(self.output_tokens / max(count, 1), 1),
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
        }


def sampling_params(output_len: int) -> SamplingParams:
    """Greedy, exactly ``output_len`` tokens (EOS ignored)."""
    return SamplingParams(
        temperature=0.0, max_tokens=output_len, min_tokens=output_len, ignore_eos=True
    )


def normal_vocab_ids(tokenizer) -> list[int]:
    """Token ids of the base vocabulary, without special or added tokens."""
    excluded = set(tokenizer.all_special_ids) | set(tokenizer.get_added_vocab().values())
    return [i for i in range(tokenizer.vocab_size) if i not in excluded]


def random_workload(
    tokenizer,
    num_prompts: int,
    input_len: int,
    output_len: int,
    *,
    seed: int = 0,
    range_ratio: float = 0.0,
) -> Workload:
    """Random token ids from the normal vocabulary; lengths in ``len * [1 - r, 1 + r]``."""
    if input_len < 1 or output_len < 1 or num_prompts < 1:
        raise ValueError("num_prompts, input_len and output_len must be >= 1")
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError(f"range_ratio must be in [0, 1), got {range_ratio}")
    rng = random.Random(seed)
    vocab = normal_vocab_ids(tokenizer)

    def length(mean: int) -> int:
        low, high = max(1, round(mean * (1 - range_ratio))), round(mean * (1 + range_ratio))
        return rng.randint(low, max(low, high))

    requests = [
        BenchRequest([rng.choice(vocab) for _ in range(length(input_len))], length(output_len))
        for _ in range(num_prompts)
    ]
    return Workload(f"random {input_len} in / {output_len} out", requests)


def chat_questions(count: int, seed: int = 0) -> list[str]:
    """``count`` distinct short questions (templates x topics, shuffled with ``seed``)."""
    questions = [t.format(topic) for topic in CHAT_TOPICS for t in CHAT_TEMPLATES]
    random.Random(seed).shuffle(questions)
    out = []
    for i in range(count):  # past templates x topics, repeat with a suffix to stay distinct
        question, round_ = questions[i % len(questions)], i // len(questions)
        out.append(question if round_ == 0 else f"{question} (take {round_ + 1})")
    return out


def chat_prompt_ids(tokenizer, question: str) -> tuple[str, list[int]]:
    """A one-turn conversation through the chat template, as ``LLM.chat`` builds it."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    return text, tokenizer.encode(text, add_special_tokens=False)


def chat_workload(tokenizer, num_prompts: int, output_len: int, *, seed: int = 0) -> Workload:
    """Distinct short chat questions through the chat template (the "64 chat prompts" workload)."""
    requests = []
    for question in chat_questions(num_prompts, seed):
        text, ids = chat_prompt_ids(tokenizer, question)
        requests.append(BenchRequest(ids, output_len, text))
    return Workload(f"{num_prompts} chat prompts / {output_len} out", requests)


def jsonl_workload(
    path: str, tokenizer, output_len: int, num_prompts: int | None = None
) -> Workload:
    """One request per line: ``prompt`` (text), ``messages`` (chat) or ``prompt_token_ids``;
    an optional ``output_len`` (or ``max_tokens``) overrides ``output_len``."""
    requests = []
    with open(path) as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            item = json.loads(line)
            length = int(item.get("output_len", item.get("max_tokens", output_len)))
            if "prompt_token_ids" in item:
                text, ids = None, [int(t) for t in item["prompt_token_ids"]]
            elif "messages" in item:
                text = tokenizer.apply_chat_template(
                    item["messages"], tokenize=False, add_generation_prompt=True
                )
                ids = tokenizer.encode(text, add_special_tokens=False)
            elif "prompt" in item:
                text, ids = (
                    item["prompt"],
                    tokenizer.encode(item["prompt"], add_special_tokens=True),
                )
            else:
                raise ValueError(f"{path}:{number}: needs prompt, messages or prompt_token_ids")
            requests.append(BenchRequest(ids, length, text))
            if num_prompts is not None and len(requests) >= num_prompts:
                break
    if not requests:
        raise ValueError(f"{path} holds no prompts")
    return Workload(f"{os.path.basename(path)} ({len(requests)} prompts)", requests)


def with_mixed_outputs(workload: Workload, lengths=MIXED_OUTPUT_LENGTHS, seed: int = 0) -> Workload:
    """The same prompts with output lengths drawn evenly from ``lengths`` (shuffled)."""
    choices = [lengths[i % len(lengths)] for i in range(len(workload.requests))]
    random.Random(seed).shuffle(choices)
    requests = [
        dataclasses.replace(r, output_len=n)
        for r, n in zip(workload.requests, choices, strict=True)
    ]
    name = f"{workload.name.split(' / ')[0]} / {'|'.join(map(str, lengths))} out"
    return Workload(name, requests)


def arrival_offsets(count: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Start times (seconds) of ``count`` requests arriving at ``rate`` per second.

    Inter-arrival gaps are gamma distributed with shape ``burstiness`` and mean ``1 / rate``
    (``burstiness=1``: Poisson; < 1: burstier; > 1: more regular), as vLLM's benchmark_serving.
    ``rate=inf`` sends everything at once.
    """
    if rate <= 0 or burstiness <= 0:
        raise ValueError("request rate and burstiness must be > 0")
    if rate == float("inf"):
        return [0.0] * count
    rng = random.Random(seed)
    offsets, now = [], 0.0
    for _ in range(count):
        offsets.append(now)
        now += rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
    return offsets


def tokenizer_for(model: str | None):
    """The tokenizer of ``model`` (alias, HF directory, ``.gguf``) without loading weights."""
    return load_tokenizer(resolve_model(model))


def add_workload_args(parser) -> None:
    """``--num-prompts``, ``--input-len``/``--chat``/``--dataset``, ``--output-len``, ``--seed``."""
    parser.add_argument("--num-prompts", type=int, default=64)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--input-len", type=int, default=None, help="random prompts of this length")
    group.add_argument("--chat", action="store_true", help="short chat questions (the default)")
    group.add_argument("--dataset", default=None, help="JSONL file of prompts")
    parser.add_argument("--output-len", type=int, default=64, help="exact output tokens")
    parser.add_argument(
        "--mixed-outputs",
        default=None,
        help="comma-separated output lengths drawn evenly over the requests (e.g. 32,64,128)",
    )
    parser.add_argument(
        "--range-ratio", type=float, default=0.0, help="random lengths vary in len * [1 - r, 1 + r]"
    )
    parser.add_argument("--seed", type=int, default=0)


def workload_from_args(args, tokenizer) -> Workload:
    """The workload the ``add_workload_args`` flags describe."""
    workload = _base_workload(args, tokenizer)
    if getattr(args, "mixed_outputs", None):
        try:
            lengths = tuple(int(x) for x in args.mixed_outputs.split(","))
        except ValueError:
            message = f"--mixed-outputs must be integers, got {args.mixed_outputs!r}"
            raise ValueError(message) from None
        if not lengths or min(lengths) < 1:
            raise ValueError(f"--mixed-outputs lengths must be >= 1, got {args.mixed_outputs!r}")
        workload = with_mixed_outputs(workload, lengths, args.seed)
    return workload


def _base_workload(args, tokenizer) -> Workload:
    if args.dataset:
        return jsonl_workload(args.dataset, tokenizer, args.output_len, args.num_prompts)
    if args.input_len is not None:
        return random_workload(
            tokenizer,
            args.num_prompts,
            args.input_len,
            args.output_len,
            seed=args.seed,
            range_ratio=args.range_ratio,
        )
    return chat_workload(tokenizer, args.num_prompts, args.output_len, seed=args.seed)
