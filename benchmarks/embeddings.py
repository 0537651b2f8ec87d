"""Embeddings per second on the CPU: jaxgen's pooling step against sentence-transformers on
torch, same model, same inputs, same machine (issue 65).

Two models: the default model (SmolLM2-135M, its GGUF dequantised to a float32 safetensors
checkpoint, the two reading the same file) as a last-token embedder, and a random BERT of
MiniLM-L6's shape (6 layers, hidden 384, 12 heads, vocabulary 30522) with mean pooling. Each
embeds ``--inputs`` short texts (3 to 16 words); the time is the best of ``--repeats`` runs
(the two interleaved) after one warm-up (jaxgen's compiles happen there), and the embeddings of the two are compared
(cosine). Prints one JSON object; ``--out`` keeps it.

    python -m benchmarks.embeddings [--inputs 256] [--repeats 3] [--batch-size 32] [--out x.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time

import numpy as np

WORDS = (
    "the quick brown fox jumps over lazy dog hello world a an of to in is what capital "
    "france paris berlin city river embeddings pool sequence hidden states into one vector"
).split()


def texts(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(3, 16))) for _ in range(count)]


def smollm2_checkpoint(path: str) -> str:
    """The default GGUF as a float32 transformers checkpoint with sentence-transformers files
    (last-token pooling, normalised)."""
    import torch
    import transformers
    from safetensors.torch import save_file
    from sentence_transformers import SentenceTransformer, models

    from jaxgen.loaders.default_model import default_model_path

    gguf = default_model_path()
    kwargs = dict(gguf_file=os.path.basename(gguf))
    model = transformers.AutoModel.from_pretrained(
        os.path.dirname(gguf), dtype=torch.float32, **kwargs
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(os.path.dirname(gguf), **kwargs)
    base = os.path.join(path, "base")
    os.makedirs(base)
    # save_pretrained refuses a model read from a GGUF: the tensors and config, as it writes them.
    tensors = {name: t.contiguous() for name, t in model.state_dict().items()}
    save_file(tensors, os.path.join(base, "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    with open(os.path.join(base, "config.json"), "w") as f:
        json.dump(config, f)
    tokenizer.chat_template = None  # text embeds as it is (sentence-transformers 6 would render it)
    tokenizer.save_pretrained(base)
    transformer = models.Transformer(base)
    transformer.tokenizer.pad_token = transformer.tokenizer.eos_token
    dim = model.config.hidden_size
    modules = [transformer, models.Pooling(dim, "lasttoken"), models.Normalize()]
    out = os.path.join(path, "smollm2-embedder")
    SentenceTransformer(modules=modules, device="cpu").save(out)
    return out


def minilm_shaped_bert(path: str) -> str:
    """A random BERT of MiniLM-L6's shape with mean pooling (sentence-transformers files)."""
    from sentence_transformers import SentenceTransformer, models

    from tests.pooling.pooling_models import save_tiny_encoder

    base = save_tiny_encoder(
        os.path.join(path, "bert"),
        "bert",
        hidden_size=384,
        num_hidden_layers=6,
        num_attention_heads=12,
        intermediate_size=1536,
        vocab_size=30522,
        max_position_embeddings=512,
    )
    modules = [models.Transformer(base), models.Pooling(384, "mean"), models.Normalize()]
    out = os.path.join(path, "bert-embedder")
    SentenceTransformer(modules=modules, device="cpu").save(out)
    return out


def best_times(runs: dict, repeats: int) -> tuple[dict, dict]:
    """Each run's best time over ``repeats`` after a warm-up (compiles, caches), the runs
    interleaved so a change in the shared machine's load falls on both; and their results."""
    results = {name: fn() for name, fn in runs.items()}
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeats):
        for name, fn in runs.items():
            start = time.perf_counter()
            results[name] = fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return best, results


def measure(path: str, inputs: list[str], args) -> dict:
    from sentence_transformers import SentenceTransformer

    from jaxgen import LLM

    st = SentenceTransformer(path, device="cpu")
    llm = LLM(
        path,
        task="embed",
        max_model_len=512,
        max_rolling_batch_size=args.batch_size,
        max_rolling_batch_prefill_tokens=args.batch_size * 32,
    )
    runs = {
        "st": lambda: st.encode(inputs, batch_size=args.batch_size, convert_to_numpy=True),
        "jaxgen": lambda: llm.embed(inputs),
    }
    best, results = best_times(runs, args.repeats)
    st_seconds, ours_seconds = best["st"], best["jaxgen"]
    reference, outs = results["st"], results["jaxgen"]
    ours = np.asarray([o.outputs.embedding for o in outs])
    cosine = (ours * reference).sum(-1) / (
        np.linalg.norm(ours, axis=-1) * np.linalg.norm(reference, axis=-1)
    )
    tokens = sum(len(o.prompt_token_ids) for o in outs)
    return {
        "inputs": len(inputs),
        "tokens": tokens,
        "jaxgen_embeddings_per_s": round(len(inputs) / ours_seconds, 1),
        "sentence_transformers_embeddings_per_s": round(len(inputs) / st_seconds, 1),
        "jaxgen_seconds": round(ours_seconds, 4),
        "sentence_transformers_seconds": round(st_seconds, 4),
        "min_cosine": round(float(cosine.min()), 7),
        "max_abs_diff": float(np.abs(ours - reference).max()),
        "jaxgen_compiles": llm.pooling.compiles,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--models", default="smollm2,bert")
    parser.add_argument("--out")
    args = parser.parse_args()
    import torch

    inputs = texts(args.inputs)
    result = {"torch_threads": torch.get_num_threads(), "batch_size": args.batch_size}
    builders = {"smollm2": smollm2_checkpoint, "bert": minilm_shaped_bert}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            result[name] = measure(builders[name](tmp), inputs, args)
            print(name, json.dumps(result[name]), flush=True)
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
