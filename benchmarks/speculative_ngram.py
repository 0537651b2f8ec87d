"""Single-stream speed with n-gram speculative decoding against none, on the default model:
an input-grounded workload (editing code, extracting or restating a document: the answers
repeat spans of the prompt) and plain chat.

    python benchmarks/speculative_ngram.py [--tokens 128] [--k 2 4] [--rounds R] [--repeats 1]
        [--prompt-lookup-min 2] [--prompt-lookup-max 5] [--quantization auto|w4a8]

On this VM the engines of one process do not run alike: the first one built runs a few per
cent faster than the later ones, and those drift with their build order by a few per cent too;
one process against another differs by up to 10-20%. So each of ``--rounds`` processes builds
an unmeasured first engine, then one engine per configuration (no speculation, then n-gram at
each k) in an order rotated by one each round (by default a round per configuration: each
takes each place once), warms them up (every shape they meet compiled), then runs each prompt
alone, greedy, ``--repeats`` times, the engines taking turns prompt by prompt. Prints per
workload the output tok/s over all rounds, the ratio to no speculation by wall time and by
the process's CPU time, the compiles during the measured runs (0 when warm) and the
acceptance counters, and per prompt its tokens and ratios.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time

CODE = """def total_price(items, tax_rate):
    subtotal = 0
    for item in items:
        subtotal += item.price * item.quantity
    tax = subtotal * tax_rate
    return subtotal + tax


def average_price(items):
    if not items:
        return 0
    return sum(item.price for item in items) / len(items)
"""
INVOICE = """Invoice number: 20931
Date: 14 March 2024
Customer: Maria Lopez
Email: maria.lopez@example.com
Address: 12 Harbour Street, Bristol BS1 4RD
Items: 3 desk lamps at 24.99 each, 1 office chair at 149.00
Total: 223.97
"""
LETTER = (
    "Dear Mr Patel,\n\nThank you for your order of 12 March. Your parcel left our warehouse in "
    "Leeds on 14 March and will be delivered to 8 Mill Lane, York YO1 7HH by 18 March. Your "
    "tracking number is GB2291847. If you have questions, call us on 0113 496 0021.\n\nKind "
    "regards,\nAnna Clarke\nCustomer Service"
)
LIGHTHOUSE = (
    "The lighthouse stood on the rock for two hundred years. Ships passed it every night. The "
    "keeper lit the lamp at dusk and put it out at dawn. Nobody remembered a night it had not "
    "been lit."
)
MISSPELT = (
    "The lighthouse stod on the rock for two hundred yeers. Ships pased it every night. The "
    "keeper lit the lamp at dusk and put it out at dawn. Nobody rememberd a night it had not "
    "been lit."
)
GROUNDED = {
    "rename": "Rewrite this code with the variable `subtotal` renamed to `net`. Reply with the "
    "code only.\n\n" + CODE,
    "docstrings": "Add a docstring to each function of this code and give the whole code "
    "back:\n\n" + CODE,
    "fields": "List the invoice number, date, customer, email, address and total of this "
    "invoice, one per line:\n\n" + INVOICE,
    "spelling": "Fix the spelling mistakes in this paragraph and write it out in full:\n\n"
    + MISSPELT,
    "restate": "Rewrite this letter in formal English, keeping every fact:\n\n" + LETTER,
    "copy": "Copy this text exactly, then say how many sentences it has:\n\n" + LIGHTHOUSE,
}
CHAT = {
    "story": "Write a short story about a lighthouse keeper.",
    "habits": "What are three good habits for staying healthy?",
    "bicycle": "Explain how a bicycle stays upright.",
}
WORKLOADS = {"input-grounded": GROUNDED, "chat": CHAT}
STAT_KEYS = (
    "spec_decode_num_drafts",
    "spec_decode_num_draft_tokens",
    "spec_decode_num_accepted_tokens",
    "steps",
    "compiles",
)


@dataclasses.dataclass
class Tally:
    """One configuration's totals over the measured runs of one prompt (or workload)."""

    tokens: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0
    stats: dict = dataclasses.field(default_factory=dict)

    def add(self, other: Tally) -> None:
        self.tokens += other.tokens
        self.wall_s += other.wall_s
        self.cpu_s += other.cpu_s
        for key, value in other.stats.items():
            self.stats[key] = self.stats.get(key, 0) + value


def run_one(llm, prompt: str, params) -> Tally:
    """Runs ``prompt`` alone on ``llm``: its tokens, wall and process CPU time, and the
    engine counters' change."""
    before = llm.stats()
    wall, cpu = time.perf_counter(), time.process_time()
    out = llm.chat([{"role": "user", "content": prompt}], params, use_tqdm=False)
    tally = Tally(wall_s=time.perf_counter() - wall, cpu_s=time.process_time() - cpu)
    tally.tokens = len(out[0].outputs[0].token_ids)
    after = llm.stats()
    tally.stats = {key: after[key] - before.get(key, 0) for key in STAT_KEYS if key in after}
    return tally


