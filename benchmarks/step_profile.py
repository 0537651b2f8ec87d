"""Where an offline run's time goes, step by step: each engine step is timed until its result is
ready and grouped by kind (steps holding prefill chunks; decode-only steps by their decode-row
bucket). Passes after the first are warm (the prefix cache is emptied before each pass).

    python benchmarks/step_profile.py [--input-len 64] [--mixed-outputs 32,64,128]
        [--num-prompts 64] [--batching paged] [--page-size 16] [--passes 3]
"""

from __future__ import annotations

import argparse
import collections
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--mixed-outputs", default="32,64,128")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--batching", default="paged")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--max-rolling-batch-size", type=int, default=64)
    parser.add_argument("--passes", type=int, default=3)
    args = parser.parse_args()

    from jaxgen import LLM
    from jaxgen.bench.workloads import random_workload, with_mixed_outputs
    from jaxgen.engine.compiled.buckets import bucket_for

    llm = LLM(
        batching=args.batching,
        batch_size=args.batch_size,
        page_size=args.page_size,
        max_rolling_batch_size=args.max_rolling_batch_size,
        max_model_len=512,
        kv_cache_memory=1 << 30,
    )
    lengths = tuple(int(n) for n in args.mixed_outputs.split(","))
    workload = with_mixed_outputs(
        random_workload(llm.get_tokenizer(), args.num_prompts, args.input_len, max(lengths)),
        lengths=lengths,
    )
    runner, steps = llm.engine.runner, []
    execute = runner.execute

    def timed_execute(arrays, flags):
        live = arrays[2].live_rows  # [2, 2]: [begin, end) of the decode rows, then prefill rows
        decodes, prefill_tokens = int(live[0][1] - live[0][0]), int(live[1][1] - live[1][0])
        start = time.perf_counter()
        result = execute(arrays, flags)  # returns host values: the step has finished
        steps.append((decodes, prefill_tokens, time.perf_counter() - start))
        return result

    runner.execute = timed_execute
    for index in range(args.passes):
        llm.engine.scheduler.allocator.reset_prefix_cache()
        steps.clear()
        start = time.perf_counter()
        outputs = llm.generate(workload.prompts(), workload.sampling_params(), use_tqdm=False)
        seconds = time.perf_counter() - start
        tokens = sum(len(o.token_ids) for o in outputs)
        print(
            f"pass {index}: {seconds:.1f} s, {tokens / seconds:.1f} output tok/s, {len(steps)} steps"
        )

    groups = collections.defaultdict(list)
    for decodes, prefill_tokens, seconds in steps:
        bucket = bucket_for(max(decodes, 1), llm.engine.layout.token_buckets)
        key = "with prefill" if prefill_tokens else f"decode, bucket {bucket:3d}"
        groups[key].append((decodes, seconds))
    print("| steps (last pass) | count | mean live decode rows | mean ms | total s |")
    print("|---|---|---|---|---|")
    for key in sorted(groups):
        rows = groups[key]
        mean_rows = sum(r for r, _ in rows) / len(rows)
        total = sum(t for _, t in rows)
        print(
            f"| {key} | {len(rows)} | {mean_rows:.1f} | {1e3 * total / len(rows):.0f} | {total:.1f} |"
        )


if __name__ == "__main__":
    main()
