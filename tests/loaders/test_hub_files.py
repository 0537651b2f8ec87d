"""Which files of a hub repository are downloaded: chosen from its listing alone."""

from __future__ import annotations

import pytest

from jaxgen.loaders.hub_download import parse_hub_id
from jaxgen.loaders.hub_files import HubModelError, RepoFiles, choose_files, quant_tags

# A safetensors repository as the hub lists it, with files jaxgen never needs beside.
CHECKPOINT = [
    ".gitattributes",
    "README.md",
    "config.json",
    "generation_config.json",
    "merges.txt",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
    "model.safetensors.index.json",
    "onnx/model.onnx",
    "original/consolidated.00.pth",
    "pytorch_model.bin",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "chat_template.jinja",
    "additional_chat_templates/tool_use.jinja",
]
# A GGUF repository (as quantisers publish them): tags in several spellings, a split file, a
# vision projector and an importance matrix that are not the model.
GGUF_REPO = [
    "README.md",
    "model-IQ4_XS.gguf",
    "model-Q2_K-00001-of-00002.gguf",
    "model-Q2_K-00002-of-00002.gguf",
    "model.Q5_K_M.gguf",
    "model-q8_0.gguf",
    "Q4_K_M/model-Q4_K_M-00001-of-00002.gguf",
    "Q4_K_M/model-Q4_K_M-00002-of-00002.gguf",
    "model-Q4_K_M.gguf",
    "mmproj-model-F16.gguf",
    "model.imatrix.gguf",
]


def test_checkpoint_downloads_config_tokenizer_and_the_indexed_shards_only():
    files = choose_files("org/m", CHECKPOINT)
    assert files == RepoFiles(
        metadata=(
            "config.json",
            "generation_config.json",
            "merges.txt",
            "model.safetensors.index.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "vocab.json",
            "chat_template.jinja",
            "additional_chat_templates/tool_use.jinja",
        ),
        weights=None,  # the shards the index names, read once it is downloaded
    )


def test_single_file_checkpoint_is_model_safetensors_alone():
    listing = ["config.json", "model.safetensors", "consolidated.safetensors", "tokenizer.json"]
    assert choose_files("org/m", listing).weights == ("model.safetensors",)
    assert choose_files("org/m", ["config.json", "weights.safetensors"]).weights == (
        "weights.safetensors",
    )


def test_safetensors_win_over_a_gguf_unless_one_is_asked_for():
    listing = ["config.json", "model.safetensors", "model-Q8_0.gguf"]
    assert choose_files("org/m", listing).gguf is None
    assert choose_files("org/m", listing, tag="q8_0").gguf == "model-Q8_0.gguf"
    assert choose_files("org/m", listing, gguf_file="model-Q8_0.gguf").gguf == "model-Q8_0.gguf"


@pytest.mark.parametrize(
    "tag, chosen",
    [
        ("Q4_K_M", "model-Q4_K_M.gguf"),  # the single file before the split one
        ("q4_k_m", "model-Q4_K_M.gguf"),  # case-insensitive, as llama.cpp
        ("Q8_0", "model-q8_0.gguf"),
        ("Q5_K_M", "model.Q5_K_M.gguf"),  # TheBloke's dotted spelling
        ("IQ4_XS", "model-IQ4_XS.gguf"),
        (None, "model-Q4_K_M.gguf"),  # llama.cpp's default: Q4_K_M, then Q8_0, then the first
    ],
)
def test_gguf_by_quantisation_tag(tag, chosen):
    assert choose_files("org/m-GGUF", GGUF_REPO, tag=tag).gguf == chosen


def test_tag_matches_a_whole_tag_only():
    # "Q4_XS" is not IQ4_XS, "Q4_K" is not Q4_K_M.
    for tag in ("Q4_XS", "Q4_K"):
        with pytest.raises(HubModelError, match="carries the quantisation tag"):
            choose_files("org/m-GGUF", GGUF_REPO, tag=tag)


def test_default_without_q4_k_m_or_q8_0_is_the_first_single_file():
    listing = ["m-Q2_K-00001-of-00002.gguf", "m-Q2_K-00002-of-00002.gguf", "m-F16.gguf"]
    assert choose_files("org/m", listing).gguf == "m-F16.gguf"


def test_unknown_tag_lists_the_tags():
    with pytest.raises(HubModelError) as error:
        choose_files("org/m-GGUF", GGUF_REPO, tag="Q6_K")
    assert str(error.value) == (
        "no GGUF file of hub repository 'org/m-GGUF' carries the quantisation tag 'Q6_K'; its "
        "tags: IQ4_XS, Q2_K, Q4_K_M, Q5_K_M, Q8_0"
    )
    assert quant_tags(GGUF_REPO) == ["IQ4_XS", "Q2_K", "Q4_K_M", "Q5_K_M", "Q8_0"]


def test_split_gguf_is_a_clear_error():
    with pytest.raises(HubModelError, match=r"split into 2 parts.*llama-gguf-split --merge"):
        choose_files("org/m-GGUF", GGUF_REPO, tag="Q2_K")
    with pytest.raises(HubModelError, match="split into 2 parts"):
        choose_files("org/m-GGUF", GGUF_REPO, gguf_file="Q4_K_M/model-Q4_K_M-00001-of-00002.gguf")


def test_gguf_file_by_path_or_unique_name():
    assert choose_files("o/m", GGUF_REPO, gguf_file="model.Q5_K_M.gguf").gguf == "model.Q5_K_M.gguf"
    with pytest.raises(HubModelError, match=r"no file 'nope.gguf'.*its GGUF files: model-IQ4_XS"):
        choose_files("o/m", GGUF_REPO, gguf_file="nope.gguf")
    with pytest.raises(HubModelError, match="not both"):
        choose_files("o/m", GGUF_REPO, gguf_file="model.Q5_K_M.gguf", tag="Q5_K_M")


def test_repository_with_neither_safetensors_nor_gguf():
    with pytest.raises(HubModelError) as error:
        choose_files("org/old", ["config.json", "pytorch_model.bin", "tokenizer.json"])
    assert "neither a checkpoint jaxgen loads" in str(error.value)
    assert "it lacks *.safetensors weights" in str(error.value)
    assert "pytorch_model.bin" in str(error.value)
    with pytest.raises(HubModelError, match="it lacks config.json"):
        choose_files("org/lora", ["adapter_config.json", "adapter_model.safetensors"])


@pytest.mark.parametrize(
    "model, parsed",
    [
        ("Qwen/Qwen3-0.6B", ("Qwen/Qwen3-0.6B", None)),
        ("unsloth/gemma-3-1b-it-GGUF:Q4_K_M", ("unsloth/gemma-3-1b-it-GGUF", "Q4_K_M")),
        ("org/name.v2", ("org/name.v2", None)),
        ("smollm2", None),  # one word: an alias or a path, never looked up
        ("/abs/path", None),
        ("./rel/path", None),
        ("a/b/c", None),
        ("../up", None),
        ("org--x/name", None),
    ],
)
def test_parse_hub_id(model, parsed):
    assert parse_hub_id(model) == parsed
