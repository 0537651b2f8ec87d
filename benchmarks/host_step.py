"""The host's share of an engine step: for a batch of requests decoding together, the time per
step the engine spends in Python (scheduling, building the step's arrays, reading its tokens,
detokenizing, stop checks), apart from dispatching the jitted step and waiting for its result.
On a GPU that time must stay well under the device's step time (docs/gpu.md); it does not depend
on the device, so it is measured here on the CPU.

    python benchmarks/host_step.py [--batch 64] [--input-len 32] [--output-len 96] [--repeats 3]
        [--model PATH] [--async-scheduling]

Each repeat generates ``--batch`` greedy requests together (warm: the first pass compiles); per
decode step it reports host ms (the step's wall time less dispatch and wait), dispatch ms (the
jitted calls until they return) and wait ms (blocked on the result), medians over the steps of
the best repeat; and the host part's CPU time (the engine thread's), steadier than wall time on a
shared machine.
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default=None, help="default: the embedded default model")
    parser.add_argument("--async-scheduling", action="store_true")
    args = parser.parse_args()

    from jaxgen import LLM, SamplingParams
    from jaxgen.engine.step.call_times import CallTimes

    llm = LLM(
        args.model,
        max_model_len=args.input_len + args.output_len + 16,
        max_rolling_batch_size=args.batch,
        max_rolling_batch_prefill_tokens=max(512, args.batch * args.input_len),
        async_scheduling=args.async_scheduling,
    )
    engine = llm.engine
    runner = engine.runner
    spent = runner.call_times = CallTimes()  # the runner adds its dispatch and fetch times
    vocab = engine.loaded.config.vocab_size
    prompts = [
        [(7 * i + 13 * j) % (vocab - 100) + 50 for j in range(args.input_len)]
        for i in range(args.batch)
    ]
    params = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)
    llm.generate(prompts, params, use_tqdm=False)  # compiles every shape met
    best = None
    for _ in range(args.repeats):
        for request_id, prompt in enumerate(prompts):
            engine.add_request(f"r{request_id}-{time.monotonic_ns()}", None, prompt, params)
        rows = []
        while engine.has_unfinished():
            spent.reset()
            start, cpu = time.perf_counter(), time.thread_time()
            engine.step()
            wall, cpu = time.perf_counter() - start, time.thread_time() - cpu
            host = wall - spent.dispatch - spent.wait
            host_cpu = cpu - spent.dispatch_cpu - spent.wait_cpu
            rows.append((host, spent.dispatch, spent.wait, host_cpu))
        decode = rows[2:-1] or rows  # the prefill step and the last (finishing) step apart
        medians = [1e3 * statistics.median(column) for column in zip(*decode, strict=True)]
        if best is None or medians[3] < best[3]:
            best = medians
        print(
            f"batch {args.batch}: host {medians[0]:.2f} ms ({medians[3]:.2f} ms of CPU), "
            f"dispatch {medians[1]:.2f} ms, wait {medians[2]:.2f} ms per decode step "
            f"({len(decode)} steps)"
        )
    print(
        f"best: host {best[0]:.2f} ms ({best[3]:.2f} ms of CPU), dispatch {best[1]:.2f} ms, "
        f"wait {best[2]:.2f} ms"
    )


if __name__ == "__main__":
    main()
