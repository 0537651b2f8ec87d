"""A few GRPO-style iterations with jaxgen as the rollout engine, on the CPU (docs/rl.md).

Each iteration samples a group of completions of one prompt, scores them with a toy reward (the
share of even token ids), takes one Optax step on the group-normalised advantages, and hands
the new weights to the engine with ``LLM.update_weights``: no reload, no recompile. The engine
sleeps (level 2) while the trainer steps, so the KV pool and the engine's own copies of the
weights are freed meanwhile. The model is a tiny random Llama with a 256-word vocabulary.

    python docs/examples/rl_grpo.py --iterations 5
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from tokenizers import Tokenizer, models, pre_tokenizers

from jaxgen import LLM, ModelConfig, SamplingParams
from jaxgen.config.loaded_model import LoadedModel
from jaxgen.engine.weights import memory_in_use
from jaxgen.evaluation.full_forward import sequence_logits_fn
from jaxgen.loaders.plain_tokenizer import PlainTokenizer
from jaxgen.models.causal_lm import CausalLM

VOCAB = 256
GROUP = 4  # completions per prompt
MAX_TOKENS = 12
PROMPT = [0, 17, 42, 99, 7, 3]  # token ids (0 is BOS)


def tiny_random_model(seed: int = 0) -> LoadedModel:
    """A 2-layer Llama with random weights and a word-level tokenizer ("w2", "w3", ...)."""
    words = {"<s>": 0, "</s>": 1, **{f"w{i}": i for i in range(2, VOCAB)}}
    backend = Tokenizer(models.WordLevel(words, unk_token="</s>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PlainTokenizer(backend, bos_token="<s>", eos_token="</s>")
    config = ModelConfig.from_hf_dict(
        {
            "model_type": "llama",
            "vocab_size": VOCAB,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 128,
            "rms_norm_eps": 1e-5,
            "tie_word_embeddings": False,
            "bos_token_id": 0,
            "eos_token_id": 1,
        }
    )
    graphdef, params = nnx.split(CausalLM(config, dtype=jnp.float32, rngs=nnx.Rngs(seed)))
    return LoadedModel(config, graphdef, params, tokenizer, "tiny-random", jnp.float32, 0.0)


def reward(token_ids: list[int]) -> float:
    """The toy reward: the share of even token ids in a completion."""
    return float(np.mean([token % 2 == 0 for token in token_ids]))


def main(iterations: int = 3, learning_rate: float = 0.05) -> dict:
    llm = LLM(tiny_random_model(), max_model_len=64, kv_cache_memory=1 << 20)
    # The trainer holds the engine's parameters: the trainable ones (nnx.Param) and the rest
    # (RoPE tables), which update_weights keeps when they are left out.
    params, rest = nnx.split_state(llm.params, nnx.Param, ...)
    optimizer = optax.adam(learning_rate)
    opt_state = optimizer.init(params)
    logits_of = sequence_logits_fn(llm.loaded, len(PROMPT) + MAX_TOKENS)

    def loss_fn(params, sequences, advantages):  # [G, P + T] int32, [G] float32
        loss = 0.0
        for row in range(GROUP):  # GRPO without clipping: one on-policy step per group
            logits = logits_of(sequences[row], params, rest)[len(PROMPT) - 1 : -1]
            chosen = sequences[row, len(PROMPT) :, None]
            logprobs = jnp.take_along_axis(jax.nn.log_softmax(logits), chosen, axis=-1)
            loss -= advantages[row] * logprobs.mean()
        return loss / GROUP

    @jax.jit
    def train_step(params, opt_state, sequences, advantages):
        grads = jax.grad(loss_fn)(params, sequences, advantages)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    # The same seed every time: what changes between iterations is the weights alone.
    sampling = SamplingParams(
        n=GROUP, temperature=1.0, max_tokens=MAX_TOKENS, ignore_eos=True, seed=1234
    )
    report = {"rollouts": [], "rewards": [], "awake_bytes": [], "asleep_bytes": []}
    report["compiles"] = []
    for iteration in range(iterations):
        out = llm.generate([PROMPT], sampling, use_tqdm=False)[0]
        completions = [list(c.token_ids) for c in out.outputs]
        rewards = np.array([reward(c) for c in completions])
        advantages = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
        sequences = np.array([PROMPT + c for c in completions], np.int32)
        report["awake_bytes"].append(memory_in_use()["live_array_bytes"])
        llm.sleep(level=2)  # the KV pool and the engine's weights leave while the trainer steps
        report["asleep_bytes"].append(memory_in_use()["live_array_bytes"])
        params, opt_state = train_step(params, opt_state, sequences, advantages)
        llm.update_weights(params)  # the trainer's arrays, held as they are (no copy)
        llm.wake_up()  # a zeroed KV pool
        report["rollouts"].append(completions[0])
        report["rewards"].append(float(rewards.mean()))
        report["compiles"].append(llm.stats()["compiles"])
        print(
            f"iteration {iteration}: mean reward {rewards.mean():.3f}, "
            f"first completion {llm.get_tokenizer().decode(completions[0])!r}, "
            f"live arrays {report['awake_bytes'][-1] / 2**20:.1f} MiB awake, "
            f"{report['asleep_bytes'][-1] / 2**20:.1f} MiB asleep"
        )
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--learning-rate", type=float, default=0.05)
    parser.add_argument("--json", action="store_true", help="print the report as JSON last")
    args = parser.parse_args()
    result = main(args.iterations, args.learning_rate)
    if args.json:
        print(json.dumps(result))
