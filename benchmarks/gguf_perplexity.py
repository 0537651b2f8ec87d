"""Teacher-forced perplexity of a GGUF file's own text scoring: jaxgen with the file's weights kept
(``quantization="auto"``), against the same file dequantised to float32 (``"none"``, the
reference), and llama.cpp (llama-cpp-python) on the same token ids.

    python benchmarks/gguf_perplexity.py FILE.gguf [FILE.gguf ...] [--tokens 1024] [--json OUT]

The text is CPython's own reference documentation (``pydoc_data.topics``: plain English prose
shipped with every Python), tokenized once by jaxgen; every scorer gets the same ids. Reported per
file: perplexity of each scorer, its change against ``none``, and the mean |Δ NLL| per token
against ``none``.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

TOPICS = ("assignment", "compound", "exceptions", "import", "naming", "function", "class")


def corpus() -> str:
    from pydoc_data.topics import topics

    return "\n\n".join(topics[name] for name in TOPICS)


def nll(logits: np.ndarray, ids: np.ndarray) -> np.ndarray:  # [T, V], [T] -> [T - 1]
    logits = logits[:-1].astype(np.float64)
    top = logits.max(axis=-1, keepdims=True)
    log_z = np.log(np.exp(logits - top).sum(axis=-1)) + top[:, 0]
    return log_z - logits[np.arange(len(ids) - 1), ids[1:]]


def jaxgen_nll(path: str, ids: np.ndarray, quantization: str) -> np.ndarray:
    from jaxgen.evaluation.agreement import sequence_logits
    from jaxgen.loaders import load_model

    loaded = load_model(path, quantization=quantization)
    logits = sequence_logits(loaded, ids[None, :], backend="auto")[0]
    return nll(logits, ids)


def llama_cpp_nll(path: str, ids: np.ndarray) -> np.ndarray | None:
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    llm = Llama(
        path,
        n_ctx=len(ids) + 8,
        n_batch=512,
        logits_all=True,
        verbose=False,
        n_threads=os.cpu_count(),
    )
    llm.eval(ids.tolist())
    logits = np.asarray(llm.scores[: len(ids)], np.float32)
    return nll(logits, ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("files", nargs="+")
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--json")
    args = parser.parse_args()

    from jaxgen.loaders import load_model

    rows = []
    for path in args.files:
        tokenizer = load_model(path, quantization="none").tokenizer
        ids = np.asarray(tokenizer.encode(corpus())[: args.tokens], np.int32)
        reference = jaxgen_nll(path, ids, "none")
        scores = {"jaxgen auto": jaxgen_nll(path, ids, "auto")}
        lcpp = llama_cpp_nll(path, ids)
        if lcpp is not None:
            scores["llama.cpp"] = lcpp
        row = {
            "file": os.path.basename(path),
            "tokens": len(ids),
            "ppl none": float(np.exp(reference.mean())),
        }
        for name, values in scores.items():
            ppl = float(np.exp(values.mean()))
            row[f"ppl {name}"] = ppl
            row[f"Δppl {name} %"] = 100 * (ppl / row["ppl none"] - 1)
            row[f"mean|ΔNLL| {name}"] = float(np.abs(values - reference).mean())
        rows.append(row)
        print(json.dumps(row, ensure_ascii=False))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1, ensure_ascii=False)


if __name__ == "__main__":
    main()
