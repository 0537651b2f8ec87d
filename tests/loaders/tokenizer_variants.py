"""One small GGUF per tokenizer variant the supported families ship (and the other byte-level
pre-tokenizers llama.cpp lists), written deterministically from the vocabularies
``gguf_tokenizer_files`` trains, with a digest of their tokenizer fields; shared by the golden
ids' generator (tests/loaders/make_llama_cpp_golden.py) and the tests that read them."""

from __future__ import annotations

import functools
import hashlib
import json
import os

from tests.loaders.gguf_tokenizer_files import (
    CORPUS,
    PIECES,
    random_strings,
    write_tokenizer_gguf,
)

GOLDEN = os.path.join(os.path.dirname(__file__), "data", "llama_cpp_token_ids.json")

# Byte-level pre-tokenizers: the families' (Llama 3, Qwen 2/3, SmolLM, Falcon, GPT-2, Mistral's
# tekken) and others llama.cpp lists, each split differently.
BPE_PRES = [
    "llama-bpe", "qwen2", "smollm", "falcon", "gpt-2", "tekken", "qwen35", "deepseek-llm",
    "deepseek-coder", "deepseek-v3", "gpt-4o", "chatglm-bpe", "bloom", "viking", "chameleon",
    "jais-2", "seed-coder", "bailingmoe", "exaone-moe", "minicpm5", "youtu", "spark2_5",
    "ufakzeka", "laguna", "granite-embed-multi-97m", "dbrx", "olmo",
]  # fmt: skip
VARIANTS = ["spm-llama", "spm-llama-eos", "spm-gemma", "spm-phi3", "bpe-no-pre"] + [
    f"bpe-{pre}" for pre in BPE_PRES
]
FAMILY_VARIANTS = ["spm-llama", "spm-gemma", "spm-phi3", "bpe-llama-bpe", "bpe-qwen2"]
FAMILY_VARIANTS += ["bpe-smollm", "bpe-falcon", "bpe-gpt-2", "bpe-tekken"]
# Tokens every byte-level file adds: control, user-defined, and texts llama.cpp retypes.
BPE_EXTRA = [
    ("<|endoftext|>", 3), ("<|im_start|>", 3), ("<|im_end|>", 3), ("<think>", 4),
    ("<|eot_id|>", 1), ("<|fim_prefix|>", 1), ("<|channel|>", 3), ("<tool_call>", 4),
]  # fmt: skip
GEMMA_EXTRA = [
    ("<start_of_turn>", 3), ("<end_of_turn>", 3), ("\n", 4), ("\n\n", 4), ("\t", 4),
    ("▁▁", 1), ("▁▁▁▁", 1), ("<table>", 4), ("</table>", 4),
]  # fmt: skip
PHI3_EXTRA = [
    ("<|endoftext|>", 3),
    ("<|user|>", 3),
    ("<|assistant|>", 3),
    ("<|end|>", 3),
    ("<|system|>", 3),
]


def corpus(specials: list[str], count: int = 240) -> list[str]:
    """The compared strings: the pieces, the corpus, the special tokens alone and inside text,
    and random mixes (deterministic)."""
    inside = [f"say {s}  then\n{s}x {s} {s}" for s in specials[:12]]
    return list(dict.fromkeys(random_strings(count, specials, seed=7) + inside))


@functools.cache
def _byte_level_vocab() -> tuple[list[str], list[int], list[str]]:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=900,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(CORPUS * 20 + PIECES * 5, trainer)
    model = json.loads(bpe.model.__getstate__())
    tokens = [t for t, _ in sorted(model["vocab"].items(), key=lambda item: item[1])]
    merges = [" ".join(p) if isinstance(p, list) else p for p in model["merges"]]
    return tokens, [1] * len(tokens), merges


@functools.cache
def _sentencepiece_vocab(workdir: str) -> tuple[list[str], list[int], list[float]]:
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2

    prefix = os.path.join(workdir, "spm-variant")
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS * 20 + PIECES * 5),
        model_prefix=prefix,
        model_type="bpe",
        vocab_size=700,
        byte_fallback=True,
        character_coverage=1.0,
        control_symbols=["<|im_start|>", "<|im_end|>"],
        user_defined_symbols=["<think>"],
        num_threads=1,
        minloglevel=2,
    )
    proto = sentencepiece_model_pb2.ModelProto()
    with open(prefix + ".model", "rb") as handle:
        proto.ParseFromString(handle.read())
    pieces = proto.pieces
    return [p.piece for p in pieces], [p.type for p in pieces], [p.score for p in pieces]


def write_variant(name: str, directory: str) -> str:
    """The GGUF of variant ``name`` in ``directory`` (its path)."""
    path = os.path.join(directory, f"{name}.gguf")
    if name.startswith("bpe-"):
        tokens, types, merges = _byte_level_vocab()
        tokens = tokens + [t for t, _ in BPE_EXTRA]
        types = types + [k for _, k in BPE_EXTRA]
        fields = dict(model="gpt2", merges=merges, bos=tokens.index("<|endoftext|>"))
        fields["eos"] = tokens.index("<|im_end|>")
        if name != "bpe-no-pre":
            fields["pre"] = name[4:]
        if name not in ("bpe-llama-bpe", "bpe-tekken", "bpe-no-pre"):  # those: the default
            fields["add_bos"] = name in ("bpe-falcon", "bpe-chameleon")
        return write_tokenizer_gguf(path, tokens=tokens, token_types=types, **fields)
    tokens, types, scores = _sentencepiece_vocab(directory)
    extra = {"spm-gemma": GEMMA_EXTRA, "spm-phi3": PHI3_EXTRA}.get(name, [])
    tokens = tokens + [t for t, _ in extra]
    types = types + [k for _, k in extra]
    scores = scores + [0.0] * len(extra)
    fields = dict(model="llama", scores=scores, bos=tokens.index("<s>"), eos=tokens.index("</s>"))
    fields["unk"] = tokens.index("<unk>")
    if name == "spm-llama-eos":
        fields.update(add_bos=False, add_eos=True)
    if name == "spm-gemma":
        fields.update(add_space_prefix=False, add_bos=True)
    if name == "spm-phi3":
        fields["general_name"] = "Phi-3 Mini 4k Instruct"
        fields["eos"] = tokens.index("<|end|>")
    return write_tokenizer_gguf(path, tokens=tokens, token_types=types, **fields)


def tokenizer_digest(path: str) -> str:
    """A digest of the file's tokenizer fields (what a golden entry was recorded for)."""
    from jaxgen.loaders.gguf_reader import GGUFReader

    fields = GGUFReader(path).fields
    kept = {k: fields[k] for k in sorted(fields) if k.startswith(("tokenizer.", "general.name"))}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:24]


def specials_of(path: str) -> list[str]:
    """The file's control and user-defined token texts (as its token types say)."""
    from jaxgen.loaders.gguf_reader import GGUFReader

    fields = GGUFReader(path).fields
    types = fields["tokenizer.ggml.token_type"]
    return sorted(
        t for t, k in zip(fields["tokenizer.ggml.tokens"], types, strict=True) if k in (3, 4)
    )
