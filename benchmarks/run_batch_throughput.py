"""``jaxgen run-batch`` against ``LLM.chat`` on the same chat requests: generated tokens per wall
second of each, warm, in one process, and their ratio.

Both engines load the same weights with the same knobs. Each runs the workload once to warm up
(compiles, its own prefix cache), then once measured; run-batch goes through the server's app
in process (parsing, chat template, admission), ``LLM.chat`` straight to the engine.

    python benchmarks/run_batch_throughput.py [--model M] [--num-requests 512] [--output-len 32]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time

from jaxgen import LLM, AsyncLLM, SamplingParams
from jaxgen.loaders import load_model
from serving.launch.run_batch import run_batch_async
from serving.settings.resolve import ServerSettings


def requests(num: int, output_len: int) -> tuple[list, list[str]]:
    """The conversations, and the same requests as OpenAI batch lines."""
    conversations = [
        [{"role": "user", "content": f"Tell me a fact about the number {i}."}] for i in range(num)
    ]
    lines = [
        json.dumps(
            {
                "custom_id": f"r{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "messages": messages,
                    "max_tokens": output_len,
                    "temperature": 0,
                    "ignore_eos": True,
                },
            }
        )
        for i, messages in enumerate(conversations)
    ]
    return conversations, lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=None)
    parser.add_argument("--num-requests", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--max-rolling-batch-size", type=int, default=64)
    parser.add_argument("--max-model-len", type=int, default=512)
    args = parser.parse_args()
    knobs = dict(
        max_model_len=args.max_model_len, max_rolling_batch_size=args.max_rolling_batch_size
    )
    loaded = load_model(args.model)
    llm = LLM(loaded, **knobs)
    async_llm = AsyncLLM(loaded, **knobs)
    settings = ServerSettings(model=args.model or "smollm2")
    conversations, lines = requests(args.num_requests, args.output_len)
    params = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)
    tokens = args.num_requests * args.output_len
    with tempfile.TemporaryDirectory() as folder:
        batch_file = os.path.join(folder, "requests.jsonl")
        with open(batch_file, "w") as handle:
            handle.write("\n".join(lines) + "\n")
        rates = {}
        for label in ("warm-up", "measured"):
            start = time.perf_counter()
            llm.chat(conversations, params, use_tqdm=False)
            generate = tokens / (time.perf_counter() - start)
            output = os.path.join(folder, f"results-{label}.jsonl")
            start = time.perf_counter()
            summary = asyncio.run(
                run_batch_async(async_llm, settings, batch_file, output, progress=False)
            )
            batch = tokens / (time.perf_counter() - start)
            assert summary.errors == 0 and summary.completion_tokens == tokens, summary
            rates = {"LLM.chat": generate, "run-batch": batch}
            print(
                f"{label}: LLM.chat {generate:.1f} tok/s, run-batch {batch:.1f} tok/s, "
                f"ratio {batch / generate:.3f}",
                flush=True,
            )
    print(json.dumps({**rates, "ratio": rates["run-batch"] / rates["LLM.chat"]}))
    async_llm.shutdown()


if __name__ == "__main__":
    main()
