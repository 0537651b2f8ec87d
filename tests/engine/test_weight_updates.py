"""``LLM.update_weights`` and ``update_weights_from_path`` (``jaxgen.engine.weights``): new weights
swapped in between generate calls give what a fresh engine built from them gives, compile
nothing, hold device arrays as given, empty the prefix cache; weights that do not fit are
refused naming the first mismatching parameter, and the old weights stay."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from jaxgen import LLM, SamplingParams
from jaxgen.engine.compiled.compile_counter import compile_count
from jaxgen.engine.errors import EngineBusyError
from jaxgen.engine.weights import named_values
from jaxgen.loaders import load_model
from jaxgen.loaders.orbax_checkpoint import save_orbax
from tests.family_models import save_tiny_model

KNOBS = dict(max_model_len=128, kv_cache_memory=1 << 20, page_size=16)
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=2)
PROMPTS = [list(range(5, 45)), [7, 8, 9]]  # the first fills two pages: cached for reuse


def run(llm) -> list:
    return [(o.token_ids, o.logprobs) for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def assert_same(got, expected) -> None:
    for (tokens, logprobs), (want_tokens, want_logprobs) in zip(got, expected, strict=True):
        assert tokens == want_tokens
        for step, want in zip(logprobs, want_logprobs, strict=True):
            assert step.keys() == want.keys()
            np.testing.assert_allclose(list(step.values()), list(want.values()), atol=1e-5)


def perturbed(params, seed: int = 1, scale: float = 0.05):
    """The trainable parameters (``nnx.Param``) with noise added: what an optimizer step gives."""
    trainable, _ = nnx.split_state(params, nnx.Param, ...)
    keys = iter(jax.random.split(jax.random.key(seed), len(jax.tree.leaves(trainable))))
    return jax.tree.map(lambda x: x + scale * jax.random.normal(next(keys), x.shape), trainable)


@pytest.fixture(scope="module")
def llm(tiny_loaded):
    return LLM(tiny_loaded, **KNOBS)


@pytest.fixture(scope="module")
def original(llm):
    """The engine's first weights and outputs (each test puts the weights back)."""
    return llm.params, run(llm)


def test_new_weights_give_a_fresh_engines_tokens_without_a_compile(llm, original, tiny_loaded):
    params, before = original
    run(llm)  # the long prompt's pages are in the prefix cache now
    new = perturbed(params)
    hits, compiles = llm.stats()["prefix_cache_hit_pages"], compile_count()
    llm.update_weights(new)
    after = run(llm)
    assert compile_count() == compiles  # the step takes the weights as arguments
    assert llm.stats()["prefix_cache_hit_pages"] == hits  # the cached pages were dropped
    name = "layers.0.mlp.up_proj.kernel"
    assert named_values(llm.params)[name] is named_values(new)[name]  # held, not copied
    assert named_values(llm.params)["inv_freq"] is named_values(params)["inv_freq"]  # kept
    assert tiny_loaded.params is params  # a shared LoadedModel is left as it was
    fresh = LLM(dataclasses.replace(tiny_loaded, params=llm.params), **KNOBS)
    assert_same(after, run(fresh))
    assert [tokens for tokens, _ in after] != [tokens for tokens, _ in before]
    llm.update_weights(params)
    assert_same(run(llm), before)


def test_host_arrays_by_dotted_name_are_placed_on_the_engines_device(llm, original):
    params, before = original
    new = perturbed(params, seed=2)
    llm.update_weights(new)
    expected = run(llm)
    llm.update_weights(params)
    host = {name: np.array(value) for name, value in named_values(new).items()}
    compiles = compile_count()
    llm.update_weights(host)  # placed as the engine's own were (uncommitted): no compile
    kernel = named_values(llm.params)["layers.1.self_attn.q_proj.kernel"]
    assert (
        isinstance(kernel, jax.Array)
        and kernel.sharding == named_values(params)["layers.1.self_attn.q_proj.kernel"].sharding
    )
    assert_same(run(llm), expected)
    assert compile_count() == compiles
    llm.update_weights(nnx.to_pure_dict(params))  # a nested dict, as a trainer may keep it
    assert_same(run(llm), before)


