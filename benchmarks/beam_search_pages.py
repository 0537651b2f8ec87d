"""KV pages beam search holds at peak on the default model, against what the beams would hold
unshared (each its own copy of the prompt and its output).

    python benchmarks/beam_search_pages.py [--prompt-tokens 512] [--beams 4] [--tokens 32]
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--beams", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--page-size", type=int, default=16)
    args = parser.parse_args()

    from jaxgen import LLM, BeamSearchParams

    llm = LLM(
        None,
        max_model_len=1024,
        page_size=args.page_size,
        kv_cache_memory=128 << 20,
        enable_prefix_caching=False,  # pages shared by forks alone
    )
    text = "The lighthouse keeper wrote in her log every night. " * 64
    prompt = llm.get_tokenizer().encode(text)[: args.prompt_tokens]
    start = time.perf_counter()
    out = llm.beam_search([prompt], BeamSearchParams(beam_width=args.beams, max_tokens=args.tokens))
    elapsed = time.perf_counter() - start
    page = args.page_size
    peak = llm.engine.scheduler.allocator.peak_used
    prompt_pages = -(-len(prompt) // page)
    output_pages = -(-args.tokens // page)
    bound = len(prompt) // page + args.beams * (output_pages + 1)
    unshared = args.beams * -(-(len(prompt) + args.tokens) // page)
    print(
        f"prompt {len(prompt)} tokens ({prompt_pages} pages), {args.beams} beams x {args.tokens} "
        f"tokens, page {page}: peak {peak} pages; bound prompt + beams x (output + 1) = {bound}; "
        f"unshared {unshared} ({unshared / peak:.2f}x the peak); {elapsed:.1f} s; best beam "
        f"score {out[0].sequences[0].cum_logprob:.3f}"
    )


if __name__ == "__main__":
    main()