def build(loaded, k: int, args):
    """An engine on ``loaded``: n-gram speculation with ``k`` tokens, or none (``k`` 0)."""
    from jaxgen import LLM

    knobs = dict(max_model_len=1024, max_rolling_batch_size=4, kv_cache_memory=64 << 20)
    if k:
        knobs["speculative_config"] = {
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_min": args.prompt_lookup_min,
            "prompt_lookup_max": args.prompt_lookup_max,
        }
    return LLM(loaded, **knobs)


def ratio(tally: Tally, base: Tally) -> tuple[float, float]:
    """Output tokens per second against ``base``'s, by wall time and by CPU time."""
    per_token = tally.tokens / base.tokens
    return base.wall_s / tally.wall_s * per_token, base.cpu_s / tally.cpu_s * per_token


def report(configs: list[int], tallies: dict, costs: dict) -> None:
    for workload, group in WORKLOADS.items():
        totals = {k: Tally() for k in configs}
        for k in configs:
            for name in group:
                totals[k].add(tallies[k, workload, name])
        for k in configs:
            tally, stats = totals[k], totals[k].stats
            wall, cpu = ratio(tally, totals[0])
            line = (
                f"{workload:15s} {'none' if not k else f'ngram k={k}':10s}"
                f" {tally.tokens / tally.wall_s:7.1f} tok/s  x{wall:.2f} wall  x{cpu:.2f} cpu"
                f"  tokens {tally.tokens}  steps {stats['steps']}"
                f"  compiles {stats.get('compiles', 0)}"
            )
            if k:
                drafted = max(stats["spec_decode_num_draft_tokens"], 1)
                line += (
                    f"  acceptance {stats['spec_decode_num_accepted_tokens'] / drafted:.2f}"
                    f"  drafts {stats['spec_decode_num_drafts']}"
                )
                if costs.get(k) is not None:
                    line += f"  draft token cost {costs[k]:.2f} steps"
            print(line)
        for name in group:  # per prompt: tokens, and each k's wall / cpu ratio
            base = tallies[0, workload, name]
            cells = [f"{name:12s} {base.tokens:4d} tokens"]
            for k in configs[1:]:
                wall, cpu = ratio(tallies[k, workload, name], base)
                cells.append(f"k={k} x{wall:.2f} / {cpu:.2f}")
            print("    " + "  ".join(cells))
    sys.stdout.flush()


def worker(rotation: int, args) -> None:
    """One process: an unmeasured first engine, then one per configuration in the order
    rotated by ``rotation``, warmed up, then the prompts with the engines taking turns prompt
    by prompt; prints each (configuration, prompt)'s tally as JSON, then the draft costs."""
    from jaxgen import SamplingParams
    from jaxgen.loaders import load_model

    loaded = load_model(None, dtype="float32", quantization=args.quantization)
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens)
    configs = [0, *args.k]
    configs = configs[rotation % len(configs) :] + configs[: rotation % len(configs)]
    unmeasured = build(loaded, 0, args)
    engines = {k: build(loaded, k, args) for k in configs}
    prompts = [(w, name, text) for w, group in WORKLOADS.items() for name, text in group.items()]
    again = SamplingParams(temperature=0.0, max_tokens=2)
    for llm in [unmeasured, *engines.values()]:  # every shape met compiled: the prompts, then
        for _, _, text in prompts:  # their prefill again with the prefix cached (as measured)
            run_one(llm, text, params)
        for _, _, text in prompts:
            run_one(llm, text, again)
    for _ in range(args.repeats):  # engines take turns prompt by prompt: a change in the
        for workload, name, text in prompts:  # machine's load falls on all
            for k, llm in engines.items():
                tally = dataclasses.asdict(run_one(llm, text, params))
                print(json.dumps({"k": k, "workload": workload, "prompt": name, **tally}))
    costs = {k: llm.stats().get("spec_decode_draft_token_cost") for k, llm in engines.items()}
    print(json.dumps({"costs": costs}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--k", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--prompt-lookup-min", type=int, default=2)
    parser.add_argument("--prompt-lookup-max", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--quantization",
        default="auto",
        help="the default model's weights as loaded (EngineConfig.quantization): auto keeps the "
        "GGUF's Q4_1 / Q8_0 with float activations, w4a8 gives them int8 activations",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="processes (default: one per "
        "configuration, each building the engines in another order)",
    )
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker, args)
        return

    configs = [0, *args.k]
    tallies = {
        (k, workload, name): Tally()
        for k in configs
        for workload, group in WORKLOADS.items()
        for name in group
    }
    costs = {}
    options = ["--tokens", str(args.tokens), "--repeats", str(args.repeats)]
    options += ["--prompt-lookup-min", str(args.prompt_lookup_min), "--k", *map(str, args.k)]
    options += ["--prompt-lookup-max", str(args.prompt_lookup_max)]
    options += ["--quantization", args.quantization]
    for rotation in range(args.rounds or len(configs)):
        command = [sys.executable, __file__, "--worker", str(rotation), *options]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        for line in done.stdout.splitlines():
            if line.startswith("{"):
                record = json.loads(line)
                if "costs" in record:
                    costs = {int(k): cost for k, cost in record["costs"].items()}
                    continue
                key = (record.pop("k"), record.pop("workload"), record.pop("prompt"))
                tallies[key].add(Tally(**record))
    report(configs, tallies, costs)


if __name__ == "__main__":
    main()
