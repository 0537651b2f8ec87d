"""Host time around the engine's jitted step, single stream, warm: per step, the wall time, the
dispatch (the jitted call until it returns, before the step can run) and the wait for the
result (device time not hidden behind the host). Also the number of arrays the step passes.

    python benchmarks/step_dispatch.py [--quantization auto] [--tokens 128] [--repeats 3]

Each repeat is one chat request of ``--tokens`` greedy tokens; the figures are per step, and the
best repeat (by wall time) is printed last.
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quantization", default="auto")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import jax

    from jaxgen import LLM, SamplingParams
    from jaxgen.engine.step.call_times import CallTimes

    llm = LLM(max_model_len=512, kv_cache_memory=512 << 20, quantization=args.quantization)
    params = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
    messages = [{"role": "user", "content": "Tell a tiny story about the sea."}]
    for _ in range(2):  # compile the prefill and decode shapes
        llm.chat(messages, params, use_tqdm=False)
    runner = llm.engine.runner
    leaves = jax.tree_util.tree_leaves((runner.step_params, runner.head_kernel))
    arrays = len({id(leaf) for leaf in leaves})
    kv = len(jax.tree_util.tree_leaves(runner.kv_cache))
    print(f"quantization {args.quantization}: the step passes {arrays} parameter arrays "
          f"({len(leaves)} leaves) and {kv} KV pool arrays")  # fmt: skip

    # The runner adds each dispatch's and each result wait's time to its ``call_times``; the
    # engine's observers count the steps.
    spent = runner.call_times = CallTimes()
    steps = []
    unsubscribe = llm.engine.observers.add(steps.append)
    rows = []
    try:
        for _ in range(args.repeats):
            spent.reset()
            steps.clear()
            start = time.perf_counter()
            out = llm.chat(messages, params, use_tqdm=False)
            wall = time.perf_counter() - start
            count = sum(event.num_steps for event in steps)
            tokens = len(out[0].outputs[0].token_ids)
            rows.append((wall / count, spent.dispatch / count, spent.wait / count, tokens / wall))
            print("per step: wall {:.2f} ms, dispatch {:.2f} ms, result wait {:.2f} ms; "
                  "{:.1f} tok/s".format(*(v * 1e3 for v in rows[-1][:3]), rows[-1][3]))  # fmt: skip
    finally:
        unsubscribe()
        runner.call_times = None
    best = min(rows)
    print("best: wall {:.2f} ms, dispatch {:.2f} ms, result wait {:.2f} ms; {:.1f} tok/s".format(
        *(v * 1e3 for v in best[:3]), best[3]))  # fmt: skip


if __name__ == "__main__":
    main()
