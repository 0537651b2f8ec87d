"""Multi-LoRA's bad inputs (each a ``ValueError`` naming it, nothing half-loaded), unloading an
adapter in use, and prefix-cache entries kept apart by adapter."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from jaxgen import LLM, SamplingParams
from jaxgen.lora import LoRARequest
from tests.family_models import save_tiny_model
from tests.lora.peft_adapters import peft_greedy, save_adapter

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def setup(tmp_path_factory, smollm2_tokenizer):
    root = tmp_path_factory.mktemp("lora-errors")
    base = save_tiny_model(str(root / "base"), smollm2_tokenizer)
    adapters = {
        "a": save_adapter(base, str(root / "a"), seed=1, r=4),
        "b": save_adapter(base, str(root / "b"), seed=2, r=4),
        "r8": save_adapter(base, str(root / "r8"), seed=3, r=8),
    }
    other = save_tiny_model(str(root / "other"), smollm2_tokenizer, hidden_size=32)
    adapters["other-base"] = save_adapter(other, str(root / "other-base"), seed=4, r=4)
    llm = LLM(base, enable_lora=True, max_loras=2, max_lora_rank=4)
    return llm, base, adapters, root


def _with_config(root, source: str, name: str, **changes) -> str:
    """A copy of the adapter at ``source`` whose adapter_config.json has ``changes``."""
    path = str(root / name)
    shutil.copytree(source, path, dirs_exist_ok=True)
    file = os.path.join(path, "adapter_config.json")
    with open(file) as handle:
        config = json.load(handle)
    config.update(changes)
    with open(file, "w") as handle:
        json.dump(config, handle)
    return path


@pytest.mark.parametrize(
    "case, message",
    [
        ("missing", "no such directory"),
        ("rank", "max_lora_rank=4"),
        ("lacks", "target module 'lm_head' which the model lacks"),
        ("other-base", "does not fit the base model"),
        ("modules_to_save", "modules_to_save"),
        ("dora", "DoRA"),
    ],
)
def test_bad_adapter_is_a_value_error_and_nothing_is_loaded(setup, case, message):
    llm, _, adapters, root = setup
    path = {
        "missing": str(root / "nowhere"),
        "rank": adapters["r8"],
        "lacks": _with_config(root, adapters["a"], "lacks", target_modules=["lm_head"]),
        "other-base": adapters["other-base"],
        "modules_to_save": _with_config(root, adapters["a"], "mts", modules_to_save=["lm_head"]),
        "dora": _with_config(root, adapters["a"], "dora", use_dora=True),
    }[case]
    with pytest.raises(ValueError, match=message) as error:
        llm.generate([[5, 6, 7]], GREEDY, lora_request=LoRARequest(case, 50, path))
    assert "LoRA adapter" in str(error.value) and case in str(error.value)
    assert all(r.lora_int_id != 50 for r in llm.engine.list_loras())
    assert not llm.engine.has_unfinished()


def test_lora_request_without_enable_lora(setup, tiny_loaded):
    _, _, adapters, _ = setup
    llm = LLM(tiny_loaded)
    with pytest.raises(ValueError, match="enable_lora"):
        llm.generate([[5, 6]], GREEDY, lora_request=LoRARequest("a", 1, adapters["a"]))


def test_lora_request_fields_are_checked():
    with pytest.raises(ValueError, match="lora_int_id"):
        LoRARequest("a", 0, "/x")
    with pytest.raises(ValueError, match="lora_name"):
        LoRARequest("", 1, "/x")


def test_unloading_an_adapter_in_use_is_refused(setup):
    llm, base, adapters, _ = setup
    engine = llm.engine
    lora = LoRARequest("a", 1, adapters["a"])
    engine.add_request("busy", None, [5, 6, 7, 8], GREEDY, lora_request=lora)
    engine.step()
    with pytest.raises(ValueError, match="in use"):
        engine.remove_lora(1)
    while engine.has_unfinished():
        engine.step()
    engine.remove_lora(1)
    assert all(r.lora_int_id != 1 for r in engine.list_loras())
    with pytest.raises(ValueError, match="no LoRA adapter"):
        engine.remove_lora(1)
    # The id may now name another adapter; its tokens are that adapter's.
    prompt = [5, 6, 7, 8]
    (out,) = llm.generate([prompt], GREEDY, lora_request=LoRARequest("b", 1, adapters["b"]))
    assert list(out.outputs[0].token_ids) == peft_greedy(base, adapters["b"], prompt, 4, True)[0]


def test_an_id_given_to_another_adapter_is_refused(setup):
    llm, _, adapters, _ = setup
    llm.generate([[5, 6]], GREEDY, lora_request=LoRARequest("a2", 7, adapters["a"]))
    with pytest.raises(ValueError, match="lora_int_id 7 is adapter 'a2'"):
        llm.generate([[5, 6]], GREEDY, lora_request=LoRARequest("b2", 7, adapters["b"]))


def test_prefix_cache_entries_are_kept_by_adapter(setup):
    llm, base, adapters, _ = setup
    prompt = list(range(100, 140))  # two full pages of 16
    first = LoRARequest("pa", 11, adapters["a"])
    second = LoRARequest("pb", 12, adapters["b"])
    hits = llm.stats()["prefix_cache_hit_pages"]
    for lora in (first, second, None):
        (out,) = llm.generate([prompt], GREEDY, lora_request=lora)
        path = None if lora is None else lora.lora_path
        assert list(out.outputs[0].token_ids) == peft_greedy(base, path, prompt, 4, True)[0]
    assert llm.stats()["prefix_cache_hit_pages"] == hits  # none shared across adapters
    llm.generate([prompt], GREEDY, lora_request=first)  # the same adapter again shares them
    assert llm.stats()["prefix_cache_hit_pages"] > hits