def _bad_trees(params):
    values = {name: np.array(value) for name, value in named_values(params).items()}
    last = list(values)[-1]  # checked last: a swap before checking would show in the others
    wrong_shape = {**values, last: values[last][:-1]}
    wrong_dtype = {**values, "norm.weight": values["norm.weight"].astype(np.float16)}
    missing = {k: v for k, v in values.items() if k != "layers.1.mlp.down_proj.kernel"}
    unknown = {**values, "layers.9.mlp.down_proj.kernel": values["layers.1.mlp.down_proj.kernel"]}
    deleted = jax.numpy.ones(values["norm.weight"].shape)
    deleted.delete()
    return [
        (wrong_shape, f"{last}.*shape"),
        (wrong_dtype, "'norm.weight' has dtype float16; the model's is float32"),
        (missing, "no parameter 'layers.1.mlp.down_proj.kernel'"),
        (unknown, "'layers.9.mlp.down_proj.kernel'"),
        ({**values, "norm.weight": deleted}, "'norm.weight' is a deleted array"),
        ({**values, "norm.weight": [1.0, 2.0]}, "'norm.weight' is a list"),
        ([values["norm.weight"]], "params must be a parameter tree"),
    ]


def test_weights_that_do_not_fit_are_refused_and_the_old_ones_stay(llm, original):
    params, before = original
    held = named_values(llm.params)
    for tree, message in _bad_trees(params):
        with pytest.raises(ValueError, match=message):
            llm.update_weights(tree)
        assert all(named_values(llm.params)[name] is value for name, value in held.items())
    assert_same(run(llm), before)


def test_new_weights_are_refused_while_requests_run(llm, original):
    engine = llm.engine
    engine.add_request("busy", None, PROMPTS[1], GREEDY)
    with pytest.raises(EngineBusyError, match="1 request"):
        llm.update_weights(perturbed(original[0]))
    while engine.has_unfinished():  # the request goes on, on the old weights
        outputs = engine.step()
    assert outputs[-1].token_ids == original[1][1][0]


@pytest.fixture(scope="module")
def other_checkpoint(tmp_path_factory, smollm2_tokenizer):
    """The tiny model's architecture with other random weights (seed 1)."""
    return save_tiny_model(str(tmp_path_factory.mktemp("tiny-seed1")), smollm2_tokenizer, seed=1)


def test_weights_from_safetensors_and_orbax_directories(llm, original, other_checkpoint, tmp_path):
    params, before = original
    expected = run(LLM(other_checkpoint, **KNOBS))
    llm.update_weights_from_path(other_checkpoint)
    assert_same(run(llm), expected)
    llm.update_weights(params)
    converted = save_orbax(load_model(other_checkpoint), str(tmp_path / "converted"))
    llm.update_weights_from_path(converted)
    assert_same(run(llm), expected)
    llm.update_weights(params)
    assert_same(run(llm), before)


def test_a_checkpoint_that_does_not_fit_is_refused(llm, original, tmp_path, smollm2_tokenizer):
    narrow = save_tiny_model(str(tmp_path / "narrow"), smollm2_tokenizer, hidden_size=32)
    held = named_values(llm.params)
    with pytest.raises(ValueError, match="'embed_tokens.embedding' has shape"):
        llm.update_weights_from_path(narrow)
    with pytest.raises(ValueError, match="not a directory"):
        llm.update_weights_from_path(str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="no config.json"):
        llm.update_weights_from_path(str(tmp_path))
    assert all(named_values(llm.params)[name] is value for name, value in held.items())
    assert_same(run(llm), original[1])


def test_a_quantised_engine_takes_a_float_checkpoint_quantised_again(
    tiny_model_dir, other_checkpoint
):
    llm = LLM(tiny_model_dir, quantization="int8", **KNOBS)
    float_tree = {
        name: np.array(v) for name, v in named_values(load_model(tiny_model_dir).params).items()
    }
    with pytest.raises(ValueError, match="holds it quantised"):
        llm.update_weights(float_tree)
    llm.update_weights_from_path(other_checkpoint)
    assert_same(run(llm), run(LLM(other_checkpoint, quantization="int8", **KNOBS)))
